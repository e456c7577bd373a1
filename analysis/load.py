"""Load results for the report: a results root (several sweeps) or one sweep dir, never a traceback.

Each sweep's rows come from its results table; where the table is missing or unreadable they are
rebuilt from the run dirs' summaries. Unreadable summaries and runs without one are counted as notes.
Rows of an older schema get the columns they lack as empty; a newer schema is reported as a note.
Each sweep's plan (plan.csv: every planned training run and its prediction) comes along, so the report
answers before any run has finished, and for the node counts that have not run yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.scaling import with_batch
from bench.core import rundir
from bench.core.schema import SCHEMA_VERSION, SUMMARY_COLUMNS, RunSpec


class NoResults(Exception):
    """Nothing to report on; the message says what to do."""


@dataclass
class Loaded:
    frame: pd.DataFrame
    sweeps: list[Path]
    notes: list[str] = field(default_factory=list)
    plan: pd.DataFrame = field(default_factory=pd.DataFrame)  # planned training runs (load_plan)


def sweep_dirs(path: Path) -> list[Path]:
    """`path` itself if it is a sweep dir, else its sweep dirs (one level down)."""
    def is_sweep(p: Path) -> bool:
        return (p / rundir.RUNS_DIR).is_dir() or (p / rundir.RESULTS_CSV).is_file() or (
            p / rundir.RESULTS_PARQUET).is_file() or (p / rundir.PLAN_CSV).is_file()
    if is_sweep(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and is_sweep(p)) if path.is_dir() else []


# Columns without which a table is not a results table (a foreign csv, a truncated write).
CORE_COLUMNS = ("run_id", "status", "kind", "model", "nodes", "gpus_per_node", "sharding")


def _table(sweep: Path, notes: list[str]) -> pd.DataFrame | None:
    """The sweep's results table (parquet, else csv), or None; each file passed over is a note naming the
    source that was used instead."""
    skipped: list[str] = []
    for name, reader in ((rundir.RESULTS_PARQUET, pd.read_parquet), (rundir.RESULTS_CSV, pd.read_csv)):
        path = sweep / name
        if not path.is_file():
            continue
        try:
            frame = reader(path)
        except Exception as e:  # truncated or foreign file
            skipped.append(f"{path}: unreadable ({type(e).__name__})")
            continue
        missing = [c for c in CORE_COLUMNS if c not in frame.columns]
        if missing:
            skipped.append(f"{path}: not a results table (no {', '.join(missing)})")
            continue
        notes.extend(f"{s}; read {name} instead" for s in skipped)
        return frame
    notes.extend(f"{s}; rebuilt from the run dirs' summaries" for s in skipped)
    return None


def _from_run_dirs(sweep: Path, notes: list[str]) -> pd.DataFrame:
    rows, missing = [], 0
    for d in rundir.iter_run_dirs(sweep):
        summary = rundir.read_summary(d)
        if summary is None:
            missing += 1
            continue
        rows.append(summary.to_row())
    if missing:
        notes.append(f"{sweep.name}: {missing} run dir(s) without a readable summary (running, killed "
                     "or corrupt) are not in the report")
    return pd.DataFrame(rows)


def _located(frame: pd.DataFrame, sweep: Path) -> pd.DataFrame:
    """Each run's dir where it lies now, under this sweep's runs/: the table holds the path the sweep
    wrote, relative to where it ran, which a report run elsewhere or a results dir moved does not find."""
    if "run_dir" not in frame:
        return frame
    def here(written: object) -> str | None:
        found = sweep / rundir.RUNS_DIR / Path(str(written)).name
        return str(found) if isinstance(written, str) and written and found.is_dir() else None
    return frame.assign(run_dir=frame["run_dir"].map(here).fillna(frame["run_dir"]))


def load(path: Path) -> Loaded:
    path = Path(path)
    if not path.exists():
        raise NoResults(f"{path} does not exist")
    sweeps = sweep_dirs(path)
    if not sweeps:
        raise NoResults(f"no sweep results under {path}: run `python -m bench.sweep +sweep=smoke` first, "
                        "or point at results/ or results/<sweep>")
    notes: list[str] = []
    frames = []
    for sweep in sweeps:
        frame = _table(sweep, notes)
        if frame is None or frame.empty:
            frame = _from_run_dirs(sweep, notes)
        if not frame.empty:
            frame["sweep"] = frame.get("sweep", pd.Series(sweep.name, index=frame.index)).fillna(sweep.name)
            frames.append(_located(frame, sweep))
    plan = load_plan(sweeps, notes)
    if not frames and plan.empty:
        raise NoResults(f"the sweeps under {path} have no finished runs yet, and no plan")
    frame = _with_spec_defaults(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["sweep"]), SUMMARY_COLUMNS)
    versions = pd.to_numeric(frame["schema_version"], errors="coerce")
    if (versions > SCHEMA_VERSION).any():
        notes.append(f"some rows were written by a newer schema (v{int(versions.max())}); "
                     f"this report knows v{SCHEMA_VERSION} and shows the columns it knows")
    if (versions < SCHEMA_VERSION).any():
        notes.append("some rows come from an older schema; columns it did not have are left empty")
    numeric = [c for c in SUMMARY_COLUMNS if c.endswith(("_s", "_gib", "_gbs", "_w", "_pct", "per_gpu",
                                                          "mfu", "hfu", "_first", "_last"))]
    for column in numeric:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return Loaded(frame=with_batch(_older_estimates(frame)), sweeps=sweeps, notes=notes, plan=plan)


def _with_spec_defaults(frame: pd.DataFrame, columns: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """Every column present; a spec field added later (compile, offload) had its default then."""
    spec_defaults = RunSpec().to_dict()
    for column in columns:  # an older schema lacks some columns
        if column not in frame.columns:
            frame[column] = spec_defaults.get(column)
        elif column in spec_defaults:
            frame[column] = frame[column].where(frame[column].notna(), spec_defaults[column])
    return frame


def load_plan(sweeps: list[Path], notes: list[str]) -> pd.DataFrame:
    """The sweeps' planned training runs (plan.csv), as results rows would name them: the micro batch an
    auto run launches with, `status` "planned" or "infeasible"; an unreadable plan is a note."""
    frames = []
    for sweep in sweeps:
        path = sweep / rundir.PLAN_CSV
        if not path.is_file():
            continue
        try:
            plan = pd.read_csv(path)
            plan = plan[plan["kind"] == "train"].copy()
        except Exception as e:  # truncated or foreign file
            notes.append(f"{path}: unreadable ({type(e).__name__}); the answer is from finished runs only")
            continue
        if "micro_batch_start" in plan:
            start = pd.to_numeric(plan["micro_batch_start"], errors="coerce")
            plan["micro_batch"] = start.where(start.notna(), plan["micro_batch"]).astype(int)
        plan["sweep"] = sweep.name
        plan["status"] = plan["feasible"].map(lambda ok: "planned" if ok in (True, "True") else "infeasible")
        frames.append(plan)
    if not frames:
        return pd.DataFrame()
    plan = _with_spec_defaults(pd.concat(frames, ignore_index=True), list(RunSpec().to_dict()))
    for column in ("pred_step_time_s", "pred_source"):
        if column not in plan:
            plan[column] = None
    plan["pred_step_time_s"] = pd.to_numeric(plan["pred_step_time_s"], errors="coerce")
    return with_batch(plan)


def _older_estimates(frame: pd.DataFrame) -> pd.DataFrame:
    """Studies planned before the memory was measured carry the analytic estimate they were judged by
    (est_mem_gib, formula since removed): it is their prediction."""
    if "est_mem_gib" not in frame:
        return frame
    older = frame["pred_mem_gib"].isna() & pd.to_numeric(frame["est_mem_gib"], errors="coerce").notna()
    frame.loc[older, "pred_mem_gib"] = pd.to_numeric(frame.loc[older, "est_mem_gib"])
    frame.loc[older, "pred_mem_source"] = "analytic"
    return frame.drop(columns="est_mem_gib")
