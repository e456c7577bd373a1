"""FSDP's collectives in one optimizer step, and the time each takes on a node's network: what
bench/predict/perf.py's step model exposes or hides behind compute.

Per micro-batch, the strategy's all-gathers and reduce-scatters (HYBRID_SHARD's all-reduce across nodes,
NO_SHARD's all-reduce) as trainer/parallel.py maps the four strategies; per optimizer step, the
micro-batches grouped by what each accumulation mode lets them communicate. A collective takes the longer
of its intra-node leg and its network leg, plus its ring's step latency once per FSDP unit. The intra-node
leg: the study's one-node probe of that collective at the size nearest one FSDP unit's message where it
has one, else the GPUs' published all-reduce bus bandwidth. The network leg: the bytes a node's adapters
carry over the node's throughput for that collective (the study's all-gather or reduce-scatter probe at
the size nearest one unit's message where it has one, else the all-reduce figure).

A GPU's collective is one function, `gpu_collective_s`; a CPU study's (gloo on a local study's shared
cores) is its device's own (bench/predict/cpu.py CpuModel.collective_s).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from bench.core.flops import COMPUTE_BYTES, REDUCE_BYTES
from bench.core.hardware import GpuSpec
from bench.core.models import ModelArch, block_params, count_params, float8_linear_params
from bench.core.schema import RunSpec

# Latency of one step of NCCL's ring (a collective over R ranks takes R-1 steps, an all-reduce 2(R-1)),
# where the study has not probed it: an 8-byte all-reduce's time over its ring steps in real nccl-tests
# outputs (shared/data/nccl-tests): 2 nodes x 8 H100, 135.8 us / 30 steps (sample_05); one node of 8 GPUs,
# 22.8 us / 14 steps (sample_09). The study's own all-reduce probe replaces both (probe_network).
INTER_NODE_STEP_S = 4.5e-6
INTRA_NODE_STEP_S = 1.6e-6


@dataclass(frozen=True)
class Curve:
    """A study's probe of one collective at one node and EFA count: node-level throughput per message size
    (algbw x f(N-1)/N over the N nodes, f = 1 for a gather or reduce-scatter), its bandwidth-bound rows;
    on one node, the bus bandwidth among its ranks (Network.intra)."""

    kind: str  # "all_gather" or "reduce_scatter" (all-reduce is Network.node_gbs)
    rows: tuple[tuple[int, float], ...]  # (message bytes, node GB/s), ascending
    source: str

    def at(self, message: float) -> tuple[int, float]:
        """The row nearest `message` bytes on a log scale."""
        return min(self.rows, key=lambda r: abs(math.log(r[0] / max(message, 1.0))))


@dataclass(frozen=True)
class Network:
    """What a node's adapters carry for FSDP's collectives, and where that figure comes from."""

    node_gbs: float  # GB/s of node-level all-reduce throughput (algbw x 2(N-1)/N) at FSDP's message sizes
    source: str
    step_latency_s: float = INTER_NODE_STEP_S  # one ring step: what each of FSDP's many collectives pays
    curves: tuple[Curve, ...] = ()  # the study's all-gather and reduce-scatter probes, where it has them
    # its one-node all-gather and reduce-scatter probes: bus bandwidth among one node's ranks (GB/s) per size
    intra: tuple[Curve, ...] = ()

    def gbs(self, kind: str, message: float) -> float:
        """Node-level GB/s of `kind` at one unit's `message` bytes: its own probe's nearest row, else the
        all-reduce figure (all-reduce itself, and a collective the study has not probed)."""
        curve = next((c for c in self.curves if c.kind == kind and c.rows), None)
        return curve.at(message)[1] if curve else self.node_gbs

    def intra_gbs(self, kind: str, message: float, published: float) -> float:
        """Bus GB/s of `kind` among one node's GPUs at one unit's `message` bytes: its one-node probe's
        nearest row, else `published` (the GPU's all-reduce figure)."""
        curve = next((c for c in self.intra if c.kind == kind and c.rows), None)
        return curve.at(message)[1] if curve else published

    @property
    def described(self) -> str:
        """Where every collective's figure comes from (the plan's "network:" line)."""
        return self.source + "".join(f"; {c.kind.replace('_', '-')}s: {c.source}"
                                     for c in (*self.curves, *self.intra))

    def fed_by(self, kind: str) -> str:
        """Which probe or figure gives `kind`'s bandwidth, in words."""
        curve = next((c for c in self.curves if c.kind == kind and c.rows), None)
        return curve.source if curve else self.source


@dataclass(frozen=True)
class Collective:
    kind: str  # "all_gather", "reduce_scatter", "all_reduce"
    size: float  # bytes of the whole gathered or reduced tensor
    ranks: int  # ranks in one group
    nodes: int  # nodes the group spans
    phase: str  # "forward" or "backward"


def collectives(spec: RunSpec, arch: ModelArch) -> list[Collective]:
    """FSDP's collectives of one step (parameters gathered in the compute dtype, Float8 linears in one byte;
    gradients reduced in the mixed-precision policy's reduce dtype; trainer/parallel.py's mapping of the
    four strategies)."""
    params = count_params(arch)
    gather = params * COMPUTE_BYTES[spec.precision]
    if spec.precision == "fp8_tensorwise":  # float8 all-gather of the converted linears
        gather -= float8_linear_params(arch) * (COMPUTE_BYTES[spec.precision] - 1)
    grads = params * REDUCE_BYTES[spec.precision]
    world, g, n = spec.world_size, spec.gpus_per_node, spec.nodes
    if spec.sharding == "FULL_SHARD":
        return [Collective("all_gather", gather, world, n, "forward"),
                Collective("all_gather", gather, world, n, "backward"),
                Collective("reduce_scatter", grads, world, n, "backward")]
    if spec.sharding == "SHARD_GRAD_OP":
        return [Collective("all_gather", gather, world, n, "forward"),
                Collective("reduce_scatter", grads, world, n, "backward")]
    if spec.sharding == "HYBRID_SHARD":  # shard within a node, then each shard's all-reduce across nodes
        return [Collective("all_gather", gather, g, 1, "forward"),
                Collective("all_gather", gather, g, 1, "backward"),
                Collective("reduce_scatter", grads, g, 1, "backward"),
                Collective("all_reduce", grads, n, n, "backward")]  # g groups at once: all of grads per node
    return [Collective("all_reduce", grads, world, n, "backward")]  # NO_SHARD


def unit_messages(spec: RunSpec, arch: ModelArch) -> dict[str, int]:
    """One FSDP unit's all-gather and reduce-scatter in nccl-tests' size convention (the gathered output,
    the reduce-scatter's whole input): the largest wrapped block's parameters in the compute dtype (Float8
    linears in one byte) and its gradients in the reduce dtype; the whole model where it is one unit.
    Empty for NO_SHARD, which runs neither."""
    if spec.sharding == "NO_SHARD":
        return {}
    blocks = block_params(arch)
    params = count_params(arch) if spec.wrap_policy == "whole_model" or not blocks else max(blocks)
    gather = params * COMPUTE_BYTES[spec.precision]
    if spec.precision == "fp8_tensorwise" and blocks:  # the block's share of the converted linears
        share = params / count_params(arch) if spec.wrap_policy == "whole_model" else params / sum(blocks)
        gather -= round(float8_linear_params(arch) * share) * (COMPUTE_BYTES[spec.precision] - 1)
    return {"all_gather": int(gather), "reduce_scatter": int(params * REDUCE_BYTES[spec.precision])}


def step_collectives(spec: RunSpec, arch: ModelArch) -> list[tuple[list[Collective], int]]:
    """The micro-batches of one optimizer step grouped by what they communicate: (collectives, how many
    micro-batches), as each accumulation mode sets FSDP2 (trainer/parallel.py accumulate; the counts are
    the ones trainer/test_accumulation.py reads from the flight recorder of real runs)."""
    per, n = collectives(spec, arch), spec.grad_accum
    if n == 1 or spec.accumulation == "sync_each":
        return [(per, n)]
    if spec.accumulation == "sync_once":  # gradients reduced (and all-reduced) on the last micro-batch only
        return [([c for c in per if c.kind == "all_gather"], n - 1), (per, 1)]
    if spec.accumulation == "allreduce_once":  # HYBRID_SHARD's all-reduce across nodes on the last only
        return [([c for c in per if c.kind != "all_reduce"], n - 1), (per, 1)]
    # keep_gathered: only the first micro-batch's forward gathers
    return [(per, 1), ([c for c in per if not (c.kind == "all_gather" and c.phase == "forward")], n - 1)]


def bus_factor(kind: str, ranks: int) -> float:
    """Bus bytes per byte of the tensor (nccl-tests' definitions): (R-1)/R, twice that for all-reduce."""
    return (2 if kind == "all_reduce" else 1) * (ranks - 1) / ranks


def gpu_collective_s(c: Collective, gpu: GpuSpec, network: Network, units: int = 1) -> float:
    """One collective of FSDP's on a GPU cluster: the longer of the intra-node leg and the network leg (a
    hierarchical collective pipelines both), plus the ring's step latency once per FSDP unit (each unit
    gathers and reduces on its own)."""
    per_node = c.ranks // c.nodes
    intra_gbs = network.intra_gbs(c.kind, c.size / units, gpu.intra_busbw_gbs)
    intra = bus_factor(c.kind, per_node) * c.size / (intra_gbs * 1e9) if per_node > 1 else 0.0
    gbs = network.gbs(c.kind, c.size / units) if c.nodes > 1 else 0.0
    net = bus_factor(c.kind, c.nodes) * c.size / (gbs * 1e9) if c.nodes > 1 else 0.0
    return max(intra, net) + units * ring_steps(c) * network.step_latency_s


def ring_steps(c: Collective) -> int:
    """Steps of NCCL's ring a collective takes: R-1 for a gather or reduce-scatter, 2(R-1) for an
    all-reduce."""
    return (2 if c.kind == "all_reduce" else 1) * (c.ranks - 1)
