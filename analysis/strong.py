"""Strong scaling in the units a team sizing a training run decides in: at one global batch, per node count,
the time per optimizer step, days and dollars to train a token budget, and the knee past which another node
buys little.

At a fixed global batch every node count trains the same tokens per optimizer step, so scaling efficiency
at n nodes is (step time at base / step time at n) x base / n: the same number as the weak-scaling
definition on tokens/s, read on the time a team pays for. Where a node count has no ok run, its figures are
the plan's prediction (bench/predict/perf.py, recorded in the run's summary) and are marked as such.

The knee: going from n nodes to the next planned count n' saves T_n - T_n' of each step's time; linear
scaling would save T_n (1 - n/n'). Their ratio is the share of a linear gain that step buys (1: as much, 0:
nothing, below 0: slower). The knee is the first n whose next step buys less than `study.knee_share`; where
the next count is slower outright, the report says that instead of a negative share.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.scaling import CONFIG, configuration_label, node_count
from bench.core import rundir

COLUMNS = {"model": "model", "configuration": "configuration", "nodes": "nodes",
           "tokens_per_step": "tokens/step", "micro_batch": "micro batch", "grad_accum": "accumulation steps",
           "step_time_s": "step time (s)", "source": "source", "pred_step_time_s": "predicted step time (s)",
           "efficiency": "strong-scaling efficiency", "next_share": "next node count buys",
           "days_to_train": "days to train", "usd_to_train": "USD to train", "straggler": "straggler"}


def sweep_study(sweeps: list[Path]) -> dict[str, float]:
    """The study settings (train_tokens, knee_share) of the first sweep whose resolved config sets them."""
    for sweep in sweeps:
        try:
            study = (yaml.safe_load((sweep / rundir.SWEEP_CONFIG).read_text()) or {}).get("study")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(study, dict):
            return {k: float(v) for k, v in study.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {}


def strong_rows(agg: pd.DataFrame, prices: dict[str, float | None], train_tokens: float) -> pd.DataFrame:
    """One row per strong-scaling configuration and node count (see the module docstring)."""
    strong = agg[agg["global_batch"].fillna(0) > 0] if "global_batch" in agg else agg.iloc[0:0]
    rows = []
    for _, group in strong.groupby(CONFIG, dropna=False, sort=True):
        group = group.sort_values("nodes")
        measured = group["step_time_s"].notna()
        step = group["step_time_s"].where(measured, group["pred_step_time_s"]).astype(float)
        known = step.notna()
        if not known.any():
            continue
        base = group[known].iloc[0]
        base_step = step[known].iloc[0]
        nodes = group["nodes"].astype(float)
        tokens = group["global_batch"] * group["seq_len"]
        days = train_tokens / tokens * step / 86400
        price = group["cluster"].map(lambda c: prices.get(c)).astype(float)
        nxt_step, nxt_nodes = step.shift(-1), nodes.shift(-1)
        rows.append(pd.DataFrame({
            "model": group["model"], "configuration": group.apply(configuration_label, axis=1),
            "nodes": group["nodes"], "tokens_per_step": tokens, "micro_batch": group["micro_batch"],
            "grad_accum": group["grad_accum"], "step_time_s": step,
            "pred_step_time_s": group["pred_step_time_s"],
            "source": np.where(measured, "measured", np.where(known, "predicted", group["status"])),
            "efficiency": base_step / step * base["nodes"] / nodes,
            "next_share": (step - nxt_step) / (step * (1 - nodes / nxt_nodes)),
            "days_to_train": days, "usd_to_train": days * 24 * nodes * price,
            "straggler": group["straggler"] if "straggler" in group else None}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=list(COLUMNS))


def knee_sentences(rows: pd.DataFrame, train_tokens: float, knee_share: float) -> list[str]:
    """Per configuration: the node count to rent at this global batch, in days and dollars, and why."""
    out = []
    for (model, label), group in rows.groupby(["model", "configuration"], sort=False):
        group = group[group["step_time_s"].notna()].reset_index(drop=True)
        if group.empty:
            continue
        below = group.index[group["next_share"] < knee_share]
        at = group.loc[below[0]] if len(below) else group.iloc[-1]
        text = f"{model}, {label}: {_cost(at, train_tokens)}"
        if len(below):
            after = group.loc[below[0] + 1]
            if at["next_share"] < 0:
                text += f"; the next node count is slower at this global batch ({_cost(after, train_tokens)})"
            else:
                text += (f"; past {node_count(at['nodes'])} another node buys less than {knee_share:.0%} of the "
                         f"time linear scaling would save ({node_count(after['nodes'])} buy "
                         f"{at['next_share']:.0%}: {_cost(after, train_tokens)})")
        else:
            text += (f"; every step up to {node_count(at['nodes'])} buys at least {knee_share:.0%} of the time "
                     "linear scaling would save: the knee lies beyond the planned node counts")
        out.append(text)
    return out


def _cost(row: pd.Series, train_tokens: float) -> str:
    """"8 nodes train 1e+12 tokens in 12.3 days, $290,000 (predicted)"."""
    usd = f", ${row['usd_to_train']:,.0f}" if pd.notna(row["usd_to_train"]) else ""
    mark = " (predicted)" if row["source"] == "predicted" else ""
    verb = "trains" if row["nodes"] == 1 else "train"
    days = f"{row['days_to_train']:.1f} days"
    return f"{node_count(row['nodes'])} {verb} {train_tokens:.3g} tokens in {days}{usd}{mark}"

