"""The network a run is predicted on: the study's own probes where it has them (all-reduce across nodes as
one figure and its ring's step latency; all-gather and reduce-scatter per message size, across nodes and
among one node's ranks), else the instance's published measurement, else line rate (bench/predict/comm.py
says how each collective takes them)."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from bench.core.hardware import INSTANCES
from bench.core.schema import RunSummary
from bench.predict.comm import INTER_NODE_STEP_S, INTRA_NODE_STEP_S, Curve, Network, bus_factor

RDMA_EFFICIENCY = 0.9  # of line rate, InfiniBand/RoCE clusters: GCP a3-mega H100s, 2 nodes, 8 GiB all-reduce
# (shared/data/nccl-tests/sample_05.txt: 180.7 GB/s of 200). EFA instances use their published measurement.
SOCKET_NODE_GBS = 2.5  # 0 EFA, NCCL's socket transport: 2 TCP flows at EC2's 10 Gb/s single-flow limit
# inside a cluster placement group (EC2 user guide, "instance network bandwidth"); an assumption the
# study's own 0-EFA probe replaces

LATENCY_MAX_BYTES = 65536  # probe rows up to this size are latency, not bandwidth, bound


def network_for(instance_type: str, efa: int, probe: Network | None = None, nodes: int = 2) -> Network:
    """The study's own all-reduce probe where it has one at this node and EFA count; else the instance's
    published measurement scaled to the adapters in use; else line rate at RDMA_EFFICIENCY. One node's
    collectives take NVLink's ring steps, not the network's."""
    if probe is not None:
        return probe
    latency = INTER_NODE_STEP_S if nodes > 1 else INTRA_NODE_STEP_S
    if efa == 0:
        return Network(SOCKET_NODE_GBS, "0 EFA: NCCL sockets over TCP (assumed; probe it)", latency)
    inst = INSTANCES.get(instance_type)
    if inst and inst.allreduce_node_gbs and inst.efa:
        return Network(inst.allreduce_node_gbs * min(efa, inst.efa) / inst.efa,
                       f"{inst.name} with {efa} EFA: {inst.allreduce_source}", latency)
    gbps = inst.network_gbps * min(efa, inst.efa) / inst.efa if inst and inst.efa else 100.0 * efa
    return Network(gbps / 8 * RDMA_EFFICIENCY, f"{gbps:g} Gb/s line rate x {RDMA_EFFICIENCY}", latency)


FSDP_MESSAGE = 2**29  # bytes: about one unit's gather of a 7B-70B model, and the published figures' size


def probe_network(nodes: int, sizes: list[dict[str, Any]], ranks: int | None = None) -> Network | None:
    """An all-reduce probe (nccl-tests' per-size rows: size, algbw, time_us) as node-level throughput at
    the size nearest FSDP_MESSAGE (algbw x 2(N-1)/N), and its ring's step latency: the median time of the
    latency-bound rows over the all-reduce's 2(R-1) steps. None without usable rows; one node's probe
    measures no network (its throughput is not used), only its latency, and needs two ranks for it."""
    rows = [r for r in sizes if r.get("size") and r.get("algbw")]
    ranks = ranks or nodes
    if not rows or ranks < 2:
        return None
    small = sorted(r["time_us"] for r in rows if r["size"] <= LATENCY_MAX_BYTES and r.get("time_us"))
    latency = (small[len(small) // 2] * 1e-6 / (2 * (ranks - 1)) if small
               else INTER_NODE_STEP_S if nodes > 1 else INTRA_NODE_STEP_S)
    if nodes < 2:
        return Network(0.0, f"the study's all-reduce probe on one node ({ranks} ranks)", latency)
    row = min(rows, key=lambda r: abs(math.log(r["size"] / FSDP_MESSAGE)))
    return Network(row["algbw"] * 2 * (nodes - 1) / nodes,
                   f"the study's all-reduce probe at {nodes} nodes ({row['size'] / 2**20:.0f} MiB)", latency)


def probe_curve(kind: str, nodes: int, sizes: list[dict[str, Any]], source: str,
                ranks: int = 1) -> Curve | None:
    """An all-gather or reduce-scatter probe's bandwidth-bound rows per size: across nodes, node-level
    throughput (algbw x (N-1)/N, the bus bytes one node's adapters carry per byte of the tensor); on one
    node, the bus bandwidth among its `ranks` (algbw x (R-1)/R, the figure the GPUs' published one is).
    None on one rank or without such rows. Of several placements at one size, the slower."""
    over = nodes if nodes > 1 else ranks
    if over < 2:
        return None
    by_size: dict[int, float] = {}
    for r in sizes:
        if r.get("size", 0) > LATENCY_MAX_BYTES and r.get("algbw"):
            gbs = r["algbw"] * bus_factor(kind, over)
            by_size[r["size"]] = min(by_size.get(r["size"], gbs), gbs)
    return Curve(kind, tuple(sorted(by_size.items())), source) if by_size else None


def sweep_probes(sweep_dir: Any) -> dict[tuple[int, int], Network]:
    """The finished all-reduce probes of a sweep dir (a resumed or re-planned study) by (nodes, EFA)."""
    from bench.core import rundir
    return probes_of(rundir.read_summaries(sweep_dir))


def probes_of(summaries: Iterable[RunSummary]) -> dict[tuple[int, int], Network]:
    """The ok probes among summaries by (nodes, EFA): the all-reduce's Network, carrying the all-gather's
    and reduce-scatter's curves (one node's: among its ranks, Network.intra; where only those were probed,
    a Network whose all-reduce figure is NaN, which perf.Predictor.setting replaces); of several probes of one
    collective at one node and EFA count, the one over the most ranks (the longest ring)."""
    nets: dict[tuple[int, int], tuple[int, Network]] = {}
    curves: dict[tuple[int, int, str], tuple[int, Curve]] = {}
    for summary in summaries:
        spec = summary.spec
        if spec.kind != "nccl" or summary.status != "ok":
            continue
        key, sizes = (spec.nodes, spec.efa_per_node), summary.extra.get("sizes", [])
        if spec.collective == "all_reduce":
            network = probe_network(spec.nodes, sizes, spec.world_size)
            if network and (key not in nets or spec.world_size > nets[key][0]):
                nets[key] = (spec.world_size, network)
            continue
        where = f"at {spec.nodes} nodes, {spec.efa_per_node} EFA" if spec.nodes > 1 else "on one node"
        source = f"the study's {spec.collective} probe {where} ({spec.world_size} ranks)"
        curve = probe_curve(spec.collective, spec.nodes, sizes, source, spec.world_size)
        slot = (*key, spec.collective)
        if curve and (slot not in curves or spec.world_size > curves[slot][0]):
            curves[slot] = (spec.world_size, curve)
    out = {key: network for key, (_, network) in nets.items()}
    for (nodes, efa, _), (_, curve) in sorted(curves.items()):
        base = out.get((nodes, efa), Network(math.nan, ""))
        if nodes == 1:  # among one node's ranks
            out[(nodes, efa)] = replace(base, intra=base.intra + (curve,))
        else:
            out[(nodes, efa)] = replace(base, curves=base.curves + (curve,))
    return out
