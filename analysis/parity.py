"""Loss parity: runs that train the same model on the same data must show the same loss curve.

Sharding strategy, activation checkpointing and wrapping policy change where tensors live and what is
recomputed, not the mathematics, so within a group of runs equal in everything else (model, nodes, GPUs,
precision, micro batch, global batch, sequence length, seed, steps) every loss curve must match the
reference run's (FULL_SHARD first) to within a tolerance set by the precision's reduction-order noise.
A run that departs trains something else: a bug in the strategy, not a faster way to train the same model.
"""
from __future__ import annotations

import json

import pandas as pd

GROUP = ["sweep", "cluster", "model", "nodes", "gpus_per_node", "precision", "micro_batch", "global_batch",
         "seq_len", "seed", "steps"]  # the accumulation mode, like the strategy, changes no mathematics
PLAIN = {"sharding": "FULL_SHARD", "activation_checkpointing": "none", "wrap_policy": "transformer_block"}
# Max relative deviation from the reference curve: reduction-order noise of each precision.
TOLERANCE = {"fp32": 1e-3, "bf16_mixed": 2e-2, "fp16_mixed": 2e-2, "bf16_pure": 5e-2}
COLUMNS = ["model", "nodes", "precision", "reference", "run", "steps_compared", "max_rel_deviation",
           "tolerance", "verdict"]


def _losses(extra: object) -> list[float] | None:
    if not isinstance(extra, str):
        return None
    losses = json.loads(extra).get("losses")
    return [float(x) for x in losses] if losses else None


def _name(row: pd.Series) -> str:
    accumulation = f" {row['accumulation']}" if row.get("global_batch", 0) else ""
    return (f"{row['sharding']} AC={row['activation_checkpointing']} {row['wrap_policy']}{accumulation} "
            f"r{row['repeat']}")


def _plain_first(column: pd.Series) -> pd.Series:
    return column != PLAIN[column.name] if column.name in PLAIN else column


def max_rel_deviation(curve: list[float], reference: list[float]) -> float:
    """Largest |loss - reference| / |reference| over the steps both runs have."""
    pairs = list(zip(curve, reference))
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs) if pairs else float("nan")


def loss_parity(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run compared with its group's reference run; groups of one run are left out."""
    train = frame[(frame["kind"] == "train") & (frame["status"] == "ok")].copy()
    if train.empty or "extra" not in train:
        return pd.DataFrame(columns=COLUMNS)
    train["losses"] = train["extra"].map(_losses)
    train = train[train["losses"].notna()]
    rows = []
    for _, group in train.groupby(GROUP, dropna=False):
        if len(group) < 2:
            continue
        group = group.sort_values([*PLAIN, "repeat"], key=_plain_first)  # the reference: plain FULL_SHARD
        reference = group.iloc[0]
        tolerance = TOLERANCE.get(reference["precision"], 5e-2)
        for _, run in group.iloc[1:].iterrows():
            deviation = max_rel_deviation(run["losses"], reference["losses"])
            rows.append({"model": run["model"], "nodes": run["nodes"], "precision": run["precision"],
                         "reference": _name(reference), "run": _name(run),
                         "steps_compared": min(len(run["losses"]), len(reference["losses"])),
                         "max_rel_deviation": deviation, "tolerance": tolerance,
                         "verdict": "same curve" if deviation <= tolerance else "DEPARTS"})
    return pd.DataFrame(rows, columns=COLUMNS)


def departures(parity: pd.DataFrame) -> list[str]:
    """The runs whose loss curve departs from their reference, in words for the report's notes."""
    bad = parity[parity["verdict"] == "DEPARTS"]
    return [f"loss parity: {r['model']} {r['precision']} at {r['nodes']} node(s): {r['run']} departs from "
            f"{r['reference']} by {r['max_rel_deviation']:.2%} (tolerance {r['tolerance']:.1%})"
            for _, r in bad.iterrows()]
