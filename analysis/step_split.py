"""Where each step went, from the runs' own profiler traces (trainer/trace.py -> RunSummary.trace_split),
and the efficiency lost from a configuration's smallest to its largest node count in those parts.

A trace records a few steps after the timed ones, slower under the profiler; a run's parts are each part's
share of its profiled step times its measured (unprofiled) step time. Per-GPU efficiency between node
counts is (W_n / t_n) / (W_0 / t_0), W the tokens a GPU trains per step (equal in weak scaling, fewer in
strong); so the points lost, 1 - efficiency, are the sum over parts of (p_n - (W_n / W_0) p_0) / t_n: the
parts of the lost points add up to it exactly.

Waiting is read from arrival times where a collective's group shares one host clock, else by the duration
rule (trainer/trace_waits.py set_waits); the table keeps the duration rule's reading beside it and says
where the two are apart or the durations contradict the rule's premise.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from analysis.scaling import CONFIG, configuration_label, describe, node_count, spec_of, train_rows
from bench.predict.comm import EXPOSED_PARTS
from bench.predict.split import (
    LABELS,
    PARTS,
    Split,
    lost_points,
    noise,
    same_work_pairs,
    words,
)

# older summaries (before FSDP's copies were a part of their own: they were in the exposed parts)
ADDED_PARTS = ("collective_copies",)
# readings beside the parts, scaled with them: waiting by the duration rule, and the seconds the two
# readings differ by on the collectives that contradict the rule's premise
SCALED_READINGS = ("waiting_duration_rule", "premise_at_stake_s")
# the report marks a row whose two readings of waiting differ by more than this share of its step
READINGS_APART = 0.02


def trace_split(cell: Any) -> dict[str, float] | None:
    """A results-table cell of trace_split (JSON text, or a dict) as a dict; None where the run has none."""
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except ValueError:
            return None
    if not isinstance(cell, dict) or not all(k in cell for k in PARTS if k not in ADDED_PARTS):
        return None
    return {**dict.fromkeys(ADDED_PARTS, 0.0), **cell}


def run_parts(split: dict[str, float], step_time_s: float) -> dict[str, float] | None:
    """Each part's share of the profiled step, times the measured step; the readings beside the parts
    scaled alike, and the premise's counts as they are (NaN where the run has none)."""
    total = sum(split[k] for k in PARTS)
    if total <= 0 or not np.isfinite(step_time_s):
        return None
    scale = step_time_s / total
    return {**{k: split[k] * scale for k in PARTS},
            **{k: split[k] * scale if k in split else np.nan for k in SCALED_READINGS},
            **{k: split.get(k, np.nan) for k in ("premise_checked", "premise_contradicted")}}


def traced_runs(frame: pd.DataFrame) -> Iterator[tuple[pd.Series, dict[str, float]]]:
    """Each ok training run with a readable trace, and its parts scaled to its measured step (run_parts)."""
    if "trace_split" not in frame:
        return
    train = train_rows(frame)
    for _, run in train[train["status"] == "ok"].iterrows():
        split = trace_split(run["trace_split"])
        if split and (parts := run_parts(split, float(run["step_time_s"]))) is not None:
            yield run, parts


def split_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration and node count with a traced ok run: the median of each part over its
    repeats, the measured exposed communication (the exposed parts; waiting apart) beside the model's,
    waiting by the duration rule beside the split's, and where the two readings differ by more than
    READINGS_APART of the step or the durations contradict the rule's premise, a mark saying so."""
    rows = []
    for run, parts in traced_runs(frame):
        tokens = run["tokens_per_s_per_gpu"] * run["step_time_s"]  # per GPU per step
        rows.append({**{c: run.get(c) for c in (*CONFIG, "nodes", "pred_exposed_comm_s", "slowest_node",
                                                 "straggler", "run_dir")},
                     **parts, "step_time_s": run["step_time_s"], "tokens_per_gpu_step": tokens})
    if not rows:
        return pd.DataFrame()
    runs = pd.DataFrame(rows)
    keys = [*CONFIG, "nodes"]
    numbers = [*PARTS, *SCALED_READINGS, "step_time_s", "tokens_per_gpu_step", "pred_exposed_comm_s"]
    table = runs.groupby(keys, dropna=False).agg(
        **{c: (c, "median") for c in numbers}, traced_runs=("step_time_s", "count"),
        slowest_node=("slowest_node", "first"), straggler=("straggler", "first"),
        run_dir=("run_dir", "first"), premise_checked=("premise_checked", "max"),
        premise_contradicted=("premise_contradicted", "max")).reset_index()
    table["exposed_comm_s"] = table[[p for p in PARTS if p.startswith("exposed_")]].sum(axis=1)
    table["exposed_comm_error"] = table["pred_exposed_comm_s"] / table["exposed_comm_s"] - 1
    table["duration_rule"] = [duration_rule(r) for _, r in table.iterrows()]
    return table.sort_values(keys, ignore_index=True)


def duration_rule(row: pd.Series) -> str | None:
    """What a row's duration rule says beside the waiting it shows: where the two readings are apart (by
    more than READINGS_APART of the step) or the durations contradict the rule's premise, by how much and
    on how many of the collectives read on a shared clock; else nothing (None where a run has no reading)."""
    if pd.isna(row["waiting_duration_rule"]):
        return None
    apart = abs(row["waiting"] - row["waiting_duration_rule"]) / row["step_time_s"]
    checked, contradicted = row["premise_checked"], row["premise_contradicted"]
    if (pd.isna(checked) or checked == 0) and row["waiting"] == row["waiting_duration_rule"] == 0:
        return None  # nothing waited by either reading (a run of one rank, or of groups of one)
    if pd.isna(checked) or checked == 0:
        return "not checked: no shared clock (waiting is the duration rule's)"
    if apart <= READINGS_APART and not contradicted:
        return "agrees"
    return (f"{'apart by' if apart > READINGS_APART else 'within'} {apart:.1%} of the step; premise "
            f"contradicted on {int(contradicted)} of {int(checked)} collectives "
            f"({1e3 * row['premise_at_stake_s']:.3g} ms at stake)")


def noise_sentence(frame: pd.DataFrame) -> str | None:
    """How far apart the study's traced runs of the same work read, part by part (bench/predict/split.py
    same_work, noise: each as the other's prediction), so that a reader can tell a difference between rows
    from the trace's own noise; None without two such runs."""
    pairs = same_work_pairs((spec, {**{k: parts[k] for k in PARTS},
                                    "exposed": sum(parts[k] for k in EXPOSED_PARTS)})
                            for run, parts in traced_runs(frame) if (spec := spec_of(run)) is not None)
    if not pairs:
        return None
    found = noise(pairs)

    def apart(k: str) -> str:
        return f"{statistics.median(map(abs, found[k])):.0%}"

    kinds = [f"{LABELS[k].removeprefix('exposed ')} {apart(k)}" for k in EXPOSED_PARTS if k in found]
    cells = [f"{apart('compute')} in compute"] if "compute" in found else []
    if "exposed" in found:
        each = f" ({', '.join(kinds)})" if kinds else ""
        cells.append(f"{apart('exposed')} in exposed communication{each}")
    cells += [f"{apart(k)} in {LABELS[k]}" for k in ("waiting", "other") if k in found]
    return (f"Runs of the same work ({len(pairs)} pair{'s' if len(pairs) > 1 else ''}: a configuration's "
            "repeats, or a strong-scaling run of one micro-batch a step and its weak twin) read apart by a "
            f"median {', '.join(cells)}, each taken as the other's prediction: a difference between rows "
            "smaller than that is within the trace's own noise")


def measured(row: pd.Series) -> Split:
    """A split table row as the model's formula reads it (bench/predict/split.py)."""
    return Split({k: float(row[k]) for k in PARTS}, float(row["step_time_s"]),
                 float(row["tokens_per_gpu_step"]))


def peer(row: pd.Series) -> str | None:
    """The node a row's ranks waited for (its slowest), where the run names one."""
    return row["slowest_node"] if isinstance(row.get("slowest_node"), str) else None


def ends(table: pd.DataFrame) -> list[tuple[tuple, pd.Series, pd.Series]]:
    """Per configuration traced at two node counts or more: its key, smallest and largest node count's
    rows."""
    out = []
    for key, group in table.groupby(CONFIG, dropna=False):
        if group["nodes"].nunique() >= 2:
            out.append((key, group.loc[group["nodes"].idxmin()], group.loc[group["nodes"].idxmax()]))
    return out


def lost_sentence(key: tuple, base: pd.Series, top: pd.Series) -> str:
    """Where the points lost from a configuration's smallest to its largest node count went, e.g. "from 1
    to 16 nodes 13 points lost: 9 exposed reduce-scatter, 3 waiting for node7, 1 other"."""
    lost, parts = lost_points(measured(base), measured(top))
    named = words(parts, peer(top))
    verb = "lost" if round(lost) >= 0 else "gained"
    return (f"{describe(dict(zip(CONFIG, key)))}: from {node_count(base['nodes'])} to "
            f"{node_count(top['nodes'])} {abs(round(lost))} points of per-GPU efficiency {verb}"
            + (f": {', '.join(named)}" if named else "") + " (measured in each run's trace)")


def lost_sentences(table: pd.DataFrame) -> list[str]:
    """Per configuration traced at two node counts or more: its lost_sentence."""
    return [lost_sentence(key, base, top) for key, base, top in ends(table)]


MAX_CHARTED = 6  # configurations the step split chart draws legibly on the report's first screens


def charted(table: pd.DataFrame, named: pd.DataFrame) -> pd.DataFrame:
    """The split table's rows the report's chart draws: every configuration where there are at most
    MAX_CHARTED, else the ones the answer names (`named`: a model and a configuration label a row, of
    analysis.scaling.headline's table and the strong-scaling answer's), the first MAX_CHARTED where it
    names none of them; `attrs` say which and of how many."""
    if table.empty or table.groupby(CONFIG, dropna=False).ngroups <= MAX_CHARTED:
        return table
    names = set(zip(named["model"], named["configuration"])) if len(named) else set()
    keep = [(r["model"], configuration_label(r)) in names for _, r in table.iterrows()]
    shown = table[keep] if any(keep) else table.merge(table.drop_duplicates(CONFIG).head(MAX_CHARTED)[CONFIG],
                                                      on=CONFIG)
    shown.attrs = {"named": any(keep), "of": table.groupby(CONFIG, dropna=False).ngroups}  # for the title
    return shown
