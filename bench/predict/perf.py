"""What a planned run will deliver, before it runs: step time, tokens/s/GPU, MFU and scaling efficiency.

One training step per GPU is modelled as

    step = max(matmuls + elementwise + optimizer + exposed communication + contention, host)

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
  each taking the longer of its intra-node leg and its network leg (bench/predict/network.py: the study's
  own probe of that collective where it has one, else the published figures). FSDP2 prefetches the next
  unit's gather while a unit computes, so only what outlasts its phase's compute is exposed, plus the first
  unit's gather and the last unit's reduction, which nothing hides;
- contention: communication that overlaps still slows compute (NCCL's kernels take SMs and HBM
  bandwidth): a fraction of the hidden communication time;
- host: eager PyTorch launches each kernel from Python, and FSDP2's hooks run per block; a GPU that
  finishes its work sooner waits for the CPU. HOST_BLOCK_PASS_S per block and pass (forward, two for the
  backward, one more where activation checkpointing recomputes): the floor of a small model's step.

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
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from bench.core.config import ClusterConfig
from bench.core.flops import (
    attention_square_flops_per_token,
    checkpointed_blocks,
    hardware_flops_per_token,
    model_flops_per_token,
    shard_size,
)
from bench.core.hardware import GPUS, GpuSpec, compute_dtype, gpu_spec
from bench.core.models import ModelArch, block_params, count_params, float8_linear_params
from bench.core.schema import RunSpec
from bench.launchers.base import Placement
from bench.predict.comm import Curve, Network, collective_s, step_collectives
from bench.predict.cpu import (
    CPU,
    CPU_EFFICIENCY,
    CPU_EMULATED_16BIT,
    cpu_peak_flops,
    cpu_runs_natively,
    cpu_share,
)
from bench.predict.network import network_for
from bench.predict.traffic import accumulation_bytes, loss_bytes


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
    # (None: its core count; hyperthreads and memory bandwidth make it fewer)
    source: str = "published constants"  # or "this study's N runs": the results table's pred_source

    def efficiency(self, family: str, dtype: str) -> float:
        """The matmul efficiency for a family and compute dtype: the dtype's own where a study measured it,
        else its 16-bit sibling's (GPUs run fp16 and bf16 on the same tensor cores at one peak; a CPU without
        16-bit units emulates both, several times slower than fp32), else the family's; on a CPU, else its
        fp32 figure (times CPU_EMULATED_16BIT for a 16-bit dtype it has no units for); else (an uncalibrated
        GPU family) the lowest calibrated one."""
        table = self.matmul_efficiency
        for key in (f"{family}:{dtype}", f"{family}:{HALF_SIBLING.get(dtype)}", family):
            if key in table:
                return table[key]
        if family == "cpu":  # a dtype this study has not run on its CPU yet: relative to its fp32 figure
            fp32 = table.get("cpu:fp32", CPU_EFFICIENCY)
            return fp32 if dtype == "fp32" or cpu_runs_natively(dtype) else fp32 * CPU_EMULATED_16BIT
        return min(v for k, v in table.items() if ":" not in k and k != "cpu")

    def capacity(self) -> float:
        return self.cpu_capacity if self.cpu_capacity is not None else float(os.cpu_count() or 1)


@dataclass(frozen=True)
class Stack:
    """A training stack other than this harness's eager Hugging Face model, as a published row ran it."""

    name: str
    traffic: float  # share of the eager elementwise traffic (Calibration.elementwise_bytes) its blocks move
    attention: dict[str, float]  # its attention kernel's fraction of the dense peak, per GPU family
    loss_bytes: float | None = None  # what its loss moves per logit (vocabulary entry and token), outside
    # the matmuls; None: this harness's (traffic.loss_bytes)


HALF_SIBLING = {"fp16": "bf16", "bf16": "fp16"}
CALIBRATION = Calibration(matmul_efficiency={"A100": 0.854, "H100": 0.676}, elementwise_bytes=370.6,
                          contention=0.349, compile_traffic=0.703)
# Fixed, not fitted:
OPTIMIZER_BYTES = 28  # AdamW per sharded fp32 parameter: read param, grad, 2 moments; write param, moments.
# That is fused AdamW, torchtitan's default (the calibration rows). Unfused ones move more: this harness's
# foreach AdamW about 72 (seven passes: lerp, mul, addcmul, sqrt, div, add, addcdiv), Composer's
# DecoupledAdamW about 80 and its norm clipping 12 more (llm-foundry). Left at 28 for every stack, as the
# constants were fitted: benchmarks/perf_model.py prints llm-foundry's table and this project's GPU runs at
# the counted figures (the runs' median error falls, their compute-bound bf16 runs' rises).


# The host's CPU time for one block and pass on a GPU machine (eager FSDP2): the floor of a step whose GPU
# work is negligible. Measured, not fitted (benchmarks/evidence/README.md, "Host floor"); published rows'
# steps lie far above it.
HOST_BLOCK_PASS_S = 2.24e-3


FLOOR = "; a floor: "  # in pred_source, before what the model left out of the run (unmodeled)


def unmodeled(spec: RunSpec, gpu: GpuSpec) -> str | None:
    """Why the step model is only a floor under a run's step on this device, else None. CPU offload on a
    GPU: its optimizer steps on the host and its shards cross PCIe every step, neither of which the model
    has (the GPU evidence's offload run measured 13x its floor: benchmarks/evidence/README.md). Such a run is
    no evidence for the study's calibration (bench/predict/calibrate.py): its miss would pull every other
    run's prediction."""
    if spec.offload != "none" and gpu.family != "cpu":
        return "CPU offload (the host's optimizer step and PCIe copies are not modeled)"
    return None


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    matmul_s: float
    memory_s: float  # elementwise + optimizer: HBM-bandwidth bound
    comm_s: float  # every collective of the step, as if nothing overlapped
    exposed_s: float  # communication the step waits for, contention included
    network: Network
    calibrated: bool  # False: a GPU family (or the CPU) that neither published rows nor the study calibrated
    source: str = CALIBRATION.source  # which constants: published, or this study's N runs
    spread: float | None = None  # half-width of the ~90% interval, log units: tokens/s x exp(+-spread)
    host_s: float = 0.0  # the CPU's floor under the step (HOST_BLOCK_PASS_S)
    unmodeled: str | None = None  # what the model leaves out of this run's step (unmodeled): a floor only

    @property
    def interval(self) -> tuple[float, float] | None:
        """tokens/s/GPU low and high, from the study's calibration residuals (none: published constants)."""
        if self.spread is None:
            return None
        return (self.tokens_per_s_per_gpu * math.exp(-self.spread),
                self.tokens_per_s_per_gpu * math.exp(self.spread))

    @property
    def bound(self) -> str:
        """What most of the step is: compute-, network- or memory-bandwidth-bound; host-bound where the
        host's launch time is the step (HOST_BLOCK_PASS_S)."""
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


def _step(spec: RunSpec, arch: ModelArch, gpu: GpuSpec, network: Network, peak: float, fp8_peak: float,
          efficiency: float, cal: Calibration, stack: Stack | None) -> Prediction:
    tokens = spec.micro_batch * spec.seq_len
    hw_flops = hardware_flops_per_token(arch, spec.seq_len, spec.activation_checkpointing) * tokens
    linear8 = 6 * float8_linear_params(arch) * tokens if spec.precision == "fp8_tensorwise" else 0.0
    matmul = ((hw_flops - linear8) / peak + linear8 / fp8_peak) / efficiency
    if stack is not None:
        matmul += tokens * stack_attention_s(spec, arch, stack, gpu.family, peak, efficiency)
    recompute = hw_flops / (model_flops_per_token(arch, spec.seq_len) * tokens) - 1  # forward passes redone
    hbm = gpu.hbm_tbs * 1e12
    share = stack.traffic if stack is not None else cal.compile_traffic if spec.compile else 1.0
    traffic = cal.elementwise_bytes * share
    blocks = traffic * arch.hidden * arch.blocks * (3 + 3 * recompute)  # per token, as the loss's
    elementwise = (blocks + loss_bytes(spec, arch, stack and stack.loss_bytes)) * tokens / hbm
    params = count_params(arch)
    shard = shard_size(spec.sharding, spec.nodes, spec.gpus_per_node)
    optimizer = OPTIMIZER_BYTES * params / shard / hbm if spec.offload == "none" else 0.0
    once = optimizer + accumulation_bytes(spec, params)[0] / hbm  # a step's, not its micro-batches' compute
    compute = matmul + elementwise
    forward_share = model_flops_per_token(arch, spec.seq_len) / 3 / (hw_flops / tokens)
    window = {"forward": compute * forward_share, "backward": compute * (1 - forward_share)}
    units = len(block_params(arch)) + 1  # each block and the root: what FSDP gathers one at a time
    exposed = hidden = total = 0.0
    for comms, count in step_collectives(spec, arch):  # each micro-batch hides what it can behind its compute
        for phase, budget in window.items():
            comm = sum(collective_s(c, gpu, network, units) for c in comms if c.phase == phase)
            shown = min(comm, max(0.0, comm - budget) + comm / units)  # past its compute, + first/last unit
            exposed, hidden = exposed + count * shown, hidden + count * (comm - shown)
            total += count * comm
    exposed += cal.contention * hidden
    accum = spec.grad_accum
    host = HOST_BLOCK_PASS_S * arch.blocks * (3 + 3 * recompute) * accum if gpu.family != "cpu" else 0.0
    step = max(accum * compute + once + exposed, host)  # a CPU study's own cores are its compute
    model_flops = model_flops_per_token(arch, spec.seq_len) * tokens * accum
    calibrated = gpu.family in cal.matmul_efficiency or cal.source != CALIBRATION.source
    return Prediction(step, tokens * accum / step, model_flops / step / peak if peak else None,
                      accum * matmul, accum * elementwise + once, total, exposed, network, calibrated,
                      cal.source, host_s=host, unmodeled=unmodeled(spec, gpu))


def predict(spec: RunSpec, gpu: GpuSpec, network: Network, arch: ModelArch | None = None,
            cal: Calibration = CALIBRATION, stack: Stack | None = None) -> Prediction:
    """The model for one run on a GPU (or this machine's CPU) and node network; arch defaults to the spec's
    preset; stack: another training stack than this harness's Hugging Face model (published rows only)."""
    arch = arch or spec.arch
    efficiency = cal.efficiency(gpu.family, compute_dtype(spec.precision))
    if gpu.family == "cpu":  # every rank of a local study on this machine's cores: each gets its share
        share = cpu_share(spec.world_size, cal.capacity())
        cpu = replace(gpu, hbm_tbs=gpu.hbm_tbs * share)
        return _step(spec, arch, cpu, network, cpu_peak_flops() * share, cpu_peak_flops() * share, efficiency,
                     cal, stack)
    peak = gpu.peak_tflops[compute_dtype(spec.precision)] * 1e12
    fp8_peak = gpu.peak_tflops.get("fp8", peak / 1e12) * 1e12
    return _step(spec, arch, gpu, network, peak, fp8_peak, efficiency, cal, stack)


class StudyFit(Protocol):
    """A study's calibration (bench/predict/calibrate.py's Fit): its constants, and how uncertain a
    prediction made with them is."""

    calibration: Calibration

    def spread(self, tokens: Callable[[Calibration], float]) -> float: ...


class Predictor:
    """Predictions for one sweep: each run on the cluster's GPU (where the runs run on this machine: its GPU
    where the run fits on its GPUs, else its CPU cores), over the study's own all-reduce probe at the run's
    node and EFA count where the sweep dir has one, else the instance's published measurement; with the
    study's own calibration where it has one (bench/predict/calibrate.py), else the published constants."""

    def __init__(self, cluster: ClusterConfig, placement: Placement,
                 probes: dict[tuple[int, int], Network] | None = None, fit: StudyFit | None = None) -> None:
        self.cluster, self.placement, self.probes, self.fit = cluster, placement, probes or {}, fit
        self._local: tuple[list[str], str | None] | None = None

    def device(self, spec: RunSpec) -> GpuSpec | None:
        if self.cluster.gpu:
            return GPUS[self.cluster.gpu]
        if not self.placement.this_machine:
            return None  # GPUs the cluster file does not name: no peak to predict against
        if self._local is None:
            from bench.core.gpus import local_gpu_name, local_gpus
            self._local = (local_gpus(), local_gpu_name())
        gpus, name = self._local
        if gpus and spec.world_size <= len(gpus):
            return gpu_spec(name or "")
        return CPU

    def setting(self, spec: RunSpec) -> tuple[GpuSpec, Network] | None:
        """Where a training run runs: its device and network; None where there is nothing to predict on."""
        gpu = self.device(spec) if spec.kind == "train" else None
        if gpu is None:
            return None
        probe = self.probes.get((spec.nodes, spec.efa_per_node))
        curves = probe.curves if probe else ()
        if probe is not None and math.isnan(probe.node_gbs):  # gather/reduce-scatter probes, no all-reduce
            probe = None
        network = network_for(self.cluster.instance_type, spec.efa_per_node, probe, spec.nodes)
        if curves:
            network = replace(network, curves=curves)
        if intra := self._intra(spec.efa_per_node):
            network = replace(network, intra=intra)
        near = sorted(k for k, v in self.probes.items()
                      if k[1] == spec.efa_per_node and not math.isnan(v.node_gbs))
        if probe is None and self.placement.one_host and near:
            # one machine: every simulated node's loopback is the same, so the nearest probe's latency holds
            borrowed = self.probes[min(near, key=lambda k: abs(k[0] - spec.nodes))]
            network = replace(network, step_latency_s=borrowed.step_latency_s,
                              source=f"{network.source}; ring step latency from {borrowed.source}")
        return gpu, network

    def _intra(self, efa: int) -> tuple[Curve, ...]:
        """The one-node probes' curves among a node's GPUs (any node count's runs have such a node): at
        `efa` adapters where probed so, else at any."""
        ones = [k for k, v in self.probes.items() if k[0] == 1 and v.intra]
        return self.probes[min(ones, key=lambda k: (k[1] != efa, k))].intra if ones else ()

    def predict(self, spec: RunSpec) -> Prediction | None:
        where = self.setting(spec)
        if where is None:
            return None
        gpu, network = where
        if self.fit is None:
            return predict(spec, gpu, network)
        pred = predict(spec, gpu, network, cal=self.fit.calibration)
        if pred.unmodeled:  # a floor: the study's scatter says nothing of how far above it the run lands
            return pred
        spread = self.fit.spread(lambda cal: predict(spec, gpu, network, cal=cal).tokens_per_s_per_gpu)
        return replace(pred, spread=spread)
