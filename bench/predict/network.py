"""The network a run's collectives are predicted on: the cluster's fabric (its cluster file's, else the
published fabric of its instance type, else its GPU's board with its EFA adapters: `fabric_of`) as the run
uses it (`run_fabric`: the EFA adapters it was given), the NCCL version the study's runs recorded, and the
study's own probes, each of which calibrates NCCL's model of the fabric (bench/predict/nccl_fit.py
calibrate) on the shape it ran: every node count and size a run needs is then predicted by that model,
never read off a probe's row. Without a probe, the figures fitted to published nccl-tests tables of the
fabric's transport (DEFAULTS)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from bench.core.config import ClusterConfig
from bench.core.fabric import FABRICS, Fabric, ScaleOut, ScaleUp, gpu_node
from bench.core.hardware import GpuSpec
from bench.core.schema import RunSummary
from bench.predict.collective import Calibration
from bench.predict.comm import Network
from bench.predict.nccl_fit import calibrate

# 0 EFA on an EFA instance: NCCL's socket transport over one 100 Gb/s ENA port, at the share of line rate
# the published socket tables give (network.DEFAULTS["tcp"]: 2.5 GB/s a node, what two TCP flows at EC2's
# 10 Gb/s single-flow limit in a cluster placement group carry: EC2 user guide, "instance network
# bandwidth"); an assumption the study's own 0-EFA probe calibrates
SOCKETS = ScaleOut("tcp", 1, 100.0, rdma=False)

# Per transport, the latency of one network hop (in place of what the net plugin reports to NCCL's tuner)
# and the multi-node bandwidth's fraction of NCCL's model of it: fits to published nccl-tests tables
# (benchmarks/published/nccl-tests), not derivations. EFA, InfiniBand (its hop latency alone), Slingshot
# and TCPXO are what `python benchmarks/nccl_transports.py --fit` prints; RoCE and TCP are the first fit's.
# Why each is what it is, its loss on clusters left out of its fit (`--cv`) and its sensitivity:
# benchmarks/evidence/README.md, "NCCL's model against published tables". A transport not here (tcpx: no
# table below 1 MiB to fit its latency) keeps NCCL's published constants; a study's probes replace them.
DEFAULTS: dict[str, Calibration] = {
    transport: Calibration(net_latency_us=hop, net_bw=bw,
                           source=f"fitted to {n} published {transport} tables, not this cluster: its probes "
                                  "replace them")
    for transport, hop, bw, n in (("efa", 20.0, 0.6, 13), ("infiniband", 5.0, 1.0, 59),
                                  ("roce", 50.0, 0.95, 7), ("slingshot", 5.0, 0.75, 43),
                                  ("tcp", 25.0, 0.2, 4), ("tcpxo", 40.0, 0.9, 5))}


def fabric_of(cluster: ClusterConfig, gpu: GpuSpec | None) -> Fabric | None:
    """The cluster's fabric: its file's scale-up and scale-out parts (over its preset's, or its instance's
    published fabric), else that published fabric, else its GPU's board with efa_per_node EFA adapters at
    100 Gb/s (0: sockets). None without a GPU (a CPU study)."""
    conf = cluster.fabric
    base = FABRICS.get(conf.preset or cluster.instance_type)
    if conf.preset and base is None:
        raise ValueError(f"cluster.fabric.preset: {conf.preset!r} is none of {', '.join(sorted(FABRICS))}")
    if gpu is None or not gpu.compute_capability:
        return base
    if base is None:
        out = ScaleOut("efa", cluster.efa_per_node, 100.0, True) if cluster.efa_per_node else SOCKETS
        base = gpu_node(gpu.name, cluster.gpus_per_node, gpu.compute_capability, out, conf.pcie_gen)
    if conf.scale_up is None and conf.scale_out is None:
        return base
    up = conf.scale_up
    scale_up = (base.scale_up if up is None
                else ScaleUp(up.kind, up.gpus or cluster.gpus_per_node, up.gbs, up.nvls))
    out = conf.scale_out
    scale_out = base.scale_out if out is None else ScaleOut(out.transport, out.adapters, out.gbps, out.rdma,
                                                             out.latency_us, nic_path=out.nic_path)
    return replace(base, scale_up=scale_up, scale_out=scale_out, pcie_gen=conf.pcie_gen, cpu=conf.cpu,
                   name=f"{cluster.name}'s fabric", source=f"cluster file {cluster.name}")


def run_fabric(fabric: Fabric, efa: int) -> Fabric:
    """The fabric as a run uses it: on an EFA fabric `efa` of its adapters (0: NCCL's sockets over TCP);
    any other fabric whole."""
    out = fabric.scale_out
    if out is None or out.transport != "efa":
        return fabric
    if efa <= 0:
        return replace(fabric, scale_out=SOCKETS)
    return replace(fabric, scale_out=replace(out, adapters=min(efa, out.adapters)))


@dataclass(frozen=True)
class Probe:
    """A study's nccl-tests (or torch) probe of one collective: its shape and its rows."""

    kind: str
    nodes: int
    ranks: int
    efa: int
    rows: tuple[tuple[int, float], ...]  # (bytes, us) per size
    version: str | None  # the NCCL version it printed
    source: str

    @property
    def across(self) -> bool:
        return self.nodes > 1


def probe_of(summary: RunSummary) -> Probe | None:
    """An ok probe's rows (nccl-tests' out-of-place time per size), None without two of them."""
    spec = summary.spec
    rows = tuple(sorted((int(r["size"]), float(r["time_us"])) for r in summary.extra.get("sizes", [])
                        if r.get("size") and r.get("time_us")))
    if len(rows) < 2 or spec.world_size < 2:
        return None
    where = f"at {spec.nodes} nodes, {spec.efa_per_node} EFA" if spec.nodes > 1 else "on one node"
    version = summary.extra.get("nccl_version") or None
    return Probe(spec.collective, spec.nodes, spec.world_size, spec.efa_per_node, rows,
                 str(version) if version else None,
                 f"the study's {spec.collective} probe {where} ({spec.world_size} ranks)")


def probes_of(summaries: Iterable[RunSummary]) -> tuple[Probe, ...]:
    """The study's ok probes; of several of one collective at one node and EFA count, the one over the most
    ranks (the longest ring)."""
    best: dict[tuple[str, int, int], Probe] = {}
    for summary in summaries:
        if summary.spec.kind != "nccl" or summary.status != "ok":
            continue
        probe = probe_of(summary)
        key = (probe.kind, probe.nodes, probe.efa) if probe else None
        if probe and key and (key not in best or probe.ranks > best[key].ranks):
            best[key] = probe
    return tuple(best[k] for k in sorted(best))


def sweep_probes(sweep_dir: Any) -> tuple[Probe, ...]:
    """The finished probes of a sweep dir (a resumed or re-planned study)."""
    from bench.core import rundir
    return probes_of(rundir.read_summaries(sweep_dir))


def tuned(probe: Probe, fabric: Fabric) -> Calibration | None:
    """NCCL's model of `fabric` calibrated on one probe (None where the model cannot take its shape)."""
    ppn = probe.ranks // probe.nodes
    try:
        cal = calibrate(probe.kind, probe.rows, probe.nodes, ppn, run_fabric(fabric, probe.efa),
                        version=probe.version)
    except ValueError:
        return None
    return replace(cal, source=probe.source)


def nearest(probes: Iterable[Probe], nodes: int) -> dict[tuple[str, bool], Probe]:
    """Per collective and scope (one node, across nodes), the probe whose node count is nearest `nodes`."""
    out: dict[tuple[str, bool], Probe] = {}
    for p in probes:
        key = (p.kind, p.across)
        if key not in out or abs(p.nodes - nodes) < abs(out[key].nodes - nodes):
            out[key] = p
    return out


def read_at(cal: Calibration, probe: Probe, nodes: int) -> Calibration:
    """A probe's calibration as a run on `nodes` nodes reads it: one run across fewer nodes says so. Its
    figures speak for the node count it ran at: published tables calibrated at 2-8 nodes missed the mid-size
    collectives of 16-512 nodes 2-6x (benchmarks/evidence/README.md, "Calibrated at one node count")."""
    if not probe.across or nodes <= probe.nodes:
        return cal
    return replace(cal, source=f"{cal.source}, extrapolated to {nodes} nodes (no probe there)")


def network_for(fabric: Fabric | None, efa: int, nodes: int, probes: Iterable[Probe] = (),
                version: str | None = None) -> Network:
    """A run's network on `nodes` nodes with `efa` EFA adapters each: its fabric as the run uses it, NCCL
    calibrated by the study's probes at that EFA count (per collective, the probe nearest the run's node
    count; on one node and across nodes), else by the transport's published tables (DEFAULTS)."""
    if fabric is None:
        return Network(None, "no GPU network")
    mine = run_fabric(fabric, efa)
    at_efa = [p for p in probes if p.efa == efa or not p.across]
    tuning = tuple((kind, across, read_at(cal, p, nodes)) for (kind, across), p in
                   sorted(nearest(at_efa, nodes).items()) if (cal := tuned(p, fabric)) is not None)
    default = DEFAULTS.get(mine.scale_out.transport) if mine.scale_out else None
    if default is not None and not any(across for _, across, _ in tuning):
        tuning += (("all_reduce", True, default),)
    versions = {p.version for p in at_efa if p.version}
    found = version or (versions.pop() if len(versions) == 1 else None)
    return Network(mine, f"NCCL on {mine.describe()}", found, tuning)


def published(name: str, efa: int | None = None, nodes: int = 2) -> Network:
    """The network of a published fabric (bench/core/fabric.py FABRICS) with `efa` of its EFA adapters
    (None: all of them), no probe: what the plan predicts on before a study has probed."""
    fabric = FABRICS[name]
    adapters = fabric.scale_out.adapters if fabric.scale_out else 0
    return network_for(fabric, adapters if efa is None else efa, nodes)


def one_node(gpu: GpuSpec, gpus: int = 1) -> Network:
    """One node of `gpus` of a known GPU on its board, no network: this project's own GPU runs."""
    return network_for(gpu_node(gpu.name, gpus, gpu.compute_capability or 90, None), 0, 1)
