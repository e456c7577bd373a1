"""Where each step went, from the runs' own profiler traces (trainer/trace.py -> RunSummary.trace_split),
and the efficiency lost from a configuration's smallest to its largest node count in those parts.

A trace records a few steps after the timed ones, slower under the profiler; a run's parts are each part's
share of its profiled step times its measured (unprofiled) step time. Per-GPU efficiency between node
counts is (W_n / t_n) / (W_0 / t_0), W the tokens a GPU trains per step (equal in weak scaling, fewer in
strong); so the points lost, 1 - efficiency, are the sum over parts of (p_n - (W_n / W_0) p_0) / t_n: the
parts of the lost points add up to it exactly.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.scaling import CONFIG, describe, node_count, train_rows

PARTS = ("compute", "exposed_all_gather_fwd", "exposed_all_gather_bwd", "exposed_reduce_scatter",
         "exposed_all_reduce", "waiting", "optimizer", "other")
LABELS = {"compute": "compute", "exposed_all_gather_fwd": "exposed all-gather (forward)",
          "exposed_all_gather_bwd": "exposed all-gather (backward)",
          "exposed_reduce_scatter": "exposed reduce-scatter", "exposed_all_reduce": "exposed all-reduce",
          "waiting": "waiting for a peer", "optimizer": "optimizer", "other": "other (host, data, idle)"}
COLUMNS = {"model": "model", "sharding": "sharding", "batch": "batch", "nodes": "nodes",
           "step_time_s": "step (s)", **{p: f"{LABELS[p]} (s)" for p in PARTS},
           "exposed_comm_s": "exposed comm. measured (s)",
           "pred_exposed_comm_s": "exposed comm. predicted (s)",
           "exposed_comm_error": "predicted / measured - 1", "traced_runs": "traced runs"}


def trace_split(cell: Any) -> dict[str, float] | None:
    """A results-table cell of trace_split (JSON text, or a dict) as a dict; None where the run has none."""
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except ValueError:
            return None
    return cell if isinstance(cell, dict) and all(k in cell for k in PARTS) else None


def run_parts(split: dict[str, float], step_time_s: float) -> dict[str, float] | None:
    """Each part's share of the profiled step, times the measured step."""
    total = sum(split[k] for k in PARTS)
    if total <= 0 or not np.isfinite(step_time_s):
        return None
    return {k: split[k] * step_time_s / total for k in PARTS}


def split_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration and node count with a traced ok run: the median of each part over its
    repeats, the measured exposed communication (the exposed parts; waiting apart) beside the model's."""
    if "trace_split" not in frame:
        return pd.DataFrame()
    train = train_rows(frame)
    rows = []
    for _, run in train[train["status"] == "ok"].iterrows():
        split = trace_split(run["trace_split"])
        parts = run_parts(split, float(run["step_time_s"])) if split else None
        if parts is None:
            continue
        tokens = run["tokens_per_s_per_gpu"] * run["step_time_s"]  # per GPU per step
        rows.append({**{c: run.get(c) for c in (*CONFIG, "nodes", "pred_exposed_comm_s", "slowest_node")},
                     **parts, "step_time_s": run["step_time_s"], "tokens_per_gpu_step": tokens})
    if not rows:
        return pd.DataFrame()
    runs = pd.DataFrame(rows)
    keys = [*CONFIG, "nodes"]
    numbers = [*PARTS, "step_time_s", "tokens_per_gpu_step", "pred_exposed_comm_s"]
    table = runs.groupby(keys, dropna=False).agg(
        **{c: (c, "median") for c in numbers}, traced_runs=("step_time_s", "count"),
        slowest_node=("slowest_node", "first")).reset_index()
    table["exposed_comm_s"] = table[[p for p in PARTS if p.startswith("exposed_")]].sum(axis=1)
    table["exposed_comm_error"] = table["pred_exposed_comm_s"] / table["exposed_comm_s"] - 1
    return table.sort_values(keys, ignore_index=True)


def _rounded(points: dict[str, float], total: int) -> dict[str, int]:
    """Whole points per part that add up to the rounded total (largest remainders)."""
    floors = {k: int(np.floor(v)) for k, v in points.items()}
    left = total - sum(floors.values())
    order = sorted(points, key=lambda k: points[k] - floors[k], reverse=left > 0)
    for k in order[:abs(left)]:
        floors[k] += 1 if left > 0 else -1
    return floors


def lost_points(base: pd.Series, top: pd.Series) -> tuple[float, dict[str, float]]:
    """1 - efficiency from base to top in points, and per part (module docstring); they add up."""
    work = top["tokens_per_gpu_step"] / base["tokens_per_gpu_step"]
    parts = {k: 100 * (top[k] - work * base[k]) / top["step_time_s"] for k in PARTS}
    return 100 * (1 - work * base["step_time_s"] / top["step_time_s"]), parts


def lost_sentences(table: pd.DataFrame) -> list[str]:
    """Per configuration traced at two node counts or more: where the points lost from the smallest to the
    largest went, e.g. "from 1 to 16 nodes 13 points lost: 9 exposed reduce-scatter, 3 waiting for
    node7, 1 other"."""
    out = []
    for key, group in table.groupby(CONFIG, dropna=False):
        if group["nodes"].nunique() < 2:
            continue
        base, top = group.loc[group["nodes"].idxmin()], group.loc[group["nodes"].idxmax()]
        lost, parts = lost_points(base, top)
        whole = _rounded(parts, round(lost))
        named = {k: v for k, v in sorted(whole.items(), key=lambda kv: -abs(kv[1])) if v}
        peer = f"waiting for {top['slowest_node']}" if isinstance(top["slowest_node"], str) else None
        words = [f"{v} {peer if k == 'waiting' and peer else LABELS[k]}" for k, v in named.items()]
        verb = "lost" if round(lost) >= 0 else "gained"
        out.append(f"{describe(dict(zip(CONFIG, key)))}: from {node_count(base['nodes'])} to "
                   f"{node_count(top['nodes'])} {abs(round(lost))} points of per-GPU efficiency {verb}"
                   + (f": {', '.join(words)}" if words else "") + " (measured in each run's trace)")
    return out


def split_chart(table: pd.DataFrame) -> Figure | None:
    """The step of each configuration and node count, stacked in its parts (seconds)."""
    if table.empty:
        return None
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    labels = [f"{describe(dict(zip(CONFIG, (r[c] for c in CONFIG))))}\n{node_count(r['nodes'])}"
              for _, r in table.iterrows()]
    bottom = np.zeros(len(table))
    for part in PARTS:
        values = table[part].to_numpy(dtype=float)
        ax.bar(range(len(table)), values, bottom=bottom, label=LABELS[part])
        bottom += values
    ax.set_xticks(range(len(table)), labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("seconds per step")
    ax.set_title("Where the step went (each run's profiler trace, scaled to its measured step)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    return fig
