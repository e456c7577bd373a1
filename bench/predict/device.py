"""What a device is to the step model (bench/predict/perf.py): the constants a study calibrates, every
device's (`Calibration`), and the terms where one device's step differs from another's (`DeviceModel`).

Two devices implement it: a GPU (bench/predict/gpu.py `GpuModel`: NCCL's kernels on their own streams
beside the compute, the host a floor under the step) and the CPU cores a local study's ranks share
(bench/predict/cpu.py `CpuModel`: gloo on the compute's thread, ranks taking turns on the machine), the
project's test bench. bench/predict/devices.py picks one per prediction; everything else in perf.py and
comm.py is the same for both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bench.core.hardware import GpuSpec
from bench.core.models import ModelArch
from bench.core.schema import RunSpec
from bench.predict.comm import Network

PUBLISHED = "published constants"  # Calibration.source of the shipped constants (perf.CALIBRATION)
HALF_SIBLING = {"fp16": "bf16", "bf16": "fp16"}


@dataclass(frozen=True)
class Calibration:
    """The fitted constants: the shipped ones (benchmarks/perf_model.py fits them to the rows of
    bench/predict/published.py), or a study's own (bench/predict/calibrate.py refits them to its runs)."""

    matmul_efficiency: dict[str, float]  # fraction of the dense peak its matmuls reach, per GPU family
    # ("H100"), or per family and compute dtype ("cpu:fp16": a CPU without fp16 units emulates them)
    elementwise_bytes: float  # bytes of non-matmul memory traffic per hidden unit, token, block and pass
    contention: float  # fraction of overlapped communication time that still costs step time
    compile_traffic: float  # fraction of the elementwise traffic left once torch.compile fuses each block
    cpu_capacity: float | None = None  # a local CPU cluster: ranks the machine runs at one rank's speed
    # (None: the cores its ranks can use, cpu.CpuFacts; hyperthreads and memory bandwidth make it fewer)
    cpu_host_s: float = 2.24e-3  # a CPU rank's own host time per block and pass (Python, FSDP2's hooks and
    # copies), on the compute's thread: gpu.HOST_BLOCK_PASS_S as its prior, a study's traces refit it
    cpu_step_s: float = 1.0e-3  # one ring step of a gloo collective inside a CPU study's training: its
    # traced collectives refit it; the prior is the order its 1-node traces measured on 2 shared cores
    # (benchmarks/evidence/README.md, "CPU smoke studies")
    source: str = PUBLISHED  # or "this study's N runs": the results table's pred_source

    def calibrated(self, family: str, dtype: str) -> float | None:
        """The matmul efficiency calibrated for a family at a compute dtype: the dtype's own where a study
        measured it, else its 16-bit sibling's (GPUs run fp16 and bf16 on the same tensor cores at one peak;
        a CPU without 16-bit units emulates both alike), else the family's; None where none was (the
        device's model says what then: DeviceModel.efficiency)."""
        table = self.matmul_efficiency
        for key in (f"{family}:{dtype}", f"{family}:{HALF_SIBLING.get(dtype)}", family):
            if key in table:
                return table[key]
        return None


@dataclass(frozen=True)
class Peaks:
    """What one rank of a run computes and moves per second on its device."""

    dense: float  # FLOP/s at the run's compute dtype
    fp8: float  # FLOP/s of its Float8 linears (the dense figure where the device has no FP8 units)
    memory: float  # bytes/s of its memory bandwidth (HBM; a CPU rank's share of the machine's)


@dataclass(frozen=True)
class Work:
    """One micro-batch's compute by FSDP unit, in seconds: what its collectives run beside."""

    root_forward: float  # the root unit's: the output layer and the loss (the whole model where it is one)
    root_backward: float
    block_forward: float  # each block's, where the blocks are units of their own
    block_backward: float  # with the forward activation checkpointing reruns
    blocks: int  # blocks wrapped as units of their own (0: the model is one unit)

    @property
    def forward(self) -> float:
        return self.root_forward + self.blocks * self.block_forward

    @property
    def backward(self) -> float:
        return self.root_backward + self.blocks * self.block_backward


@dataclass(frozen=True)
class Bound:
    """One part's collectives (an exposed part: a kind and its pass) as NCCL is predicted to run them: its
    pick and what bounds it for one block's message, and the step's seconds of them, exposed and in all."""

    part: str
    algorithm: str
    protocol: str
    bound: str  # collective.BOUNDS: latency, intra-node bandwidth, network bandwidth
    unit_s: float  # one block's collective
    total_s: float  # every one of the step's
    exposed_s: float  # of which the step waits for


@dataclass(frozen=True)
class Communication:
    """A step's collectives against its compute."""

    exposed: dict[str, float]  # per exposed part (comm.EXPOSED_PARTS), seconds the step waits for them
    hidden: float  # seconds of collectives that ran beside compute
    total: float  # seconds of every collective, as if nothing overlapped
    contention: float  # seconds the compute lost to the collectives beside it (and FSDP2's copies)
    bounds: tuple[Bound, ...] = ()  # per part where the device's model knows NCCL's pick (a GPU's)


def block_passes_s(per: float, spec: RunSpec, arch: ModelArch, recompute: float) -> float:
    """The host's time for a step's blocks and passes at `per` seconds a block and pass: forward, two for
    the backward, one more where activation checkpointing recomputes; per micro-batch."""
    return per * arch.blocks * (3 + 3 * recompute) * spec.grad_accum


class DeviceModel(Protocol):
    """The terms of the step where one device differs from another (perf.py's module docstring says what
    each is on a GPU, cpu.py's on the CPU)."""

    gpu: GpuSpec  # its figures (a GPU's datasheet; the CPU's: cpu.CPU)

    def efficiency(self, dtype: str) -> float:
        """Its matmuls' fraction of the dense peak at a compute dtype: calibrated, else its prior."""
        ...

    def peaks(self, spec: RunSpec) -> Peaks:
        """What one of the run's ranks computes and moves per second."""
        ...

    def network(self, network: Network) -> Network:
        """What its collectives run over, given the node network the run was set on."""
        ...

    def communication(self, spec: RunSpec, arch: ModelArch, network: Network, work: Work) -> Communication:
        """The step's collectives (comm.step_collectives) against its micro-batches' compute `work`."""
        ...

    def host_s(self, spec: RunSpec, arch: ModelArch, recompute: float) -> float:
        """The host's seconds for a step's blocks and passes (block_passes_s at its own rate)."""
        ...

    def parts(self, spec: RunSpec, compute: float, comm: Communication, optimizer: float,
              host: float) -> tuple[dict[str, float], float]:
        """The step's parts (perf.Prediction.parts: compute, each exposed kind, the optimizer, other and
        where it has them the turns' waiting), given the device's compute, its communication, optimizer
        and host seconds; and the host's floor under the step (0: none)."""
        ...

    def unmodeled(self, spec: RunSpec) -> str | None:
        """What of the run's step it leaves out, making its prediction a floor only; None: nothing."""
        ...
