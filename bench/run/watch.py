"""Watching one job to its end on the runner's own clock: the queue timeout for each spell in the queue,
the run timeout for each execution from its own start (a job seen running, then pending again, was
requeued: Slurm after NODE_FAIL, a PyTorchJob recreating a lost pod), and the executions the runner saw,
for the record where the scheduler keeps none. Deciding to stop a job is the runner's; the launcher's
cleanup() acts on it."""
from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from bench.core.config import LauncherConfig
from bench.launchers.base import DONE, PENDING, RUNNING, Launcher, Outcome


def now_iso() -> str:
    """Now, as the run ledger and the executions record it (UTC, to the second)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Clock:
    """The runner's own view of a job: each spell in the queue and each execution, on the monotonic clock
    (for the timeouts) and the wall clock (for the record). A job seen running, then pending again, was
    requeued (Slurm after NODE_FAIL, a PyTorchJob recreating a lost pod): a new execution, on its own
    clock."""

    pending_since: float
    running_since: float | None = None
    queued_s: float = 0.0
    executions: list[dict[str, Any]] = field(default_factory=list)  # start, end (ISO) of each one seen

    def see(self, state: str, now: float) -> None:
        if state in (RUNNING, DONE) and self.running_since is None:
            self.queued_s += now - self.pending_since
            self.running_since = now
            self.executions.append({"state": "running", "start": now_iso()})
        elif state == PENDING and self.running_since is not None:  # back in the queue: requeued
            self.executions[-1] |= {"state": "requeued", "end": now_iso()}
            self.running_since, self.pending_since = None, now

    def overrun(self, settings: LauncherConfig, now: float, reason: str | None) -> Outcome | None:
        """The queue timeout (each spell in the queue, a requeued job's too) or the run timeout (each
        execution from its own start): the harness's decision to end the job, or None."""
        again = f" (requeued after execution {len(self.executions)})" if self.executions else ""
        if self.running_since is None and now - self.pending_since > settings.queue_timeout_s:
            return Outcome(returncodes=[], queue_timed_out=True, launch_error=(
                f"gave up after {now - self.pending_since:.0f} s in the queue{again} "
                f"(launcher.queue_timeout_s): {reason or 'pending'}"))
        if self.running_since is not None and now - self.running_since > settings.timeout_s:
            return Outcome(returncodes=[], timed_out=True)
        return None


def watch(settings: LauncherConfig, launcher: Launcher, handle: Any, stop: threading.Event,
          ) -> Generator[None, None, Outcome]:
    """Poll until the job is done, the stop event, the queue timeout (while pending) or the run timeout
    (counted from when the job runs, each execution of a requeued job from its own start). Deciding to stop
    a job is the runner's; cleanup() acts on it."""
    clock = Clock(pending_since=time.monotonic())
    while True:
        poll = launcher.poll(handle)
        now = time.monotonic()
        if not (poll.outcome and poll.outcome.never_ran):  # a job that ended before it ran was only queued
            clock.see(poll.state, now)
        if poll.state == DONE and poll.outcome is not None:
            outcome = poll.outcome
            break
        if stop.is_set():
            outcome = Outcome(returncodes=[], cancelled=True)
            break
        if outcome := clock.overrun(settings, now, poll.reason):
            break
        yield
    if clock.running_since is None:
        clock.queued_s += now - clock.pending_since
    outcome.queue_s = clock.queued_s
    outcome.wall_s = None if clock.running_since is None else now - clock.running_since
    outcome.execution = len(clock.executions)
    ended_by_us = "timed out" if outcome.timed_out else "cancelled" if outcome.cancelled else None
    if clock.executions and clock.running_since is not None:
        clock.executions[-1] |= {"end": now_iso()} | ({"state": f"{ended_by_us} by the harness"}
                                                      if ended_by_us else {"state": "ended"})
    if not outcome.executions and (len(clock.executions) > 1 or ended_by_us):  # what we saw, where the
        outcome.executions = clock.executions  # launcher's own record does not say (it may, after cleanup)
    return outcome
