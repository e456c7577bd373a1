"""The runner's clock on a job that Slurm requeues (NODE_FAIL) or a PyTorchJob restarts: each execution has
its own run timeout, each spell in the queue its own queue timeout, and a run the harness ends is the
harness's status with its reason first. A scripted launcher and a fake monotonic clock stand in for the
scheduler: every poll advances time by the seconds the script gives it."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from bench.core.load_config import from_dict
from bench.launchers import launcher_sections
from bench.launchers.base import DONE, PENDING, RUNNING, Outcome, Poll
from bench.run import watch
from bench.run.classify import classify
from bench.sweep import compose

GLOO = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"


class Scripted:
    """Polls answer the script's states in turn, each `step_s` seconds after the last."""

    name = "scripted"

    def __init__(self, script: list[tuple[str, int]], clock: list[float], step_s: float = 10.0) -> None:
        self.states = [state for state, polls in script for _ in range(polls)]
        self.clock, self.step_s = clock, step_s

    def poll(self, handle: object) -> Poll:
        self.clock[0] += self.step_s
        state = self.states.pop(0) if self.states else DONE
        return Poll(state, outcome=Outcome(returncodes=[0]) if state == DONE else None,
                    reason="BeginTime" if state == PENDING else None)


def _watched(script: list[tuple[str, int]], monkeypatch, timeout_s: float = 120,
           queue_timeout_s: float = 200) -> Outcome:
    clock = [0.0]
    monkeypatch.setattr(watch.time, "monotonic", lambda: clock[0])
    cfg = from_dict(compose(["+sweep=smoke"])[0], launcher_sections())
    cfg = replace(cfg, launcher=replace(cfg.launcher, timeout_s=timeout_s, queue_timeout_s=queue_timeout_s))
    steps = watch.watch(cfg.launcher, Scripted(script, clock), object(), threading.Event())
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value


def test_a_requeued_job_runs_its_second_execution_on_its_own_clock(monkeypatch) -> None:
    """100 s running, requeued, 150 s pending (Slurm's BeginTime), 100 s running: 350 s since the first
    start, past the 120 s run timeout counted from there, and no execution past it."""
    outcome = _watched([(PENDING, 1), (RUNNING, 10), (PENDING, 15), (RUNNING, 10)], monkeypatch)
    assert not outcome.timed_out and outcome.launch_error is None and outcome.execution == 2
    assert outcome.wall_s == pytest.approx(100) and outcome.queue_s == pytest.approx(20 + 150)
    first, second = outcome.executions  # what the runner saw, where the launcher tells nothing
    assert first["state"] == "requeued" and first["end"] and second["start"]


def test_the_second_execution_times_out_on_its_own_time_and_says_so(monkeypatch) -> None:
    outcome = _watched([(RUNNING, 5), (PENDING, 3), (RUNNING, 20)], monkeypatch)
    assert outcome.timed_out and outcome.execution == 2 and outcome.wall_s == pytest.approx(130)
    status, error = classify(outcome, [{"status": "failed", "error": GLOO}], GLOO)
    assert status == "timeout"
    assert error.startswith("no result within the run's time limit (130 s of execution 2 (the job was "
                            "requeued)); killed by the harness; the worker's last error: RuntimeError")


def test_pending_after_a_requeue_counts_against_the_queue_timeout(monkeypatch) -> None:
    outcome = _watched([(RUNNING, 5), (PENDING, 30)], monkeypatch)
    assert outcome.queue_timed_out and not outcome.timed_out
    assert outcome.launch_error.startswith("gave up after 210 s in the queue (requeued after execution 1) "
                                           "(launcher.queue_timeout_s): BeginTime")
    status, error = classify(outcome, [{"status": "failed", "error": GLOO}], GLOO)
    assert status == "launch_error" and error.startswith("gave up after 210 s")
    assert error.endswith(GLOO)  # the first execution's echo, after the harness's reason


def test_a_job_that_never_left_the_queue_is_timed_there_once(monkeypatch) -> None:
    outcome = _watched([(PENDING, 25)], monkeypatch)
    assert outcome.queue_timed_out and outcome.execution == 0 and outcome.wall_s is None
    assert outcome.launch_error.startswith("gave up after 210 s in the queue (launcher.queue_timeout_s)")


def test_a_cancelled_run_is_cancelled_with_the_workers_echo_after() -> None:
    failed = [{"status": "failed", "error": GLOO}]
    status, error = classify(Outcome(returncodes=[], cancelled=True), failed, "")
    assert (status, error) == ("cancelled", f"cancelled by the user (Ctrl-C / SIGTERM); the worker's last "
                                            f"error: {GLOO}")
