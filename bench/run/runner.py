"""Execute a plan: skip what is finished, record what cannot fit, keep the rest in flight within a node
budget.

Each run follows one path, written as a generator so that many runs can be in flight on the main thread
(no threads: a child's PR_SET_PDEATHSIG belongs to the thread that started it, and the main thread lives
as long as the sweep): render -> write the submission -> ledger -> submit -> ledger -> watch (queue
timeout, run timeout, stop) -> logs -> cleanup (always, in `finally`) -> summary. Any exception of a
launcher becomes that run's outcome and the sweep goes on. The results table is rewritten after every run
that ends.

Ctrl-C, SIGTERM or SIGHUP set a stop event: nothing new starts, runs in flight are cancelled and recorded
as `cancelled`, the table is written. A second signal cleans up at once and still writes the table.
"""
from __future__ import annotations

import contextlib
import signal
import statistics
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.core import rundir
from bench.core.config import ClusterConfig, LauncherConfig, MicroBatchSearch
from bench.core.schema import RETRYABLE_STATUSES, RunSpec, RunSummary
from bench.launchers.base import PROJECT_ROOT, Launcher, Outcome, Placement
from bench.predict.calibration_file import study_predictor
from bench.predict.memory import lower_bound
from bench.predict.perf import Predictor
from bench.run import schedule, straggler
from bench.run.collect import infeasible_summary, summarize_run, write_results
from bench.run.progress import Progress
from bench.run.watch import now_iso, watch
from bench.study.plan import PlannedRun, micro_batch_sizes, with_predictions

SEARCH_DIR = "search"  # an auto micro batch run's trials: <run dir>/search/mb<N>/
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RunSteps = Generator[None, None, RunSummary]  # yields while waiting on its job, returns the summary


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


@dataclass(frozen=True)
class RunOptions:
    """What running a plan reads of the sweep's configuration (bench.sweep.run_options builds it once): the
    sweep's name and options, its launcher's settings and placement, and what its predictor is refitted for
    after each run that ends ok (the cluster, the models it trains)."""

    sweep_name: str
    launcher: LauncherConfig
    placement: Placement
    cluster: ClusterConfig
    models: tuple[str, ...] = ()
    search: MicroBatchSearch = field(default_factory=MicroBatchSearch)
    tolerance: float = 0.25
    """A run's node this fraction slower than the others' median is its straggler (preflight.tolerance)."""
    force: bool = False
    rerun_failed: bool = False
    progress: bool = True


def should_run(previous: RunSummary | None, options: RunOptions) -> bool:
    """Resume rule: redo nothing finished, unless --force; failed runs only with --rerun-failed."""
    if options.force or previous is None or previous.status == "cancelled":
        return True
    return options.rerun_failed and previous.status in RETRYABLE_STATUSES


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM/SIGHUP set the event (first time) and raise KeyboardInterrupt (second time)."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

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


class _Sweep:
    """What the runs of one invocation share: the run options, launcher, sweep dir, stop event, progress."""

    def __init__(self, options: RunOptions, launcher: Launcher, sweep_dir: Path, stop: threading.Event,
                 progress: Progress, plan: list[PlannedRun]) -> None:
        self.options, self.launcher, self.sweep_dir = options, launcher, sweep_dir
        self.stop, self.progress, self.plan = stop, progress, plan
        self.rev = git_revision()
        self.counts: Counter[str] = Counter()
        self._predictor: Predictor | None = None  # refitted when first asked after a run ended ok
        self.learned = False  # a run ended ok since the waiting runs were last predicted
        self.walls: dict[int, list[float]] = {}  # finished training runs' wall times, by node count

    def end(self, planned: PlannedRun, summary: RunSummary) -> None:
        rundir.write_summary(rundir.run_dir(self.sweep_dir, planned.spec), summary)
        write_results(self.sweep_dir)
        self.counts[summary.status] += 1
        self.progress.finish(planned.spec.label, summary.status, summary.wall_s,
                             summary.error if summary.status != "ok" else straggler.note(summary),
                             queued_s=summary.queue_s, left=summary.extra.get("left_behind"))
        if summary.status == "ok":  # a probe or a training run: the study's calibration learns from it
            self._predictor = None
            self.learned = True
            if planned.spec.kind == "train" and summary.wall_s:
                self.walls.setdefault(planned.spec.nodes, []).append(summary.wall_s)

    @property
    def predictor(self) -> Predictor:
        """The study's predictor as of now: its probes, and its calibration on the runs it has finished
        (the plan was predicted with the same until a run ends ok)."""
        if self._predictor is None:
            o = self.options
            self._predictor = study_predictor(o.cluster, o.placement, o.models, self.sweep_dir)[0]
        return self._predictor

    def settle(self) -> None:
        """Refit on every run that ended ok, the last ones included: the refit is otherwise made when the
        next run is predicted, and the last run has none after it, so the study's calibration.json (and
        the report's extrapolation check, read from it) would miss it."""
        if self.learned:  # a run ended ok since the last refit
            _ = self.predictor  # refitted on first use, calibration.json written

    def job(self, planned: PlannedRun) -> schedule.Job:
        """The run as the schedule orders it: its predicted duration, else (no prediction: GPUs the cluster
        file does not name) the median wall time of the study's finished runs at its node count."""
        job = schedule.job_of(planned, self.options.placement)
        if job.seconds is None and (walls := self.walls.get(planned.spec.nodes)):
            job = replace(job, seconds=statistics.median(walls))
        return job

    def repredict(self, waiting: list[PlannedRun]) -> list[PlannedRun]:
        """The waiting runs predicted again with what the study has learned (each summary keeps the
        prediction its run had when it started)."""
        if not self.learned:
            return waiting
        self.learned = False
        fresh = {p.spec.run_id: p for p in with_predictions(self.plan, self.predictor)}
        return [fresh.get(p.spec.run_id, p) for p in waiting]


def execute(options: RunOptions, plan: list[PlannedRun], launcher: Launcher,
            sweep_dir: Path) -> dict[str, int]:
    """Run the plan; returns counts by status of this invocation (skipped runs under 'skipped')."""
    budget = options.placement.node_budget
    with stop_on_signals() as stop, Progress(len(plan), options.progress, budget) as progress:
        sweep = _Sweep(options, launcher, sweep_dir, stop, progress, plan)
        active: dict[str, tuple[PlannedRun, RunSteps]] = {}
        full = False
        try:
            write_results(sweep_dir)  # a table from the start, so a crash never leaves none
            waiting = _admit(sweep, plan)
            _drive(sweep, waiting, active, budget)
            sweep.settle()
        except KeyboardInterrupt:  # a second signal: clean up now (each run's `finally`), keep the rest
            stop.set()
            for planned, steps in active.values():
                steps.close()
                sweep.end(planned, RunSummary(run_id=planned.spec.run_id, sweep=options.sweep_name,
                                              status="cancelled", spec=planned.spec,
                                              error="cancelled by a second interrupt",
                                              run_dir=str(rundir.run_dir(sweep_dir, planned.spec))))
        except rundir.NoSpace:  # a full disk: stop, clean up the runs in flight (a rerun redoes them)
            full = True  # and say the first write that failed, not the table's after it
            stop.set()
            for _, steps in active.values():
                with contextlib.suppress(rundir.NoSpace):
                    steps.close()
            raise
        finally:
            launcher.close()
            with contextlib.suppress(rundir.NoSpace) if full else contextlib.nullcontext():
                write_results(sweep_dir)
    return {**sweep.counts, "interrupted": int(stop.is_set())}


def _admit(sweep: _Sweep, plan: list[PlannedRun]) -> list[PlannedRun]:
    """Skip finished runs, record infeasible ones; the rest, in submission order, to be launched."""
    todo: list[PlannedRun] = []
    for planned in plan:
        run_dir = rundir.run_dir(sweep.sweep_dir, planned.spec)
        previous = rundir.read_summary(run_dir)
        if not should_run(previous, sweep.options):
            sweep.progress.finish(planned.spec.label, f"skip ({previous.status})", None)
            sweep.counts["skipped"] += 1
            continue
        rundir.write_spec(run_dir, planned.spec)
        if planned.feasible:
            todo.append(planned)
        else:
            sweep.end(planned, infeasible_summary(planned.spec, sweep.options.sweep_name, run_dir,
                                                  planned.predicted(), planned.reason))
    by_id = {p.spec.run_id: p for p in todo}
    return [by_id[job.key] for job in schedule.order([schedule.job_of(p, sweep.options.placement)
                                                      for p in todo])]


def _drive(sweep: _Sweep, waiting: list[PlannedRun], active: dict[str, tuple[PlannedRun, RunSteps]],
           budget: int | None) -> None:
    """Start what fits, step every run in flight, end what finished; until nothing waits or runs."""
    settings = sweep.options.launcher
    jobs = {p.spec.run_id: sweep.job(p) for p in waiting}
    admitting = sys.maxsize if sweep.options.placement.admits_all else budget  # the scheduler packs them
    while waiting or active:
        if sweep.stop.is_set():
            waiting.clear()
        in_flight = [jobs[key] for key in active]
        if (fresh := sweep.repredict(waiting)) is not waiting:  # learned: the longest first, as now known
            jobs |= {p.spec.run_id: sweep.job(p) for p in fresh}
            by_id = {p.spec.run_id: p for p in fresh}
            waiting[:] = [by_id[j.key] for j in schedule.order([jobs[p.spec.run_id] for p in fresh])]
        for job in schedule.pick([jobs[p.spec.run_id] for p in waiting], in_flight, admitting,
                                 settings.probes_alone):
            planned = next(p for p in waiting if p.spec.run_id == job.key)
            waiting.remove(planned)
            active[job.key] = (planned, _run(sweep, planned))
            sweep.progress.start(planned.spec.label, planned.spec.nodes)
        for key, (planned, steps) in list(active.items()):
            try:
                next(steps)
                continue
            except StopIteration as done:
                summary = done.value
            except rundir.NoSpace:  # not the run's failure: the sweep stops (execute)
                raise
            except Exception as e:  # a defect outside the launcher calls: the run fails, the sweep goes on
                summary = RunSummary(run_id=planned.spec.run_id, sweep=sweep.options.sweep_name,
                                     status="failed", spec=planned.spec,
                                     error=f"harness error: {type(e).__name__}: {e}",
                                     run_dir=str(rundir.run_dir(sweep.sweep_dir, planned.spec)))
            del active[key]
            sweep.end(planned, summary)
        if active:
            sweep.stop.wait(settings.poll_s)


def _run(sweep: _Sweep, planned: PlannedRun) -> RunSteps:
    run_dir = rundir.run_dir(sweep.sweep_dir, planned.spec)
    if planned.spec.auto_micro_batch:
        return (yield from _search_micro_batch(sweep, planned, run_dir))
    return (yield from _attempt(sweep, planned, run_dir))


def _attempt(sweep: _Sweep, planned: PlannedRun, run_dir: Path) -> RunSteps:
    """One submission of a run (or the re-attached job of an earlier sweep), watched to its end."""
    options, launcher, spec = sweep.options, sweep.launcher, planned.spec
    started = now_iso()
    handle, attempt = _reattach(sweep, run_dir)
    if handle is None:
        attempt += 1
    attempt_dir = rundir.attempt_dir(run_dir, attempt)
    outcome = Outcome(returncodes=[])
    if handle is None:
        handle, outcome = _submit(sweep, spec, run_dir, attempt_dir, attempt, started,
                                  sweep.job(planned).seconds)
    try:
        if handle is not None:
            outcome = yield from watch(options.launcher, launcher, handle, sweep.stop)
            launcher.logs(handle, attempt_dir)
    except Exception as e:  # the launcher failed while the job ran: API error, command timeout ...
        outcome = Outcome(returncodes=[], error=f"launcher {launcher.name}: {type(e).__name__}: {e}")
    finally:
        if handle is not None:
            _cleanup(launcher, handle, run_dir, attempt)
    if handle is not None:
        outcome.left_behind = yield from _until_removed(launcher, handle, run_dir, attempt)
    if handle is not None and (outcome.timed_out or outcome.cancelled or outcome.launch_error):
        # ended by us (a timeout, Ctrl-C): the scheduler's own record of its executions, now it is out
        outcome.executions = _executions(launcher, handle) or outcome.executions
    rundir.record_attempt(run_dir, attempt=attempt, ended_at=now_iso(),
                          **({"executions": outcome.executions} if outcome.executions else {}))
    summary = summarize_run(spec, options.sweep_name, attempt_dir, outcome, predicted=planned.predicted(),
                            git_rev=sweep.rev, started_at=started, tolerance=options.tolerance)
    summary.run_dir, summary.attempt = str(run_dir), attempt
    return summary


def _submit(sweep: _Sweep, spec: RunSpec, run_dir: Path, attempt_dir: Path, attempt: int, started: str,
            seconds: float | None) -> tuple[Any, Outcome]:
    """Render, write, record and submit one attempt: (handle, no outcome yet), or (None, its launch_error)."""
    launcher = sweep.launcher
    try:
        submission = launcher.render(spec, attempt_dir, seconds)
        rundir.write_submission(attempt_dir, submission)
        rundir.record_attempt(run_dir, attempt=attempt, launcher=launcher.name, submitted_at=started,
                              job=None)
        handle = launcher.submit(submission, attempt_dir)
        rundir.record_attempt(run_dir, attempt=attempt, job=launcher.locate(handle))
        return handle, Outcome(returncodes=[])
    except Exception as e:  # invalid manifest, sbatch refused, API rejected the job, binary missing ...
        return None, Outcome(returncodes=[], launch_error=f"{type(e).__name__}: {e}")


def _reattach(sweep: _Sweep, run_dir: Path) -> tuple[Any, int]:
    """(handle on the job an earlier sweep left unfinished, or None; the ledger's last attempt number).

    A job still known to the scheduler is waited on again, never submitted twice; under --force or
    --rerun-failed it is cancelled first and a new attempt starts."""
    ledger = rundir.read_ledger(run_dir)
    last = ledger[-1] if ledger else None
    attempt = last["attempt"] if last else 0
    if not last or last.get("ended_at") or not last.get("job"):
        return None, attempt
    try:
        handle = sweep.launcher.attach(last["job"], rundir.attempt_dir(run_dir, attempt))
    except Exception:  # noqa: BLE001 - cannot tell: treat as gone, a new attempt starts
        handle = None
    if handle is not None and (sweep.options.force or sweep.options.rerun_failed):
        _cleanup(sweep.launcher, handle, run_dir, attempt)
        handle = None
    if handle is None:
        rundir.record_attempt(run_dir, attempt=attempt, ended_at=now_iso(),
                              note="job gone or cancelled on resume")
    else:
        rundir.record_attempt(run_dir, attempt=attempt, reattached_at=now_iso())
    return handle, attempt


def _executions(launcher: Launcher, handle: Any) -> list[dict[str, Any]]:
    """Each time the scheduler ran the job, as it recorded them (Slurm: sacct or the job-completion log),
    where the launcher can read that; [] where it cannot or the record cannot be read."""
    try:
        return launcher.executions(handle)
    except Exception:  # noqa: BLE001 - the record is a detail; the run's status stands without it
        return []


def _until_removed(launcher: Launcher, handle: Any, run_dir: Path, attempt: int
                   ) -> Generator[None, None, str | None]:
    """Wait, between the runner's looks at the other runs, until what cleanup deleted is gone or the
    launcher stops waiting for it; what is left then (and the command that removes it) is on the ledger
    and returned for the run's record."""
    try:
        while (left := launcher.remains(handle)) is not None and not left.final:
            yield
    except Exception as e:  # noqa: BLE001 - cannot tell: the cleanup is on the ledger, the run stands
        rundir.record_attempt(run_dir, attempt=attempt, cleanup_error=f"{type(e).__name__}: {e}")
        return None
    if left is None:
        return None
    rundir.record_attempt(run_dir, attempt=attempt, left_behind=left.what)
    return left.what


def _cleanup(launcher: Launcher, handle: Any, run_dir: Path, attempt: int) -> None:
    """cleanup() may fail too (API down); the failure is kept in the ledger, never raised past the run."""
    try:
        launcher.cleanup(handle)
    except Exception as e:  # noqa: BLE001
        rundir.record_attempt(run_dir, attempt=attempt, cleanup_error=f"{type(e).__name__}: {e}")


def _search_micro_batch(sweep: _Sweep, planned: PlannedRun, run_dir: Path) -> RunSteps:
    """micro_batch auto: the real run at the planned start, which the plan measured to fit, so a run that
    fits launches once (a job, a queue wait and a start-up on a cluster; ~20 s on one GPU). On OOM, short
    trial runs (in <run dir>/search/mbN) at the next smaller sizes (half; with a global batch, the next that
    divides each rank's share), then the real run again at the size that fitted. The search is recorded in the
    summary's extra, the first entry being the real run's own attempt."""
    spec, search = planned.spec, sweep.options.search
    start = planned.micro_batch_start or 1
    first = yield from _attempt(sweep, replace(planned, spec=replace(spec, micro_batch=start)), run_dir)
    trials = [_trial_row(start, first)]
    last, m = first, start
    while last.status == "oom" and not sweep.stop.is_set():
        m = max((size for size in micro_batch_sizes(spec, m) if size < m), default=0)
        if m < 1:
            break
        trial = replace(spec, micro_batch=m, steps=search.steps, warmup_steps=search.warmup_steps)
        last = yield from _attempt(sweep, PlannedRun(trial, None, True), run_dir / SEARCH_DIR / f"mb{m}")
        trials.append(_trial_row(m, last))
    summary = first
    if last is not first and last.status == "ok":  # below the planned start: no figure was made for this size
        final = replace(spec, micro_batch=m)
        found = PlannedRun(final, lower_bound(final, "not measured: below the planned start"), True,
                           perf=sweep.predictor.predict(final))
        summary = yield from _attempt(sweep, found, run_dir)
    elif last is not first:  # another failure or a stop: the run ends as its last trial did
        summary = last
        summary.spec, summary.run_id, summary.run_dir = spec, spec.run_id, str(run_dir)
    if last.status == "oom":
        sizes = ", ".join(str(t["micro_batch"]) for t in trials)
        summary.error = f"micro batch search: out of memory at micro batch {sizes}"
    summary.extra = {**summary.extra, "micro_batch_search": trials}
    return summary


def _trial_row(micro_batch: int, summary: RunSummary) -> dict[str, Any]:
    return {"micro_batch": micro_batch, "status": summary.status,
            "mem_peak_alloc_gib": summary.mem_peak_alloc_gib, "step_time_s": summary.step_time_s,
            "error": summary.error}
