"""What a planned run will deliver, before it runs: step time, tokens/s/GPU, MFU and scaling efficiency.

One training step per GPU is modelled as

    step = max(matmuls + elementwise + optimizer + exposed communication + contention and copies, host)

- matmuls: the run's hardware FLOPs (bench/core/flops.py, recompute of activation checkpointing included)
  at MATMUL_EFFICIENCY of the GPU's dense peak;
- elementwise: the memory traffic of everything that is not a matmul (norms, activations, rotary embedding,
  residual adds: ELEMENTWISE_BYTES per hidden unit, token, block and pass) at the GPU's HBM bandwidth;
  this term is why an H100, 3.2x an A100's FLOPs with 1.6x its bandwidth, trains only about 2x faster;
- loss: the cross-entropy's traffic over the logits (`traffic.loss_bytes`: 36 bytes per logit in 16 bits,
  counted from the ops the models run, not fitted), at HBM bandwidth, once per micro-batch;
- optimizer: AdamW reads and writes 28 bytes per sharded parameter at HBM bandwidth;
- accumulation: where a step accumulates several micro-batches, the gradient adds FSDP2 runs on the compute
  stream (sync_once's unsharded gradients: `traffic.accumulation_bytes`) at HBM bandwidth;
- communication (bench/predict/comm.py): FSDP's collectives per step (all-gathers of the parameters in forward
  and backward, reduce-scatter of the gradients; HYBRID_SHARD's inter-node all-reduce; NO_SHARD's all-reduce),
  each one's time NCCL's on the cluster's fabric (bench/predict/collective.py: the algorithm and protocol NCCL
  picks, its latency and bandwidth; calibrated by the study's own probes where it has them, else by the
  transport's fitted figures: bench/predict/network.py), run unit by unit beside the compute as FSDP2's
  streams run them (bench/predict/overlap.py): the step waits for what its compute does not hide;
- contention: a collective running beside the compute slows it (NCCL's kernels take SMs and HBM bandwidth):
  Calibration.contention of the time they run together, and FSDP2's copies around the collectives on the
  compute stream at HBM bandwidth (traffic.copy_bytes);
- host: eager PyTorch launches each kernel from Python, and FSDP2's hooks run per block; a GPU that
  finishes its work sooner waits for the CPU. gpu.HOST_BLOCK_PASS_S per block and pass (forward, two for the
  backward, one more where activation checkpointing recomputes): the floor of a small model's step.

Where a device differs from a GPU, it says so through device.DeviceModel, chosen once per prediction
(bench/predict/devices.py, which also names the project's test bench): a GPU's terms are the ones above
(bench/predict/gpu.py `GpuModel`).

The step's parts (`Prediction.parts`, bench/predict/split.py) are named as the trace names the measured
ones (trainer/trace.py): compute (contention with it: the overlapped communication slows the kernels),
each kind's exposed communication, the optimizer, and `other`: on a GPU the host's time beyond the
device's work (another device's model says what its parts hold). FSDP2's copies around
collectives are not told apart (a GPU's are elementwise kernels).

compile=true keeps a fraction of the elementwise traffic (inductor fuses a block's elementwise operators);
fp8_tensorwise runs the block linears at the FP8 peak and gathers their weights in one byte (torchao's
float8 all-gather). The calibrated constants (CALIBRATION: one per GPU family, three shared) were fitted
to published FSDP throughput rows, each cited in bench/predict/published.py; `python
benchmarks/perf_model.py` fits them again and prints every row's error, with llm-foundry's table held out
as a check. Everything else is a datasheet figure or a measured nccl-tests output (bench/core/hardware.py).

The attention is counted as dense matmuls over the full square at the matmul efficiency: the convention
the constants were fitted with, on stacks that run FlashAttention-2 class kernels (SDPA, torchtitan). A
published row from another training stack (`Stack`: llm-foundry's MPT, hand-fused, with 2023 attention
kernels) names what differs, each figure cited where it is defined (bench/predict/published.py): the share
of the eager elementwise traffic its blocks move, and its attention kernel's fraction of the dense peak on
the kernel's own work (the causal half of the square: forward two matmuls, backward five).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from bench.core.config import ClusterConfig
from bench.core.flops import (
    attention_square_flops_per_token,
    checkpointed_blocks,
    hardware_flops_per_token,
    model_flops_per_token,
    shard_size,
)
from bench.core.hardware import GPUS, GpuSpec, compute_dtype
from bench.core.models import ModelArch, block_params, count_params, float8_linear_params
from bench.core.schema import RunSpec
from bench.launchers.base import Placement
from bench.predict.comm import Network
from bench.predict.device import PUBLISHED, Bound, Calibration, DeviceModel, Work
from bench.predict.devices import LocalMachine, device_model
from bench.predict.gpu import GPU_FAMILIES
from bench.predict.network import Probe, fabric_of, network_for
from bench.predict.traffic import accumulation_bytes, loss_bytes


@dataclass(frozen=True)
class Stack:
    """A training stack other than this harness's eager Hugging Face model, as a published row ran it."""

    name: str
    traffic: float  # share of the eager elementwise traffic (Calibration.elementwise_bytes) its blocks move
    attention: dict[str, float]  # its attention kernel's fraction of the dense peak, per GPU family
    loss_bytes: float | None = None  # what its loss moves per logit (vocabulary entry and token), outside
    # the matmuls; None: this harness's (traffic.loss_bytes)


CALIBRATION = Calibration(matmul_efficiency={"A100": 0.854, "H100": 0.676}, elementwise_bytes=370.6,
                          contention=0.189, compile_traffic=0.703)
# contention: the compute's loss while a collective runs beside it, the average slowdown of overlapped
# compute measured by Lee et al. (arXiv 2507.03114: 18.9%, at most 40%), not fitted. The other four were
# fitted (benchmarks/perf_model.py) to bench/predict/published.py's CALIBRATION_ROWS before collectives
# were NCCL's and the overlap FSDP2's, and are kept: refitted under this model to those rows and the
# published FSDP rows not set aside, they move along a valley that this harness's own GPU runs and
# llm-foundry's table, never fitted to, both pay for (benchmarks/evidence/README.md, "Published FSDP rows")

Bands = tuple[tuple[int | None, float, int], ...]  # (a band's largest node count, its half-width, its rows)

# How far published rows lie from the model with these constants, by node count: per band (its largest
# node count; None: any more), the half-width in log units of tokens/s/GPU that ~90% of its modelled rows of
# benchmarks/published/fsdp lie within, and how many rows. The interval of a GPU prediction the study's own
# runs have not calibrated: what an answer before anything runs is worth. Measured, not fitted: `python
# benchmarks/fsdp_rows.py --spread` prints it, and a test keeps the two equal.
PUBLISHED_SPREAD: Bands = (
    (1, 0.367, 147), (8, 0.313, 171), (32, 0.245, 85), (None, 0.434, 48))


def published_spread(nodes: int, bands: Bands = PUBLISHED_SPREAD) -> float:
    """The ~90% half-width, in log units, of the published rows on as many nodes (PUBLISHED_SPREAD's, or
    `bands` measured as it is)."""
    return next(spread for top, spread, _ in bands if top is None or nodes <= top)


# Fixed, not fitted:
OPTIMIZER_BYTES = 28  # AdamW per sharded fp32 parameter: read param, grad, 2 moments; write param, moments.
# That is fused AdamW, torchtitan's default (the calibration rows). Unfused ones move more: this harness's
# foreach AdamW about 72 (seven passes: lerp, mul, addcmul, sqrt, div, add, addcdiv), Composer's
# DecoupledAdamW about 80 and its norm clipping 12 more (llm-foundry). Left at 28 for every stack, as the
# constants were fitted: benchmarks/perf_model.py prints llm-foundry's table and this project's GPU runs at
# the counted figures (the runs' median error falls, their compute-bound bf16 runs' rises).


FLOOR = "; a floor: "  # in pred_source, before what the model left out of the run (DeviceModel.unmodeled)


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    matmul_s: float
    memory_s: float  # elementwise + optimizer: HBM-bandwidth bound
    comm_s: float  # every collective of the step, as if nothing overlapped
    exposed_s: float  # communication the step waits for (the exposed parts: the trace's definition)
    network: Network
    calibrated: bool  # False: a device family that neither published rows nor the study calibrated
    source: str = PUBLISHED  # which constants: published, or this study's N runs
    spread: float | None = None  # half-width of the ~90% interval, log units: tokens/s x exp(+-spread)
    host_s: float = 0.0  # the host's floor under the step (gpu.HOST_BLOCK_PASS_S; 0: none for the device)
    unmodeled: str | None = None  # what the model leaves out of this run's step: a floor only
    parts: dict[str, float] = field(default_factory=dict)  # seconds per step by part, adding up to the
    # step (module docstring; bench/predict/split.py reads them)
    contention_s: float = 0.0  # compute the collectives beside it slow, within parts["compute"]
    bounds: tuple[Bound, ...] = ()  # per part of the step's collectives, NCCL's pick and what bounds it

    @property
    def interval(self) -> tuple[float, float] | None:
        """tokens/s/GPU low and high: the study's calibration's, else the published rows' (none: a CPU's
        or a floor's)."""
        if self.spread is None:
            return None
        return (self.tokens_per_s_per_gpu * math.exp(-self.spread),
                self.tokens_per_s_per_gpu * math.exp(self.spread))

    @property
    def bound(self) -> str:
        """What most of the step is: compute-, network- or memory-bandwidth-bound; host-bound where the
        host's launch time is the step (gpu.HOST_BLOCK_PASS_S)."""
        if self.host_s >= self.step_time_s:
            return "host-bound"
        parts = {"compute-bound": self.matmul_s, "memory-bandwidth-bound": self.memory_s,
                 "network-bound": self.exposed_s}
        return max(parts, key=parts.__getitem__)

    def fields(self) -> dict[str, Any]:
        """As results-table columns (prefixed pred_)."""
        source = self.source + (f"{FLOOR}{self.unmodeled}" if self.unmodeled else "")
        return {"pred_step_time_s": self.step_time_s, "pred_tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "pred_mfu": self.mfu, "pred_bound": self.bound, "pred_source": source,
                "pred_exposed_comm_s": self.exposed_s}


def stack_attention_s(spec: RunSpec, arch: ModelArch, stack: Stack, family: str, peak: float,
                      efficiency: float) -> float:
    """Per token: a stack's attention kernel on its own work (the causal half of the square; forward two
    matmuls, backward five, as the kernel recomputes the scores; a rerun forward two more), less what the
    matmul term counted for it (the full square: six matmuls and two per rerun block, at `efficiency`)."""
    square = attention_square_flops_per_token(arch, spec.seq_len)
    rerun = 0 if spec.activation_checkpointing == "selective_op" else 2 * len(
        checkpointed_blocks(spec.activation_checkpointing, arch.blocks)) / arch.blocks
    kernel = square * (7 + rerun) / 2 / (stack.attention[family] * peak)
    return kernel - square * (6 + rerun) / (efficiency * peak)


def _step(spec: RunSpec, arch: ModelArch, device: DeviceModel, network: Network, cal: Calibration,
          stack: Stack | None) -> Prediction:
    """The step on a device (module docstring)."""
    peaks, family = device.peaks(spec), device.gpu.family
    peak, efficiency = peaks.dense, device.efficiency(compute_dtype(spec.precision))
    tokens = spec.micro_batch * spec.seq_len
    hw_flops = hardware_flops_per_token(arch, spec.seq_len, spec.activation_checkpointing) * tokens
    linear8 = 6 * float8_linear_params(arch) * tokens if spec.precision == "fp8_tensorwise" else 0.0
    matmul = ((hw_flops - linear8) / peak + linear8 / peaks.fp8) / efficiency
    if stack is not None:
        matmul += tokens * stack_attention_s(spec, arch, stack, family, peak, efficiency)
    recompute = hw_flops / (model_flops_per_token(arch, spec.seq_len) * tokens) - 1  # forward passes redone
    hbm = peaks.memory
    share = stack.traffic if stack is not None else cal.compile_traffic if spec.compile else 1.0
    traffic = cal.elementwise_bytes * share
    blocks = traffic * arch.hidden * arch.blocks * (3 + 3 * recompute) * tokens / hbm
    loss = loss_bytes(spec, arch, stack and stack.loss_bytes) * tokens / hbm
    params = count_params(arch)
    shard = shard_size(spec.sharding, spec.nodes, spec.gpus_per_node)
    optimizer = OPTIMIZER_BYTES * params / shard / hbm if spec.offload == "none" else 0.0
    adds = accumulation_bytes(spec, params)[0] / hbm  # a step's, not its micro-batches' compute
    compute = matmul + blocks + loss
    output = 2.0 * arch.vocab * arch.hidden * tokens / peak / efficiency  # the output layer's forward matmul
    work = unit_work(spec, arch, compute, output, loss, hw_flops / tokens)
    comm = device.communication(spec, arch, network, work)
    accum = spec.grad_accum
    host = device.host_s(spec, arch, recompute)
    parts, floor = device.parts(spec, accum * compute + adds, comm, optimizer, host)
    step = sum(parts.values())
    model_flops = model_flops_per_token(arch, spec.seq_len) * tokens * accum
    calibrated = family in cal.matmul_efficiency or cal.source != PUBLISHED
    return Prediction(step, tokens * accum / step, model_flops / step / peak if peak else None,
                      accum * matmul, accum * (blocks + loss) + adds + optimizer, comm.total,
                      sum(comm.exposed.values()), network, calibrated, cal.source, host_s=floor,
                      unmodeled=device.unmodeled(spec), parts=parts, contention_s=comm.contention,
                      bounds=comm.bounds)


def unit_work(spec: RunSpec, arch: ModelArch, compute: float, output: float, loss: float,
              hw_flops: float) -> Work:
    """A micro-batch's `compute` seconds by FSDP unit: the root's is its output layer's matmuls (forward,
    and twice that backward) and the loss's traffic (a third forward); each block's an equal share of the
    rest, its forward the model's forward FLOPs' share of its hardware FLOPs (activation checkpointing's
    rerun goes to the backward). One unit (whole_model wrap, or no blocks): the root holds it all."""
    n = len(block_params(arch)) if spec.wrap_policy == "transformer_block" else 0
    forward_share = model_flops_per_token(arch, spec.seq_len) / 3 / hw_flops
    if n == 0:
        return Work(compute * forward_share, compute * (1 - forward_share), 0.0, 0.0, 0)
    root_forward, root_backward = output + loss / 3, 2 * output + 2 * loss / 3
    rest = max(0.0, compute - root_forward - root_backward) / n
    block_share = max(0.0, forward_share * compute - root_forward) / n / rest if rest else 0.0
    return Work(root_forward, root_backward, rest * block_share, rest * (1 - block_share), n)


def predict(spec: RunSpec, gpu: GpuSpec, network: Network, arch: ModelArch | None = None,
            cal: Calibration = CALIBRATION, stack: Stack | None = None,
            local: LocalMachine | None = None) -> Prediction:
    """The model for one run on a GPU and node network (or on the machine `local` a local study ran on, as
    devices.device_model picks its device); arch defaults to the spec's preset; stack: another training stack
    than this harness's Hugging Face model (published rows only)."""
    device = device_model(gpu, cal, local)
    return _step(spec, arch or spec.arch, device, device.network(network), cal, stack)


class StudyFit(Protocol):
    """A study's calibration (bench/predict/calibrate.py's Fit): its constants, and how uncertain a
    prediction made with them is."""

    calibration: Calibration

    def spread(self, tokens: Callable[[Calibration], float]) -> float: ...


class Predictor:
    """Predictions for one sweep: each run on the cluster's GPU (where the runs run on this machine: the
    device devices.LocalMachine places them on), over the cluster's fabric with NCCL's model of it
    calibrated by the study's own probes where it has them (bench/predict/network.py); with the study's own
    calibration where it has one (bench/predict/calibrate.py), else the published constants. `local`: the
    machine its local runs ran on (devices.LocalMachine; None: this one, for a plan's new runs)."""

    def __init__(self, cluster: ClusterConfig, placement: Placement, probes: tuple[Probe, ...] = (),
                 fit: StudyFit | None = None, local: LocalMachine | None = None) -> None:
        self.cluster, self.placement, self.probes, self.fit = cluster, placement, probes, fit
        self.local = local or LocalMachine()
        self._networks: dict[tuple[str, int, int], Network] = {}

    def device(self, spec: RunSpec) -> GpuSpec | None:
        if self.cluster.gpu:
            return GPUS[self.cluster.gpu]
        if not self.placement.this_machine:
            return None  # GPUs the cluster file does not name: no peak to predict against
        return self.local.device(spec.world_size)

    def setting(self, spec: RunSpec) -> tuple[GpuSpec, Network] | None:
        """Where a training run runs: its device and network; None where there is nothing to predict on."""
        gpu = self.device(spec) if spec.kind == "train" else None
        if gpu is None:
            return None
        key = (gpu.name, spec.nodes, spec.efa_per_node)
        if key not in self._networks:
            self._networks[key] = network_for(fabric_of(self.cluster, gpu), spec.efa_per_node, spec.nodes,
                                              self.probes)
        return gpu, self._networks[key]

    def predict(self, spec: RunSpec) -> Prediction | None:
        where = self.setting(spec)
        if where is None:
            return None
        gpu, network = where
        if self.fit is None:
            pred = predict(spec, gpu, network, local=self.local)
            if pred.unmodeled or gpu.family not in GPU_FAMILIES:
                return pred
            return replace(pred, spread=published_spread(spec.nodes))
        pred = predict(spec, gpu, network, cal=self.fit.calibration, local=self.local)
        if pred.unmodeled:  # a floor: the study's scatter says nothing of how far above it the run lands
            return pred
        spread = self.fit.spread(
            lambda cal: predict(spec, gpu, network, cal=cal, local=self.local).tokens_per_s_per_gpu)
        return replace(pred, spread=spread)
