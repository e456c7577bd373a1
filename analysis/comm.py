"""Communication model: the bytes FSDP moves per step, at the bandwidth the probes measured, against
the measured step time; each lost point of scaling efficiency is called communication-bound or not.

Per GPU and step, with P parameters, b_p bytes per gathered parameter (the compute dtype under mixed
precision) and b_g bytes per reduced gradient (the reduce dtype), W ranks, g GPUs per node, N nodes:

    FULL_SHARD     all-gather in forward and again in backward, reduce-scatter: (W-1)/W (2 P b_p + P b_g)
    SHARD_GRAD_OP  one all-gather, one reduce-scatter:                          (W-1)/W (P b_p + P b_g)
    NO_SHARD       all-reduce of the gradients:                                 2(W-1)/W P b_g
    HYBRID_SHARD   FULL_SHARD inside a node (g ranks), then an all-reduce of the node's shard across
                   nodes:                                   (g-1)/g (2 P b_p + P b_g) + 2(N-1)/N P b_g / g

These are "bus bytes" in nccl-tests' sense (ring algorithm traffic per rank), so dividing by the measured
all-reduce bus bandwidth (at the message size closest to one wrapped block's parameters, for the same
node and EFA count) gives the time if nothing overlapped; intra-node traffic uses the 1-node probe.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.scaling import CONFIG
from bench.core.flops import COMPUTE_BYTES, REDUCE_BYTES  # gathered in the compute dtype, reduced in fp32
from bench.core.config import ConfigError
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


def busbw_at(sizes: pd.DataFrame, nodes: int, efa: float, message_bytes: float) -> float | None:
    """Measured all-reduce busbw (GB/s) at the probed size closest (log scale) to message_bytes."""
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


def _model_row(row: pd.Series, sizes: pd.DataFrame) -> dict[str, object]:
    arch = _arch(row)
    if arch is None:
        return {"comm_gb_per_gpu": float("nan"), "busbw_gbs": float("nan"), "comm_s": float("nan")}
    params = count_params(arch)
    nodes, gpn = int(row["nodes"]), int(row["gpus_per_node"])
    intra, world = bus_bytes(row["sharding"], row["precision"], params, nodes, gpn)
    block_message = params / max(arch.blocks, 1) * COMPUTE_BYTES[row["precision"]]
    bw_world = busbw_at(sizes, nodes, row["efa_per_node"], block_message) if world else None
    bw_intra = busbw_at(sizes, 1, row["efa_per_node"], block_message) if intra else None
    legs = [(nbytes, bw) for nbytes, bw in ((world, bw_world), (intra, bw_intra)) if nbytes]
    seconds = (float("nan") if any(bw is None for _, bw in legs)
               else sum((nbytes / (bw * 1e9) for nbytes, bw in legs), 0.0))
    return {"comm_gb_per_gpu": (intra + world) / 1e9, "busbw_gbs": bw_world if world else bw_intra,
            "comm_s": seconds}


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
