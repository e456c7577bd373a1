"""The Slurm launcher asks the controller once a look for every job in flight, and less often while nothing
changes: on the real test cluster, its jobs watched as the runner watches them."""
from __future__ import annotations

import collections
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench.core.load_config import from_dict
from bench.launchers import launcher_sections
from bench.launchers.base import Outcome, Submission
from bench.launchers.slurm import SlurmLauncher
from bench.launchers.slurm_queue import LOOK_GROWTH, LOOK_MAX_S, Board, exit_code
from bench.run.watch import watch
from bench.sweep import compose
from conftest import SLURM_CONF


def test_exit_codes_read_alike_from_squeue_and_from_sacct() -> None:
    """squeue's exit_code is the wait status (slurm-wlm 22.05: 768 for `exit 3`, 15 for a job ended by
    SIGTERM), sacct's and scontrol's "code:signal"; the batch script's code either way."""
    assert exit_code("768") == exit_code("3:0") == 3
    assert exit_code("15") == exit_code("0:15") == 0
    assert exit_code("0") == 0 and exit_code("") is None


def launcher_asking(*overrides: str) -> tuple[SlurmLauncher, list[list[str]]]:
    """A launcher of the test cluster, and every command it runs, in order."""
    launcher = SlurmLauncher(from_dict(compose(["+sweep=smoke", "cluster=slurm_local", "launcher=slurm",
                                                *overrides])[0], launcher_sections()))
    asked: list[list[str]] = []
    run = launcher._run

    def recorded(argv: list[str], check: bool = True, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess:
        asked.append(list(argv))
        return run(argv, check, env)
    launcher._run = recorded  # type: ignore[method-assign]
    return launcher, asked


def submit(launcher: SlurmLauncher, run_dir: Path, command: str, *sbatch: str) -> Any:
    argv = ("sbatch", "--parsable", "--oversubscribe", f"--output={run_dir}/slurm-%j.log", *sbatch,
            "--wrap", command)
    return launcher.submit(Submission(run_id=run_dir.name, argvs=(argv,)), run_dir)


def watched(launcher: SlurmLauncher, handles: list[Any]) -> tuple[dict[str, Outcome], int]:
    """Every job watched to its end as the runner's loop does (bench/run/runner.py _drive): each in flight
    stepped, then launcher.poll_s; cleanup at its end. The outcomes by job id, and the rounds it took."""
    settings, stop = launcher.cfg.launcher, threading.Event()
    flight = {h.job_id: (h, watch(settings, launcher, h, stop)) for h in handles}
    outcomes, rounds = {}, 0
    deadline = time.monotonic() + 120
    while flight and time.monotonic() < deadline:
        rounds += 1
        for job_id, (handle, steps) in list(flight.items()):
            try:
                next(steps)
            except StopIteration as done:
                outcomes[job_id] = done.value
                launcher.cleanup(handle)
                del flight[job_id]
        time.sleep(settings.poll_s)
    for handle, _ in flight.values():
        launcher.cleanup(handle)
    assert not flight, f"jobs still in flight after 120 s: {sorted(flight)}"
    return outcomes, rounds


def job_ids(argv: list[str]) -> list[str]:
    return argv[argv.index("-j") + 1].split(",")


@pytest.mark.slurm
@pytest.mark.slow  # a real cluster
def test_every_job_in_flight_is_asked_of_slurm_at_once(slurm_cluster: str, tmp_path: Path) -> None:
    """Six jobs of 1-3 s in flight, stepped every 0.2 s: each look is one squeue for every job the launcher
    has in flight (the first names all six), at most one a round of polls, where each poll asked squeue
    about its own job; each job that left is asked of sacct once, in a request for all that left together;
    no scontrol a job. Each ends as Slurm says: `exit 3` FAILED with code 3 and Slurm's reason,
    the rest COMPLETED, each execution from the job-completion log (this cluster keeps no accounting)."""
    launcher, asked = launcher_asking("launcher.poll_s=0.2")
    handles = [submit(launcher, tmp_path / f"j{i}", f"sleep {1 + i % 3}" + ("; exit 3" if i == 5 else ""))
               for i in range(6)]
    ids = [h.job_id for h in handles]
    del asked[:]  # the submissions
    outcomes, rounds = watched(launcher, handles)
    looks = [job_ids(a) for a in asked if a[0] == "squeue"]
    assert looks[0] == sorted(ids) and all(set(look) <= set(ids) for look in looks), looks
    assert len(looks) <= rounds, (len(looks), rounds)
    accounted = collections.Counter(j for a in asked if a[0] == "sacct" for j in job_ids(a))
    assert accounted == {j: 1 for j in ids}
    assert not [a for a in asked if a[:3] == ["scontrol", "show", "job"]]
    failed = outcomes.pop(ids[5])
    assert (failed.scheduler_state, failed.returncodes, failed.detail) == ("FAILED", [3],
                                                                           "Slurm FAILED: NonZeroExitCode")
    for outcome in outcomes.values():
        assert outcome.scheduler_state == "COMPLETED" and outcome.returncodes == [0] and not outcome.detail
        [execution] = outcome.executions
        assert execution["state"] == "COMPLETED" and execution["start"] <= execution["end"]


@pytest.mark.slurm
@pytest.mark.slow  # a real cluster
def test_looks_come_later_while_nothing_changes_and_sooner_after_a_change(slurm_cluster: str,
                                                                          tmp_path: Path) -> None:
    """Two held jobs (pending, nothing changes) polled every 0.25 s of a clock the test turns: the looks
    come 1 s apart, then LOOK_GROWTH times further each, up to LOOK_MAX_S. One released and running is a
    change: the next look comes 1 s after. A look the controller does not answer (another port) leaves
    what it said last standing."""
    launcher, asked = launcher_asking()
    a, b = (submit(launcher, tmp_path / name, "sleep 30", "--hold") for name in ("a", "b"))
    try:
        now = [0.0]
        board = Board(launcher._ask, least_s=1.0, clock=lambda: now[0])
        board.add(a.job_id)
        board.add(b.job_id)

        def looks_until(seconds: float) -> list[float]:
            """The clock's times of the looks while it is turned to `seconds`, a poll every 0.25 s."""
            times = []
            while now[0] < seconds:
                before = len(asked)
                board.row(a.job_id)
                board.row(b.job_id)
                times += [now[0]] * sum(argv[0] == "squeue" for argv in asked[before:])
                now[0] += 0.25
            return times

        times = looks_until(150)
        gaps = [t1 - t0 for t0, t1 in zip(times, times[1:])]
        expected, wait = [], 1.0
        for _ in gaps:
            expected.append(wait)
            wait = min(wait * LOOK_GROWTH, LOOK_MAX_S)
        assert all(abs(g - e) <= 0.25 for g, e in zip(gaps, expected)), (gaps, expected)
        assert gaps[-1] == LOOK_MAX_S and board.rows[a.job_id].reason == "JobHeldUser"
        subprocess.run(["scontrol", "release", a.job_id], env={**os.environ, "SLURM_CONF": SLURM_CONF},
                       check=True)
        deadline = time.monotonic() + 30
        while subprocess.run(["squeue", "-h", "-j", a.job_id, "-o", "%T"], capture_output=True, text=True,
                             env={**os.environ, "SLURM_CONF": SLURM_CONF}).stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, "the released job never ran"
            time.sleep(0.2)
        changed = looks_until(now[0] + 12)
        assert board.rows[a.job_id].state == "RUNNING" and changed[1] - changed[0] == 1.0, changed
        unreachable = tmp_path / "unreachable.conf"
        port = int(next(ln for ln in Path(SLURM_CONF).read_text().splitlines()
                        if ln.startswith("SlurmctldPort=")).split("=")[1])
        unreachable.write_text(Path(SLURM_CONF).read_text().replace(f"SlurmctldPort={port}",
                                                                   f"SlurmctldPort={port + 100}")
                               + "MessageTimeout=1\n")
        launcher.env["SLURM_CONF"] = str(unreachable)
        before = len(asked)
        now[0] += 60
        assert board.row(a.job_id).state == "RUNNING" and board.row(b.job_id).reason == "JobHeldUser"
        assert [argv[0] for argv in asked[before:]] == ["squeue"]  # asked, and not answered
    finally:
        launcher.env["SLURM_CONF"] = SLURM_CONF
        for handle in (a, b):
            launcher.cleanup(handle)
