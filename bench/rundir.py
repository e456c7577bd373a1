"""The only code that knows the results store's file names and how they are written.

    <root>/<sweep>/sweep.yaml            resolved sweep config
    <root>/<sweep>/plan.csv              every planned run with its estimate
    <root>/<sweep>/results.{parquet,csv} one row per run
    <root>/<sweep>/runs/<label>-<id>/    spec.json, submission/, logs/, records/, summary.json

Writes that other processes may read are atomic (temp file + rename), so a crash or Ctrl-C never
leaves a half-written summary behind.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.schema import RunSpec, RunSummary, parse_records

SWEEP_CONFIG = "sweep.yaml"
PLAN_CSV = "plan.csv"
RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"
RUNS_DIR = "runs"
SPEC_JSON = "spec.json"
SUMMARY_JSON = "summary.json"
SUBMISSION_DIR = "submission"
LOGS_DIR = "logs"
RECORDS_DIR = "records"


def run_dir(sweep_dir: Path, spec: RunSpec) -> Path:
    return sweep_dir / RUNS_DIR / f"{spec.label}-{spec.run_id}"


def records_path(run_dir_: Path, rank: int) -> Path:
    """Where rank `rank` of the worker appends its metric records."""
    return run_dir_ / RECORDS_DIR / f"rank{rank}.jsonl"


def log_path(run_dir_: Path, name: str) -> Path:
    return run_dir_ / LOGS_DIR / f"{name}.log"


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_spec(run_dir_: Path, spec: RunSpec) -> None:
    write_json(run_dir_ / SPEC_JSON, spec.to_dict())


def read_spec(run_dir_: Path) -> RunSpec:
    return RunSpec.from_dict(json.loads((run_dir_ / SPEC_JSON).read_text()))


def write_summary(run_dir_: Path, summary: RunSummary) -> None:
    write_json(run_dir_ / SUMMARY_JSON, summary.to_row())


def read_summary(run_dir_: Path) -> RunSummary | None:
    """The run's summary, or None if there is none or it cannot be read (older/corrupt file)."""
    path = run_dir_ / SUMMARY_JSON
    try:
        return RunSummary.from_row(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def iter_run_dirs(sweep_dir: Path) -> Iterator[Path]:
    runs = sweep_dir / RUNS_DIR
    if runs.is_dir():
        yield from sorted(p for p in runs.iterdir() if p.is_dir())


def read_records(run_dir_: Path) -> list[dict[str, Any]]:
    """All metric records of a run: from the worker's record files, else from its logs.

    The worker writes records/ when it can reach the run dir (local, shared file system); otherwise
    (Kubernetes, no shared FS) the records are recovered from the collected logs.
    """
    files = sorted((run_dir_ / RECORDS_DIR).glob("*.jsonl"))
    if not files:
        files = sorted((run_dir_ / LOGS_DIR).glob("*.log"))
    records: list[dict[str, Any]] = []
    for path in files:
        with open(path, errors="replace") as f:
            records.extend(parse_records(f))
    return records
