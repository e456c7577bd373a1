"""scripts/slurm_cluster.sh on the real local cluster: `start` on a cluster that is up leaves it running,
its jobs with it (a second `start` from another shell or a test fixture once lost every queued and running
job); a node daemon that is gone is started again without touching the controller's jobs."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"


def _slurm(conf: str, *argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=60,
                          env={**os.environ, "SLURM_CONF": conf}).stdout.strip()


def _job(conf: str, job: str) -> str:
    """"<state> <nodes> <start time>" of one job ("" once it left the queue)."""
    return _slurm(conf, "squeue", "-h", "-j", job, "-o", "%T %N %S")


@pytest.mark.slurm
@pytest.mark.slow  # a real cluster
def test_start_again_leaves_a_running_job_running(slurm_cluster: str) -> None:
    conf = slurm_cluster
    job = _slurm(conf, "sbatch", "--parsable", "-N", "2", "-J", "fsdpbench-test-start-again",
                 "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        deadline = time.monotonic() + 60
        while not _job(conf, job).startswith("RUNNING") and time.monotonic() < deadline:
            time.sleep(1)
        before = _job(conf, job)
        assert before.startswith("RUNNING"), before
        proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [
            "slurm cluster already up and healthy: left running, with its jobs", f"export SLURM_CONF={conf}"]
        assert _job(conf, job) == before  # the same job, on the same nodes, from the same start

        # a node daemon gone (one the job does not use): start brings it back, the job runs on
        used = _slurm(conf, "scontrol", "show", "hostnames", before.split()[1]).split()
        idle = next(n for n in _slurm(conf, "sinfo", "-h", "-N", "-o", "%N").split() if n not in used)
        pidfile = Path(conf).parent / f"slurmd.{idle}.pid"
        os.kill(int(pidfile.read_text()), 15)  # the slurmd the script started, by its pid file
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(pidfile):
            time.sleep(0.2)
        proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [
            "slurm cluster already up: 1 node daemon(s) started again, jobs kept: 4 nodes answering",
            f"export SLURM_CONF={conf}"]
        assert _alive(pidfile) and _job(conf, job) == before
    finally:
        subprocess.run(["scancel", job], env={**os.environ, "SLURM_CONF": conf}, check=False)


def _alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False
