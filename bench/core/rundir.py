"""The only code that knows the results store's file names and how they are written.

    <root>/<sweep>/sweep.yaml            resolved sweep config
    <root>/<sweep>/plan.csv              every planned run with its estimate
    <root>/<sweep>/results.{parquet,csv} one row per run
    <root>/<sweep>/.lock                 held by the one sweep working on this dir (flock; freed when it dies)
    <root>/<sweep>/runs/<label>-<id>/    spec.json, ledger.json, summary.json
        attempt-<n>/                     one per submission: submission/, logs/, records/

The ledger lists a run's attempts and how to find each one's job again (local process groups, Slurm job
id, Kubernetes namespace/name/uid); it is written before and right after the submission, so a sweep that
died can re-attach to a job that is still running instead of starting a second one. The summary comes
from the newest attempt only.

Writes that other processes may read are atomic (temp file + rename), so a crash or Ctrl-C never
leaves a half-written summary behind; files honour the umask (a team can share a results dir). A write
that finds the filesystem full (ENOSPC, or the user's quota: EDQUOT) leaves the old file as it was and
raises NoSpace, one line naming the directory, what the write needed and what was free.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.core.records import RECORDS_DIR, parse_records
from bench.core.schema import RunSpec, RunSummary

SWEEP_CONFIG = "sweep.yaml"
PLAN_CSV = "plan.csv"
CALIBRATION_JSON = "calibration.json"  # the study's own model constants (predict/calibration_file.py)
RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"
RUNS_DIR = "runs"
SPEC_JSON = "spec.json"
SUMMARY_JSON = "summary.json"
SUBMISSION_DIR = "submission"
LOGS_DIR = "logs"
TORCHELASTIC_DIR = "torchelastic"  # torchrun's per-rank error files (else a dir in each node's /tmp)
LEDGER_JSON = "ledger.json"
PREFLIGHT_DIR = "preflight"  # the preflight's jobs (bench/preflight.py)
PREFLIGHT_JSON = "preflight.json"  # its verdict, which the report shows
LOCK_FILE = ".lock"
ATTEMPT_PREFIX = "attempt-"
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class SweepDirBusy(RuntimeError):
    """Another live sweep holds this sweep dir."""


class NoSpace(OSError):
    """The results directory's filesystem is full: str() is one line naming the directory and the space
    the write needed (an OSError still, for code that handles any failed write)."""

    def __str__(self) -> str:
        return str(self.strerror)


FULL = (errno.ENOSPC, errno.EDQUOT)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def no_space(path: Path, size: int, e: OSError) -> NoSpace:
    """The full filesystem under `path` in one line: the directory, the write's size, what is free."""
    try:
        free = _size(shutil.disk_usage(path.parent).free)
    except OSError:
        free = "unknown"
    why = "no space left" if e.errno == errno.ENOSPC else "disk quota exceeded"
    return NoSpace(e.errno, f"{why} in {path.parent}: writing {path.name} needs {_size(size)} ({free} free); "
                   "free some space there (or set results_root elsewhere) and run the same command again: "
                   "every finished run is kept")


def run_dir(sweep_dir: Path, spec: RunSpec) -> Path:
    return sweep_dir / RUNS_DIR / f"{spec.label}-{spec.run_id}"


def preflight_run_dir(sweep_dir: Path, spec: RunSpec) -> Path:
    """Where one preflight job (a node's, or a pair's all-reduce) keeps its submission, logs and records."""
    return sweep_dir / PREFLIGHT_DIR / f"{spec.label}-{spec.run_id}"


def preflight_ready_dir(sweep_dir: Path) -> Path:
    """Where a preflight's node jobs on one machine meet before timing their workload (bench/preflight.py
    prepares it: a file `expected` holding how many ranks come; trainer/preflight.py meet)."""
    return sweep_dir / PREFLIGHT_DIR / "ready"


def attempt_dir(run_dir_: Path, attempt: int) -> Path:
    return run_dir_ / f"{ATTEMPT_PREFIX}{attempt}"


def read_ledger(run_dir_: Path) -> list[dict[str, Any]]:
    """The run's attempts, oldest first ([] before the first submission)."""
    try:
        return json.loads((run_dir_ / LEDGER_JSON).read_text())["attempts"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def record_attempt(run_dir_: Path, **entry: Any) -> None:
    """Add or update (by its `attempt` number) one attempt of the ledger."""
    ledger = read_ledger(run_dir_)
    old = next((a for a in ledger if a.get("attempt") == entry["attempt"]), {})
    others = [a for a in ledger if a is not old]
    attempts = sorted([*others, {**old, **entry}], key=lambda a: a["attempt"])
    write_json(run_dir_ / LEDGER_JSON, {"attempts": attempts})


def current_attempt_dir(run_dir_: Path) -> Path:
    """Where the newest attempt's logs and records are (the run dir itself for runs never submitted)."""
    ledger = read_ledger(run_dir_)
    return attempt_dir(run_dir_, ledger[-1]["attempt"]) if ledger else run_dir_


def write_submission(dir_: Path, submission: Any) -> None:
    """A rendered submission as files: the same for --dry-run and for a launch."""
    write_json(dir_ / SUBMISSION_DIR / "submission.json", submission.describe())
    for name, content in submission.files.items():
        atomic_write_text(dir_ / SUBMISSION_DIR / name, content)


@contextmanager
def locked(sweep_dir: Path) -> Iterator[None]:
    """Hold the sweep dir for this process: a second sweep on it gets SweepDirBusy naming the holder. The
    kernel drops the lock when its holder dies, `kill -9` included, so a stale lock is taken over."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(sweep_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise SweepDirBusy(f"{sweep_dir} is in use by another sweep (pid {holder}); wait for it to end "
                               f"or stop it, or choose another results_root") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def log_path(run_dir_: Path, name: str) -> Path:
    return run_dir_ / LOGS_DIR / f"{name}.log"


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode(), sync=True)


def atomic_write_bytes(path: Path, data: bytes, sync: bool = False) -> None:
    """`data` at `path` whole or not at all (temp file + rename); a full filesystem is NoSpace. `sync`:
    on the disk before the rename (the small files other processes read: summary, ledger)."""
    try:
        _atomic_write(path, data, sync)
    except OSError as e:
        if e.errno in FULL and not isinstance(e, NoSpace):
            raise no_space(path, len(data), e) from None
        raise


def _atomic_write(path: Path, data: bytes, sync: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
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


# Fields every summary of every schema version has; without them a summary says nothing about its run.
_SUMMARY_CORE = ("run_id", "status", "kind", "model", "nodes", "gpus_per_node", "sharding", "precision")


def read_summary(run_dir_: Path) -> RunSummary | None:
    """The run's summary, or None if there is none or it cannot be read: corrupt, or missing fields of the
    results schema (a summary without its spec would pass as a default run): the run is not finished."""
    path = run_dir_ / SUMMARY_JSON
    try:
        row = json.loads(path.read_text())
        if not isinstance(row, dict) or any(k not in row for k in _SUMMARY_CORE):
            return None
        return RunSummary.from_row(row)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def iter_run_dirs(sweep_dir: Path) -> Iterator[Path]:
    runs = sweep_dir / RUNS_DIR
    if runs.is_dir():
        yield from sorted(p for p in runs.iterdir() if p.is_dir())


def read_summaries(sweep_dir: Path) -> list[RunSummary]:
    """The readable summaries of a sweep dir's runs (a run without one is not finished)."""
    return [s for d in iter_run_dirs(sweep_dir) if (s := read_summary(d))]


def read_records(run_dir_: Path) -> list[dict[str, Any]]:
    """All metric records of a run: from the worker's record files, else from its logs.

    The worker writes records/ when it can reach the run dir (local, shared file system); otherwise
    (Kubernetes, no shared FS) the records are recovered from the collected logs. Given a run dir, the
    newest attempt's; given an attempt dir, that attempt's. Of a job the scheduler ran more than once (a
    Slurm requeue appends the next execution's records), the last execution's: what the first one's
    workers wrote as their node went away is not this run's result.
    """
    run_dir_ = current_attempt_dir(run_dir_)
    files = sorted((run_dir_ / RECORDS_DIR).glob("*.jsonl"))
    if not files:
        files = sorted((run_dir_ / LOGS_DIR).glob("*.log"))
    records: list[dict[str, Any]] = []
    for path in files:
        with open(path, errors="replace") as f:
            records.extend(parse_records(f))
    last = max((r.get("execution", 0) for r in records), default=0)
    return [r for r in records if r.get("execution", 0) == last]
