"""Execute a plan: skip what is finished, prune what cannot fit, launch the rest one by one.

Ctrl-C or SIGTERM sets a stop event: the running run is cancelled and recorded as `cancelled`, the
results table is rewritten, and everything that finished stays. A second Ctrl-C exits at once.
"""
from __future__ import annotations

import datetime as dt
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import rundir
from bench.collect import infeasible_summary, summarize_run, write_results
from bench.config import SweepConfig
from bench.launchers.base import PROJECT_ROOT, Launcher, Outcome
from bench.plan import PlannedRun, feasibility
from bench.progress import Progress
from bench.schema import RETRYABLE_STATUSES, RunSummary

SEARCH_DIR = "search"  # an auto micro batch run's trials: <run dir>/search/mb<N>/


def git_revision() -> str | None:
    """Short commit of this checkout, '-dirty' when it has changes; None outside git."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def should_run(previous: RunSummary | None, cfg: SweepConfig) -> bool:
    """Resume rule: redo nothing finished, unless --force; failed runs only with --rerun-failed."""
    if cfg.force or previous is None or previous.status == "cancelled":
        return True
    return cfg.rerun_failed and previous.status in RETRYABLE_STATUSES


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM set the event (first time) and raise KeyboardInterrupt (second time)."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def execute(cfg: SweepConfig, plan: list[PlannedRun], launcher: Launcher, sweep_dir: Path) -> dict[str, int]:
    """Run the plan; returns counts by status of this invocation (skipped runs under 'skipped')."""
    rev = git_revision()
    counts: dict[str, int] = {}
    with stop_on_signals() as stop, Progress(len(plan), cfg.progress) as progress:
        for planned in plan:
            spec = planned.spec
            rd = rundir.run_dir(sweep_dir, spec)
            previous = rundir.read_summary(rd)
            if not should_run(previous, cfg):
                progress.finish(spec.label, f"skip ({previous.status})", None)
                counts["skipped"] = counts.get("skipped", 0) + 1
                continue
            if stop.is_set():
                break
            rundir.write_spec(rd, spec)
            if not planned.feasible:
                summary = infeasible_summary(spec, cfg.name, rd, planned.est_mem_gib, planned.reason)
            elif spec.auto_micro_batch:
                summary = _search_micro_batch(cfg, planned, launcher, rd, rev, stop, progress)
            else:
                summary = _launch(cfg, planned, launcher, rd, rev, stop, progress)
            rundir.write_summary(rd, summary)
            counts[summary.status] = counts.get(summary.status, 0) + 1
            progress.finish(spec.label, summary.status, summary.wall_s,
                            summary.error if summary.status != "ok" else None)
        write_results(sweep_dir)
    counts["interrupted"] = int(stop.is_set())
    return counts


def _launch(cfg: SweepConfig, planned: PlannedRun, launcher: Launcher, rd: Path, rev: str | None,
            stop: threading.Event, progress: Progress) -> RunSummary:
    spec = planned.spec
    progress.start(spec.label)
    started = _now()
    _clear_previous_attempt(rd)
    try:
        submission = launcher.render(spec, rd)
        rundir.write_json(rd / rundir.SUBMISSION_DIR / "submission.json", submission.describe())
        for name, content in submission.files.items():
            rundir.atomic_write_text(rd / rundir.SUBMISSION_DIR / name, content)
        handle = launcher.submit(submission, rd)
    except Exception as e:  # invalid manifest, sbatch refused, API rejected the job, binary missing ...
        outcome = Outcome(returncodes=[], launch_error=f"{type(e).__name__}: {e}")
    else:
        outcome = launcher.wait(handle, cfg.launcher.timeout_s, stop)
        launcher.logs(handle, rd)
    return summarize_run(spec, cfg.name, rd, outcome, est_mem_gib=planned.est_mem_gib, git_rev=rev,
                         started_at=started)


def _search_micro_batch(cfg: SweepConfig, planned: PlannedRun, launcher: Launcher, rd: Path, rev: str | None,
                        stop: threading.Event, progress: Progress) -> RunSummary:
    """micro_batch auto: short trial runs (in rd/search/mbN) from the estimate's start, halving on OOM,
    then the real run at the size that fitted. The search is recorded in the summary's extra."""
    search, spec = cfg.micro_batch_search, planned.spec
    trials: list[dict[str, Any]] = []
    m, last = planned.micro_batch_start or 1, None
    while m >= 1 and not stop.is_set():
        trial = replace(spec, micro_batch=m, steps=search.steps, warmup_steps=search.warmup_steps)
        trial_dir = rd / SEARCH_DIR / f"mb{m}"
        last = _launch(cfg, PlannedRun(trial, None, True), launcher, trial_dir, rev, stop, progress)
        trials.append({"micro_batch": m, "status": last.status, "mem_peak_alloc_gib": last.mem_peak_alloc_gib,
                       "step_time_s": last.step_time_s, "error": last.error})
        if last.status != "oom":
            break
        m //= 2
    if last is not None and last.status == "ok":
        final = replace(spec, micro_batch=trials[-1]["micro_batch"])
        summary = _launch(cfg, PlannedRun(final, feasibility(cfg, final)[0], True), launcher, rd, rev, stop,
                          progress)
    else:  # every size ran out of memory, another failure, or a stop: the run ends as its last trial did
        summary = last or RunSummary(run_id=spec.run_id, sweep=cfg.name, status="cancelled", spec=spec,
                                     error="stopped before the micro batch search began")
        summary.spec, summary.run_id, summary.run_dir = spec, spec.run_id, str(rd)
        if summary.status == "oom":
            start = trials[0]["micro_batch"]
            summary.error = f"micro batch search: out of memory at every size from {start} to 1"
    summary.extra = {**summary.extra, "micro_batch_search": trials}
    return summary


def _clear_previous_attempt(rd: Path) -> None:
    """A re-run starts from empty logs and records, so the summary reflects this attempt only."""
    for sub in (rundir.LOGS_DIR, rundir.RECORDS_DIR):
        for path in (rd / sub).glob("*"):
            path.unlink()
    (rd / rundir.SUMMARY_JSON).unlink(missing_ok=True)
