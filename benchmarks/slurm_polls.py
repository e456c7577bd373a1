"""What the Slurm launcher's polls ask of the controller with 50 jobs in flight on the local 4-node cluster:
per job (main before issue 79: `squeue -j JOB` for each job at each poll, reproduced here by `PerJobBoard`)
against one look for every job in flight (bench/launchers/slurm_queue.py: one squeue, one sacct for the
jobs that left the queue, the next look later while nothing changes).

Each pass submits JOBS sleep jobs at once through the launcher (`sbatch --wrap "sleep S"`, S spread evenly
over the pass's range so they end apart; --oversubscribe: four a CPU run, the rest pend: on 2 cores, 32
of 50) and watches every one as the runner does: bench.run.watch.watch stepped for each job in flight, every
launcher.poll_s (its default), the launcher's cleanup at its end. It counts what the launcher asked (its
squeue, sacct, scontrol and sinfo commands, by wrapping its command runner) and what slurmctld served
(sdiag's RPC counts, reset before each pass; every client's, so a pass beside other users of the cluster
counts theirs too), each per minute of the pass, and how long after Slurm's EndTime each end was seen.

    scripts/slurm_cluster.sh start && python benchmarks/slurm_polls.py   # 50 jobs of 20-60 s, both passes
    python benchmarks/slurm_polls.py --jobs 200                          # more in flight
    python benchmarks/slurm_polls.py --quick                             # 10 jobs of 2-5 s
    python benchmarks/slurm_polls.py --conf /tmp/other/slurm.conf        # a cluster of one's own, where
                              # FSDPBENCH_SLURM_DIR=/tmp/other FSDPBENCH_SLURM_PORT=17817 started it
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core.config import SweepConfig  # noqa: E402
from bench.core.load_config import from_dict  # noqa: E402
from bench.launchers import launcher_sections  # noqa: E402
from bench.launchers.base import Submission  # noqa: E402
from bench.launchers.slurm import SlurmLauncher  # noqa: E402
from bench.launchers.slurm_queue import Board, Row  # noqa: E402
from bench.run.watch import watch  # noqa: E402
from bench.sweep import compose  # noqa: E402

OVERRIDES: list[str] = []  # the cluster's configuration beyond slurm_local's (--conf)
QUERIES = ("squeue", "sacct", "scontrol", "sinfo")  # the launcher's commands that ask, not act
# slurmctld's RPCs of a client asking about jobs, partitions and nodes (each squeue asks three of them)
QUERY_RPCS = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_FED_INFO", "REQUEST_PARTITION_INFO",
              "REQUEST_NODE_INFO", "REQUEST_BUILD_INFO")


@dataclass
class PerJobBoard(Board):
    """main's polling before issue 79, reproduced: each poll asks squeue about its own job alone, every
    time, and once the job has left the queue, scontrol (its final state) and sacct (its executions)."""

    shown: set[str] = field(default_factory=set)  # the jobs whose final state scontrol showed

    def row(self, job_id: str) -> Row | None:
        self.look([job_id])
        row = self.rows.get(job_id)
        if row is not None and not row.in_queue and job_id not in self.shown:
            self.ask(["scontrol", "show", "job", "-o", job_id])
            self.shown.add(job_id)
        return row


def local_cluster(*overrides: str) -> SweepConfig:
    """The sweep's configuration on the local cluster (cluster=slurm_local; OVERRIDES: another one of its
    kind, `launcher.slurm.conf=...` of a FSDPBENCH_SLURM_DIR of scripts/slurm_cluster.sh)."""
    return from_dict(compose(["+sweep=smoke", "cluster=slurm_local", "launcher=slurm", *OVERRIDES,
                              *overrides])[0], launcher_sections())


def launcher_for(per_job: bool) -> tuple[SlurmLauncher, collections.Counter[str]]:
    """A Slurm launcher of the local cluster whose every command is counted; per job: main's polling."""
    cfg = local_cluster()
    launcher = SlurmLauncher(cfg)
    if per_job:
        launcher.board = PerJobBoard(launcher.board.ask, least_s=launcher.board.least_s)
    counts: collections.Counter[str] = collections.Counter()
    run = launcher._run

    def counted(argv: list[str], check: bool = True, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
        counts[argv[0]] += 1
        return run(argv, check, env)
    launcher._run = counted  # type: ignore[method-assign]
    return launcher, counts


def sdiag(*args: str) -> subprocess.CompletedProcess:
    """slurmctld's statistics (sdiag) of the local cluster: `-r` resets them (root or SlurmUser only)."""
    conf = local_cluster().launcher.slurm.conf
    return subprocess.run(["sdiag", *args], capture_output=True, text=True,
                          env={**os.environ, **({"SLURM_CONF": conf} if conf else {})})


def rpcs() -> dict[str, int] | None:
    """slurmctld's RPC counts by message type since its last reset, or None where it does not say."""
    proc = sdiag()
    if proc.returncode != 0:
        return None
    part = proc.stdout.split("by message type", 1)[-1].split("by user", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)", part,
                                                                re.M)}


def ended_at(outcome: Any) -> float | None:
    """Slurm's EndTime of the job's last execution (the controller's local time, to the second)."""
    end = outcome.executions[-1].get("end") if outcome.executions else None
    try:
        return dt.datetime.fromisoformat(end).timestamp() if end else None
    except ValueError:
        return None


def one_pass(per_job: bool, jobs: int, shortest_s: float, longest_s: float, tmp: Path) -> dict[str, Any]:
    """Submit `jobs` sleep jobs at once and watch them all to their ends as the runner does."""
    launcher, counts = launcher_for(per_job)
    settings, stop = launcher.cfg.launcher, threading.Event()
    sdiag("-r")
    t0 = time.monotonic()
    flight: dict[str, Any] = {}
    for i in range(jobs):
        seconds = shortest_s + (longest_s - shortest_s) * i / max(jobs - 1, 1)
        run_dir = tmp / f"{'per-job' if per_job else 'one-look'}-{i}"
        argv = ("sbatch", "--parsable", "--oversubscribe", f"--job-name=fsdpbench-polls-{i}",
                f"--output={run_dir}/slurm-%j.log", "--wrap", f"sleep {seconds:.1f}")
        handle = launcher.submit(Submission(run_id=f"polls-{i}", argvs=(argv,)), run_dir)
        flight[handle.job_id] = (handle, watch(settings, launcher, handle, stop))
    states, lags = collections.Counter(), []
    while flight:
        for job_id, (handle, steps) in list(flight.items()):
            try:
                next(steps)
                continue
            except StopIteration as done:
                outcome = done.value
            seen = time.time()
            launcher.cleanup(handle)
            del flight[job_id]
            states[outcome.scheduler_state] += 1
            if (end := ended_at(outcome)) is not None:
                lags.append(seen - end)
        if flight:
            stop.wait(settings.poll_s)
    wall = time.monotonic() - t0
    return {"wall": wall, "counts": counts, "rpcs": rpcs(), "states": states, "lags": lags,
            "poll_s": settings.poll_s}


def line(name: str, got: dict[str, Any]) -> str:
    minutes = got["wall"] / 60
    asked = {cmd: got["counts"][cmd] for cmd in QUERIES if got["counts"][cmd]}
    total = sum(asked.values())
    text = (f"{name}: {got['wall']:.1f} s; launcher requests {total} "
            f"({', '.join(f'{cmd} {n}' for cmd, n in asked.items())}) = {total / minutes:.0f} requests/min")
    if got["rpcs"] is not None:
        served = sum(got["rpcs"].get(name, 0) for name in QUERY_RPCS)
        text += f"; slurmctld query RPCs {served} = {served / minutes:.0f} RPCs/min"
    if got["lags"]:
        lags = sorted(got["lags"])
        text += (f"; end seen after Slurm's EndTime: median {statistics.median(lags):.1f} s, "
                 f"max {lags[-1]:.1f} s")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50, help="jobs in flight at once")
    parser.add_argument("--quick", action="store_true", help="10 jobs of 2-5 s (the slow suite)")
    parser.add_argument("--conf", help="slurm.conf of another local cluster (default: slurm_local's)")
    args = parser.parse_args()
    if args.conf:
        OVERRIDES.append(f"launcher.slurm.conf={args.conf}")
    jobs, shortest_s, longest_s = (10, 2.0, 5.0) if args.quick else (args.jobs, 20.0, 60.0)
    with tempfile.TemporaryDirectory() as tmp:
        passes = {name: one_pass(per_job, jobs, shortest_s, longest_s, Path(tmp))
                  for name, per_job in (("per job (main)", True), ("one look", False))}
    poll_s = passes["one look"]["poll_s"]
    print(f"{jobs} sleep jobs of {shortest_s:g}-{longest_s:g} s in flight at once on the local 4-node Slurm, "
          f"each watched as the runner does (launcher.poll_s={poll_s:g})")
    for name, got in passes.items():
        bad = {state: n for state, n in got["states"].items() if state != "COMPLETED"}
        if bad:
            sys.exit(f"{name}: not every job completed: {dict(got['states'])}")
        print(line(f"{name:>15}", got))
    before, after = (sum(p["counts"][cmd] for cmd in QUERIES) / p["wall"] for p in passes.values())
    print(f"launcher requests per minute, per job over one look: {before / after:.1f}x")


if __name__ == "__main__":
    main()
