"""`python -m analysis.compare A B`: what changed between two results trees, beyond the noise.

Runs are matched by configuration and node count (model, strategy, precision, AC, wrap policy, micro
batch, sequence length, GPUs and EFA per node, cluster), not by run id: the id also hashes the sweep
name and the launcher, which a before/after comparison may well change. Each side's repeats are
aggregated as in the report (medians); its noise is the larger of the step-time spread within runs
(std / median) and half the tokens/s range across repeats. A change in throughput counts only when it
exceeds both `--threshold` and `--sigmas` times the combined noise of the two sides; a run that was ok
in A and is not in B is always a regression. `--fail-on-regression` makes the exit code 1 when any
regression is found (for CI); unreadable input exits 2.

Before the throughput deltas it prints every system fact that differs between the two (analysis/system.py,
from the runs' system records: "NCCL 2.21.5 -> 2.23.4", "FI_EFA_USE_DEVICE_RDMA unset -> 1", "driver
550.54.15 -> 570.86.10", "B (study): 2 nodes of 16 differ"), and its last line names them: a regression
is read beside what else changed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import system
from analysis.load import NoResults, load
from analysis.render import markdown_table
from analysis.scaling import CONFIG, aggregate, describe

KEY = [c for c in CONFIG if c != "sweep"] + ["nodes"]
SIDE_METRICS = ["status", "ok_runs", "tokens_per_s", "mfu", "mem_peak_alloc_gib", "scaling_efficiency",
                "noise"]
COLUMNS = {"config": "configuration", "nodes": "nodes", "status_a": "status A", "status_b": "status B",
           "tokens_per_s_a": "tokens/s A", "tokens_per_s_b": "tokens/s B",
           "tokens_delta_pct": "tokens/s change (%)",
           "noise_pct": "noise band (%)", "mfu_a": "MFU A", "mfu_b": "MFU B",
           "mem_peak_alloc_gib_a": "peak alloc A (GiB/GPU)", "mem_peak_alloc_gib_b": "peak alloc B (GiB/GPU)",
           "mem_delta_pct": "memory change (%)", "scaling_efficiency_a": "efficiency A",
           "scaling_efficiency_b": "efficiency B", "verdict": "verdict"}


def noise(agg: pd.DataFrame) -> pd.Series:
    """Relative noise per configuration: within-run step-time spread or across-repeat range, the larger."""
    within = (agg["step_time_s_std"] / agg["step_time_s"]).fillna(0.0)
    across = ((agg["tokens_per_s_max"] - agg["tokens_per_s_min"]) / (2 * agg["tokens_per_s"])).fillna(0.0)
    return np.maximum(within, across)


def side(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """One side's configurations, aggregated over repeats, indexed by the match key."""
    agg, notes, _ = side_and_systems(path)
    return agg, notes


def side_and_systems(path: Path) -> tuple[pd.DataFrame, list[str], dict[str, system.SystemRecords]]:
    """side(), and the side's studies as their runs' system records describe them."""
    loaded = load(path)
    agg = aggregate(loaded.frame)
    if agg.empty:
        raise NoResults(f"{path}: no training runs to compare")
    agg["noise"] = noise(agg)
    notes = list(loaded.notes)
    dup = agg.duplicated(KEY, keep=False)
    if dup.any():
        notes.append(f"{path}: {int(dup.sum())} configurations appear in more than one sweep; "
                     "the one with most ok runs is compared")
        agg = agg.sort_values("ok_runs", ascending=False).drop_duplicates(KEY)
    return agg.set_index(KEY)[SIDE_METRICS], notes, system.system_records(loaded.frame)


def verdict(row: pd.Series, threshold: float) -> str:
    """regression / improvement / within noise, from status, throughput and memory."""
    a_ok, b_ok = row["status_a"] == "ok", row["status_b"] == "ok"
    if not a_ok or not b_ok:
        if a_ok:
            return f"regression: now {row['status_b']}"
        return "fixed" if b_ok else "failed in both"
    reasons = []
    if row["tokens_delta_pct"] < -row["noise_pct"]:
        reasons.append("throughput")
    if row["mem_delta_pct"] > 100 * threshold:
        reasons.append("memory")
    if reasons:
        return "regression: " + ", ".join(reasons)
    return "improvement" if row["tokens_delta_pct"] > row["noise_pct"] else "within noise"


def compare(a: pd.DataFrame, b: pd.DataFrame, threshold: float = 0.03, sigmas: float = 2.0) -> pd.DataFrame:
    """One row per configuration present on both sides, with the changes and a verdict."""
    both = a.add_suffix("_a").join(b.add_suffix("_b"), how="inner")
    if both.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    both["tokens_delta_pct"] = 100 * (both["tokens_per_s_b"] / both["tokens_per_s_a"] - 1)
    both["mem_delta_pct"] = 100 * (both["mem_peak_alloc_gib_b"] / both["mem_peak_alloc_gib_a"] - 1)
    combined = np.sqrt(both["noise_a"] ** 2 + both["noise_b"] ** 2)
    both["noise_pct"] = 100 * np.maximum(threshold, sigmas * combined)
    both["verdict"] = [verdict(row, threshold) for _, row in both.iterrows()]
    out = both.reset_index()
    out["config"] = [describe(row) for row in out[KEY].to_dict("records")]
    return out[list(COLUMNS)]


def unmatched(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Configurations measured on one side only, in words."""
    lines = []
    for label, left, right in (("only in A", a, b), ("only in B", b, a)):
        for key in left.index.difference(right.index):
            config = dict(zip(KEY, key))
            lines.append(f"{label}: {describe(config)} at {config['nodes']} node(s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__.split("\n")[0])
    parser.add_argument("a", type=Path, help="results root or sweep dir: the baseline")
    parser.add_argument("b", type=Path, help="results root or sweep dir: the candidate")
    parser.add_argument("--threshold", type=float, default=0.03,
                        help="smallest relative change that counts (default 0.03)")
    parser.add_argument("--sigmas", type=float, default=2.0,
                        help="noise multiples a change must exceed (default 2)")
    parser.add_argument("--csv", type=Path, help="also write the comparison table here")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when any regression is found")
    args = parser.parse_args(argv)
    try:
        a, notes_a, systems_a = side_and_systems(args.a)
        b, notes_b, systems_b = side_and_systems(args.b)
    except NoResults as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    changed = system.differences(systems_a, systems_b)
    unknown = system.unrecorded(systems_a, systems_b)
    for line in changed or unknown or ["the same on both sides"]:
        print(f"system: {line}")
    table = compare(a, b, args.threshold, args.sigmas)
    print(markdown_table(table.rename(columns=COLUMNS)), end="")
    for line in [*notes_a, *notes_b, *unmatched(a, b)]:
        print(f"note: {line}")
    regressions = table["verdict"].str.startswith("regression")
    print(f"{len(table)} configurations compared: {int(regressions.sum())} regression(s), "
          f"{int((table['verdict'] == 'improvement').sum())} improvement(s)"
          + (f"; system differs: {'; '.join(changed)}" if changed else ""))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 1 if args.fail_on_regression and regressions.any() else 0


if __name__ == "__main__":
    sys.exit(main())
