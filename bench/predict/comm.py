"""FSDP's collectives in one optimizer step, and the time each takes on a node's network: what
bench/predict/perf.py's step model exposes or hides behind compute.

Per micro-batch, the strategy's all-gathers and reduce-scatters (HYBRID_SHARD's all-reduce across nodes,
NO_SHARD's all-reduce) as trainer/parallel.py maps the four strategies; per optimizer step, the
micro-batches grouped by what each accumulation mode lets them communicate. On a GPU cluster one
collective's time is NCCL's: the algorithm and protocol NCCL picks for its size, node count and the node's
fabric, each with its latency and bandwidth (bench/predict/collective.py), calibrated by the study's own
probes where it has them (bench/predict/network.py); `gpu_collective_s`. Another device's collectives are
its device model's own (bench/predict/devices.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from bench.core.fabric import Fabric
from bench.core.flops import COMPUTE_BYTES, REDUCE_BYTES
from bench.core.hardware import GpuSpec
from bench.core.models import ModelArch, block_params, count_params, float8_linear_params
from bench.core.schema import RunSpec
from bench.predict.collective import Calibration, CollectiveTime, predict_collective


@dataclass(frozen=True)
class Network:
    """What a run's collectives run over: the node's fabric as the run uses it (the EFA adapters it was
    given), the NCCL version its runs recorded, and NCCL's model of that fabric calibrated by the study's
    own probes where it has them (per collective, on one node and across nodes); else the model's published
    figures (bench/predict/network.py DEFAULTS). `fabric` None: no GPU network (the device model's
    own collectives)."""

    fabric: Fabric | None
    source: str
    version: str | None = None  # NCCL's, as the study's runs recorded it; None: collective.DEFAULT_VERSION
    tuning: tuple[tuple[str, bool, Calibration], ...] = ()  # (kind, across nodes, its calibration)

    def calibration(self, kind: str, across: bool) -> Calibration | None:
        """A probe's calibration of `kind` (on one node or across nodes), else the all-reduce's, else any
        kind's probed so: a fabric's latency and bandwidth are the network's before they are a kind's."""
        scope = {k: c for k, a, c in self.tuning if a == across}
        return scope.get(kind) or scope.get("all_reduce") or next(iter(scope.values()), None)

    @property
    def described(self) -> str:
        """Where every collective's figures come from (the plan's "network:" line)."""
        return self.source + "".join(f"; {kind.replace('_', '-')} {'across nodes' if a else 'on one node'}: "
                                     f"{c.source}" for kind, a, c in self.tuning)

    def fed_by(self, kind: str) -> str:
        """Which probe or figure calibrates `kind` across nodes, in words."""
        found = self.calibration(kind, True)
        return found.source if found else self.source


@dataclass(frozen=True)
class Collective:
    kind: str  # "all_gather", "reduce_scatter", "all_reduce"
    size: float  # bytes of the whole gathered or reduced tensor
    ranks: int  # ranks in one group
    nodes: int  # nodes the group spans
    phase: str  # "forward" or "backward"
    groups: int = 1  # groups that run it at once, side by side, each on its share of `size` and of the nodes'
    # adapters (HYBRID_SHARD's all-reduce: one group per GPU of a node)


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
                Collective("all_reduce", grads, n, n, "backward", groups=g)]  # all of grads per node
    return [Collective("all_reduce", grads, world, n, "backward")]  # NO_SHARD


EXPOSED_PARTS = ("exposed_all_gather_fwd", "exposed_all_gather_bwd", "exposed_reduce_scatter",
                 "exposed_all_reduce")


def exposed_part(c: Collective) -> str:
    """The trace's part a collective's exposed time lands in: the all-gathers by the pass that issues them."""
    if c.kind == "all_gather":
        return "exposed_all_gather_fwd" if c.phase == "forward" else "exposed_all_gather_bwd"
    return f"exposed_{c.kind}"


def unit_shares(spec: RunSpec, arch: ModelArch, blocks: int) -> tuple[dict[str, float], dict[str, float]]:
    """The root unit's and one block's share of each kind of the model's collectives: a gather moves its
    unit's parameters in the compute dtype (the converted linears of Float8 blocks in one byte; the root's
    embedding and output layer are not converted), a reduction its gradients. One unit: the root, all."""
    if blocks == 0:
        return dict.fromkeys(("all_gather", "reduce_scatter", "all_reduce"), 1.0), dict.fromkeys(
            ("all_gather", "reduce_scatter", "all_reduce"), 0.0)
    params = count_params(arch)
    root = params - sum(block_params(arch))
    gather = params * COMPUTE_BYTES[spec.precision]
    if spec.precision == "fp8_tensorwise":
        gather -= float8_linear_params(arch) * (COMPUTE_BYTES[spec.precision] - 1)
    gathered = root * COMPUTE_BYTES[spec.precision] / gather
    reduced = root / params
    root_share = {"all_gather": gathered, "reduce_scatter": reduced, "all_reduce": reduced}
    return root_share, {k: (1 - v) / blocks for k, v in root_share.items()}


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
    """One of FSDP's collectives on a GPU cluster, `units` FSDP units each gathering or reducing its share on
    its own: NCCL's pick of algorithm and protocol and its time by NCCL's model of the node's fabric
    (bench/predict/collective.py), calibrated by the study's probes where it has them."""
    return units * nccl_time(c.kind, c.size / units, c.ranks, c.nodes, network).seconds


@functools.lru_cache(maxsize=4096)
def nccl_time(kind: str, nbytes: float, ranks: int, nodes: int, network: Network) -> CollectiveTime:
    """One collective of `nbytes` (nccl-tests' size) over `ranks` ranks on `nodes` nodes of the network's
    fabric, calibrated as the network says (a one-node probe's figures with a multi-node one's)."""
    if network.fabric is None:
        raise ValueError("a GPU collective needs the cluster's fabric (bench/predict/network.py fabric_of)")
    across, inside = network.calibration(kind, True), network.calibration(kind, False)
    cal = combined(inside, across) if nodes > 1 else inside
    return predict_collective(kind, max(1, round(nbytes)), nodes, max(1, ranks // nodes), network.fabric,
                              version=network.version, calibration=cal)


def combined(inside: Calibration | None, across: Calibration | None) -> Calibration | None:
    """A multi-node collective's figures: the network's from a multi-node probe, the node's own latency and
    bandwidth from a one-node probe."""
    if inside is None or across is None:
        return across or inside
    return replace(across, latency=inside.latency, intra_bw=inside.intra_bw,
                   source=f"{across.source}; {inside.source}")


def ring_steps(c: Collective) -> int:
    """Steps of NCCL's ring a collective takes: R-1 for a gather or reduce-scatter, 2(R-1) for an
    all-reduce."""
    return (2 if c.kind == "all_reduce" else 1) * (c.ranks - 1)
