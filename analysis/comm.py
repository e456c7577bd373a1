"""Communication model: the bytes FSDP moves per step, at the bandwidth the probes measured, against
the measured step time; each lost point of scaling efficiency is called communication-bound or not.

Per GPU and step, with P parameters, b_p bytes per gathered parameter (the compute dtype under mixed
precision) and b_g bytes per reduced gradient (the reduce dtype), W ranks, g GPUs per node, N nodes:

    FULL_SHARD     all-gather in forward and again in backward, reduce-scatter: (W-1)/W (2 P b_p + P b_g)
    SHARD_GRAD_OP  one all-gather, one reduce-scatter:                          (W-1)/W (P b_p + P b_g)
    NO_SHARD       all-reduce of the gradients:                                 2(W-1)/W P b_g
    HYBRID_SHARD   FULL_SHARD inside a node (g ranks), then an all-reduce of the node's shard across
                   nodes:                                   (g-1)/g (2 P b_p + P b_g) + 2(N-1)/N P b_g / g

These are "bus bytes" in nccl-tests' sense (ring algorithm traffic per rank), so dividing each
collective's share by its measured bus bandwidth gives the time if nothing overlapped: the all-gathers by
the study's all-gather probe, the reduce-scatters by its reduce-scatter probe (at the size closest to one
wrapped block's message in that collective's dtype), the all-reduces, and any collective the study did not
probe, by the all-reduce probe (at the size closest to one block's parameters in the compute dtype), for
the same node and EFA count; intra-node traffic uses the 1-node probes. `fed_by` says which fed each.

What each run got of the network (`achieved`): a run's per-step record of its collectives
(`trace_collectives`: kind -> bytes per step in nccl-tests' size convention, seconds per step and the
part of them before the last rank arrived, count, the group's ranks) as bus bandwidth, bytes / seconds
after the last arrival x the collective's bus factor over its group's ranks (a group of one rank sends
nothing: left out), against the probe of the same collective (else the all-reduce's) placed as the group
is, read at one call's size (`probe_at`), per run and node count; a share above 100% is said to be one,
with why.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.scaling import CONFIG
from bench.core.config import ConfigError
from bench.core.flops import COMPUTE_BYTES, REDUCE_BYTES  # gathered in the compute dtype, reduced in fp32
from bench.core.models import ModelArch, ModelError, arch_of, count_params
from bench.predict import census

COMM_BOUND = 0.9  # modelled comm time >= 90% of the step: nothing left to hide it behind
EXPLAINED = 0.5  # comm growth covers >= half of the step-time growth


def bus_bytes(sharding: str, precision: str, params: int, nodes: int,
              gpus_per_node: int) -> tuple[float, float]:
    """(intra-node, inter-node-or-world) bus bytes per GPU per step; the first is non-zero for HYBRID only."""
    w, g, n = nodes * gpus_per_node, gpus_per_node, nodes
    bp, bg = COMPUTE_BYTES[precision] * params, REDUCE_BYTES[precision] * params
    if sharding == "FULL_SHARD":
        return 0.0, (w - 1) / w * (2 * bp + bg)
    if sharding == "SHARD_GRAD_OP":
        return 0.0, (w - 1) / w * (bp + bg)
    if sharding == "NO_SHARD":
        return 0.0, 2 * (w - 1) / w * bg
    if sharding == "HYBRID_SHARD":
        return (g - 1) / g * (2 * bp + bg), 2 * (n - 1) / n * bg / g
    raise ValueError(f"unknown sharding {sharding!r}")


def bus_bytes_by_kind(sharding: str, precision: str, params: int, nodes: int,
                      gpus_per_node: int) -> dict[tuple[str, str], float]:
    """bus_bytes split by collective: {(kind, "intra" or "world"): bus bytes per GPU per step}."""
    w, g, n = nodes * gpus_per_node, gpus_per_node, nodes
    bp, bg = COMPUTE_BYTES[precision] * params, REDUCE_BYTES[precision] * params
    if sharding in ("FULL_SHARD", "SHARD_GRAD_OP"):
        gathers = 2 if sharding == "FULL_SHARD" else 1
        return {("all_gather", "world"): (w - 1) / w * gathers * bp,
                ("reduce_scatter", "world"): (w - 1) / w * bg}
    if sharding == "NO_SHARD":
        return {("all_reduce", "world"): 2 * (w - 1) / w * bg}
    if sharding == "HYBRID_SHARD":
        return {("all_gather", "intra"): (g - 1) / g * 2 * bp, ("reduce_scatter", "intra"): (g - 1) / g * bg,
                ("all_reduce", "world"): 2 * (n - 1) / n * bg / g}
    raise ValueError(f"unknown sharding {sharding!r}")


def busbw_at(sizes: pd.DataFrame, nodes: int, efa: float, message_bytes: float,
             collective: str = "all_reduce") -> float | None:
    """Measured busbw (GB/s) of `collective` at the probed size closest (log scale) to message_bytes."""
    if "collective" in sizes:
        sizes = sizes[sizes["collective"] == collective]
    elif collective != "all_reduce":
        return None
    rows = sizes[(sizes["nodes"] == nodes) & ((sizes["efa_per_node"] == efa) | pd.isna(efa))]
    rows = rows[(rows["size_bytes"] > 0) & (rows["busbw_gbs"] > 0)]
    if rows.empty:
        return None
    distance = (np.log(rows["size_bytes"].astype(float)) - math.log(max(message_bytes, 1.0))).abs()
    return float(rows.loc[distance.idxmin(), "busbw_gbs"])


def _arch(row: pd.Series) -> ModelArch | None:
    """The row's architecture; a brought family with no formula from its census (the planner's cache, else
    counted now), None where it cannot be counted here (no torch where the report runs)."""
    config = row.get("model_config")
    config = config if isinstance(config, str) else ""
    try:
        census.ensure(row["model"], config)
        return arch_of(row["model"], config)
    except (ConfigError, ModelError):
        return None


KIND_BUSBW = {"all_gather": "busbw_all_gather_gbs", "reduce_scatter": "busbw_reduce_scatter_gbs",
              "all_reduce": "busbw_all_reduce_gbs"}  # comm_model's column of each collective's figure


def _probed(sizes: pd.DataFrame, kind: str, nodes: int, efa: float, message: float,
            fallback_message: float) -> tuple[float | None, str]:
    """A collective's bus bandwidth and which probe gave it: its own at its own message size, else the
    all-reduce probe's at one block's parameters in the compute dtype."""
    own = busbw_at(sizes, nodes, efa, message, kind) if kind != "all_reduce" else None
    if own is not None:
        return own, f"{kind} probe"
    bw = busbw_at(sizes, nodes, efa, fallback_message)
    return bw, "all_reduce probe" + ("" if kind == "all_reduce" else f" (no {kind} probe)")


def _model_row(row: pd.Series, sizes: pd.DataFrame) -> dict[str, object]:
    arch = _arch(row)
    if arch is None:
        return {"comm_gb_per_gpu": float("nan"), "busbw_gbs": float("nan"), "comm_s": float("nan")}
    params = count_params(arch)
    nodes, gpn, efa = int(row["nodes"]), int(row["gpus_per_node"]), row["efa_per_node"]
    block = params / max(arch.blocks, 1)
    messages = {"all_gather": block * COMPUTE_BYTES[row["precision"]],
                "reduce_scatter": block * REDUCE_BYTES[row["precision"]]}
    out: dict[str, object] = {}
    fed, seconds, world_bytes, world_s = [], 0.0, 0.0, 0.0
    legs = bus_bytes_by_kind(row["sharding"], row["precision"], params, nodes, gpn)
    for (kind, leg), nbytes in legs.items():
        if not nbytes:
            continue
        at = nodes if leg == "world" else 1
        gather = messages["all_gather"]
        bw, source = _probed(sizes, kind, at, efa, messages.get(kind, gather), gather)
        out[KIND_BUSBW[kind]] = bw
        fed.append(f"{kind.replace('_', '-')}: {source} at {at} node{'s' * (at > 1)}")
        if bw is None or seconds != seconds:
            seconds = float("nan")
            continue
        seconds += nbytes / (bw * 1e9)
        if leg == "world":
            world_bytes, world_s = world_bytes + nbytes, world_s + nbytes / (bw * 1e9)
    intra, world = bus_bytes(row["sharding"], row["precision"], params, nodes, gpn)
    effective = world_bytes / world_s / 1e9 if world_s else (
        next((v for v in out.values() if v is not None), None) if intra else None)
    return {**out, "comm_gb_per_gpu": (intra + world) / 1e9, "busbw_gbs": effective, "comm_s": seconds,
            "fed_by": "; ".join(fed) or None}


def comm_model(agg: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and node count: modelled comm time beside the measured step time, and a verdict."""
    train = agg[agg["step_time_s"].notna()].copy()
    if train.empty:
        return pd.DataFrame()
    train = train.join(pd.DataFrame([_model_row(r, sizes) for _, r in train.iterrows()], index=train.index))
    train["comm_fraction"] = train["comm_s"] / train["step_time_s"]
    # Each configuration's base is the one scaling efficiency uses (aggregate() set base_nodes).
    base = train[train["nodes"] == train["base_nodes"]][[*CONFIG, "step_time_s", "comm_s"]]
    train = train.merge(base, on=CONFIG, how="left", suffixes=("", "_base"))
    train["lost_s"] = train["step_time_s"] - train["step_time_s_base"]
    train["comm_growth_s"] = train["comm_s"] - train["comm_s_base"]
    train["verdict"] = [verdict(r.comm_fraction, r.lost_s, r.comm_growth_s, r.nodes == r.base_nodes)
                        for r in train.itertuples()]
    return train


def verdict(comm_fraction: float, lost_s: float, grew_s: float, is_base: bool) -> str:
    """Why this point lost efficiency against its base node count, in words."""
    if pd.isna(comm_fraction):
        return "no probe at this node/EFA count: cannot tell"
    if comm_fraction >= COMM_BOUND:
        return "communication-bound (modelled comm >= 90% of the step)"
    if is_base:
        return "base"
    if lost_s <= 0:
        return "no efficiency lost"
    if pd.notna(grew_s) and grew_s >= EXPLAINED * lost_s:
        return f"communication-bound ({min(grew_s / lost_s, 1):.0%} of the lost time is slower collectives)"
    return "not communication-bound (collectives explain little of the lost time)"


# RunSummary.trace_collectives kinds (the worker's trace) -> the collective the probes measure
TRACE_KINDS = {"all_gather_fwd": "all_gather", "all_gather_bwd": "all_gather",
               "reduce_scatter": "reduce_scatter", "all_reduce": "all_reduce"}
TRACE_LABELS = {"all_gather_fwd": "forward all-gathers", "all_gather_bwd": "backward all-gathers",
                "reduce_scatter": "reduce-scatters", "all_reduce": "all-reduces"}


def trace_collectives(row: pd.Series | dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A run's `trace_collectives` (a dict, or the JSON the results table holds), else the one in its extra;
    empty where the run has none."""
    value = row.get("trace_collectives")
    if isinstance(value, str) and value:
        value = json.loads(value)
    if not isinstance(value, dict):
        extra = row.get("extra")
        if isinstance(extra, str) and extra:
            extra = json.loads(extra)
        extra = extra if isinstance(extra, dict) else {}
        value = extra.get("trace_collectives") or {}
    return value


def group_shape(sharding: str, kind: str, nodes: int, gpus_per_node: int) -> tuple[int, int]:
    """The nodes one group of a collective spans and its ranks on each (trainer/parallel.py's meshes):
    HYBRID_SHARD gathers and reduces within a node and all-reduces across nodes, one rank on each; the
    other strategies span every rank."""
    if sharding == "HYBRID_SHARD":
        return (nodes, 1) if kind == "all_reduce" else (1, gpus_per_node)
    return nodes, gpus_per_node


def group_ranks(sharding: str, kind: str, nodes: int, gpus_per_node: int) -> int:
    """Ranks of one group of a collective (group_shape)."""
    spanned, per_node = group_shape(sharding, kind, nodes, gpus_per_node)
    return spanned * per_node


def probe_curves(frame: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
    """Each probe's bus bandwidth per size by collective and placement (nodes, GPUs per node, EFA), the
    median over its repeats; `sizes` (analysis.scaling.nccl_sizes: no GPUs per node) where the frame holds
    no probe run's sizes."""
    rows = []
    probes = frame[(frame["kind"] == "nccl") & (frame["status"] == "ok")] if "kind" in frame else frame[:0]
    for _, r in probes.iterrows():
        extra = json.loads(r["extra"]) if isinstance(r.get("extra"), str) else r.get("extra") or {}
        rows += [{"collective": r.get("collective") or "all_reduce", "nodes": r["nodes"],
                  "gpus_per_node": r["gpus_per_node"], "efa_per_node": r["efa_per_node"],
                  "size_bytes": s["size"], "busbw_gbs": s["busbw"]} for s in extra.get("sizes", [])]
    if not rows:
        return sizes.assign(gpus_per_node=np.nan)
    keys = ["collective", "nodes", "gpus_per_node", "efa_per_node", "size_bytes"]
    return pd.DataFrame(rows).groupby(keys, as_index=False, dropna=False)["busbw_gbs"].median()


def probe_at(curves: pd.DataFrame, collective: str, nodes: int, per_node: int, efa: float,
             message_bytes: float) -> tuple[float | None, str | None]:
    """A probe's bus bandwidth (GB/s) for one call of `message_bytes` of `collective` over a group of
    `nodes` x `per_node` ranks, and the probe's placement: the probe of that collective so placed (else
    across as many nodes, else of as many ranks placed otherwise), read at the message size on its curve made
    non-decreasing in size (log-linear between the sizes around it): on one transport a larger message is
    not slower per byte, so a size read below a smaller one's is the probe's noise (the torch probe times
    a few calls a size; on shared CPU cores they scatter)."""
    rows = curves[(curves["collective"] == collective) & (curves["busbw_gbs"] > 0)
                  & (curves["size_bytes"] > 0) & ((curves["efa_per_node"] == efa) | pd.isna(efa))]
    ranks = rows["nodes"] * rows["gpus_per_node"]
    for pick in ((rows["nodes"] == nodes) & (rows["gpus_per_node"] == per_node), rows["nodes"] == nodes,
                 ranks == nodes * per_node):
        if not pick.any():
            continue
        found = rows[pick]
        apart = (found["gpus_per_node"] - per_node).abs().fillna(0)  # the closest placement of those
        (probe_nodes, probe_gpn), curve = next(iter(found[apart == apart.min()].groupby(
            ["nodes", "gpus_per_node"], dropna=False)))
        curve = curve.sort_values("size_bytes")
        size = np.log(curve["size_bytes"].to_numpy(float))
        busbw = np.maximum.accumulate(curve["busbw_gbs"].to_numpy(float))
        placed = f"{int(probe_nodes)} node{'s' * (probe_nodes > 1)}" + (
            f" x {int(probe_gpn)}" if pd.notna(probe_gpn) else "")
        return float(np.interp(math.log(max(message_bytes, 1.0)), size, busbw)), placed
    return None, None


def _seconds(rec: dict[str, Any]) -> float:
    """A kind's seconds per step in flight after the last rank arrived (its waits for a peer taken out,
    where the trace read them): the time the probe's barrier-started calls compare with."""
    secs = rec.get("s") or 0.0
    return secs - (rec.get("wait_s") or 0.0) if (rec.get("wait_s") or 0.0) < secs else secs


def achieved(frame: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
    """Per training run and collective kind of a group of two ranks or more: the bus bandwidth the run's
    collectives reached (bytes per step / seconds per step after the last rank arrived x the bus factor
    over the group's ranks) against the probe of the same collective (else the all-reduce's) over a group
    placed alike, read at one call's bytes (probe_at), and the share."""
    rows = []
    curves = probe_curves(frame, sizes)
    train = frame[(frame["kind"] == "train") & (frame["status"] == "ok")] if "kind" in frame else frame
    for _, r in train.iterrows():
        for kind, rec in sorted(trace_collectives(r).items()):
            collective = TRACE_KINDS.get(kind)
            nbytes, secs, count = rec.get("bytes") or 0, _seconds(rec), rec.get("count") or 0
            if collective is None or nbytes <= 0 or secs <= 0 or count <= 0:
                continue
            nodes, gpn = int(r["nodes"]), int(r["gpus_per_node"])
            spanned, per_node = group_shape(r["sharding"], collective, nodes, gpn)
            ranks = rec.get("ranks") or spanned * per_node
            if ranks <= 1:  # a group of one rank sends nothing: no bandwidth to speak of
                continue
            factor = (2 if collective == "all_reduce" else 1) * (ranks - 1) / ranks
            got = nbytes / secs / 1e9 * factor
            probe, placed = probe_at(curves, collective, spanned, per_node, r["efa_per_node"], nbytes / count)
            source = f"{collective} probe"
            if probe is None and collective != "all_reduce":
                probe, placed = probe_at(curves, "all_reduce", spanned, per_node, r["efa_per_node"],
                                         nbytes / count)
                source = "all_reduce probe"
            rows.append({"sweep": r.get("sweep"), "run_id": r.get("run_id"), "model": r.get("model"),
                         "sharding": r["sharding"], "nodes": nodes, "efa_per_node": r["efa_per_node"],
                         "kind": kind, "ranks": ranks, "message_bytes": nbytes / count,
                         "achieved_busbw_gbs": got, "probe_busbw_gbs": probe,
                         "share": got / probe if probe else float("nan"),
                         "probe": source if probe else "no probe at this node/EFA count",
                         "probe_placement": placed})
    return pd.DataFrame(rows)


# why a collective can pass its probe, said where it does: what each of the two clocks times
ABOVE_PROBE = ("above the probe: the trace times each call from the last rank's arrival to its end on the "
               "transport's own thread or kernel, the probe each whole call as its harness clocks it")


def _above(shares: pd.Series) -> str:
    """Where a node count's runs passed their probe: that they did, and why that can be."""
    above = int((shares > 1).sum())
    if shares.median() > 1:
        return f": {ABOVE_PROBE}"
    return f"; {above} of them {ABOVE_PROBE}" if above else ""


def achieved_sentences(table: pd.DataFrame) -> list[str]:
    """Per node count and collective kind, the median share over the runs, bandwidths to three significant
    figures: "the 16-node runs' reduce-scatters reached 71% of the probe (2 runs; 31.2 of 43.9 GB/s bus
    bandwidth, reduce_scatter probe over 16 nodes x 8)", and why where the share, or a run's, passes 100%."""
    if table.empty:
        return []
    out = []
    known = table[table["share"].notna()]
    for (nodes, kind), g in known.groupby(["nodes", "kind"], sort=True):
        runs, share = g["run_id"].nunique(), g["share"].median()
        out.append(f"the {int(nodes)}-node runs' {TRACE_LABELS[kind]} reached {share:.0%} of the probe "
                   f"({runs} run{'s' * (runs > 1)}; {g['achieved_busbw_gbs'].median():.3g} of "
                   f"{g['probe_busbw_gbs'].median():.3g} GB/s bus bandwidth, {g['probe'].iloc[0]}"
                   + (f" over {g['probe_placement'].iloc[0]}" if isinstance(g['probe_placement'].iloc[0], str)
                      else "") + ")" + _above(g["share"]))
    return out
