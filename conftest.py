"""Shared fixtures: real torchrun processes for the worker tests, paths to ../shared reference data."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.core.records import parse_records

ROOT = Path(__file__).resolve().parent
SHARED_DATA = Path(os.environ.get("FSDPBENCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
# The smoke sweep with two ranks per simulated node: every strategy at 1 and 2 nodes, 14 training runs and 2
# probes (the one-rank runs are the one-GPU CI's and add nothing on CPU)
SMOKE_SHAPE = ["axes.gpus_per_node=[2]", "nccl.gpus_per_node=[2]", "axes.compile=[false]"]


@dataclass
class WorkerResult:
    returncode: int
    output: str
    records: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    @property
    def summary(self) -> dict[str, Any]:
        summaries = self.of_kind("summary")
        assert summaries, f"no summary record; output:\n{self.output[-3000:]}"
        return summaries[0]


def run_torchrun(module_args: list[str], nproc: int, timeout: float = 240, env: dict | None = None,
                 ) -> WorkerResult:
    """Run `python -m <module> ...` under a real torchrun with `nproc` gloo processes."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0", "-m", *module_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    output = proc.stdout + proc.stderr
    return WorkerResult(proc.returncode, output, list(parse_records(output.splitlines())))


@pytest.fixture
def torchrun():
    return run_torchrun


SLURM_CONF = "/tmp/fsdpbench-slurm/slurm.conf"  # scripts/slurm_cluster.sh's default FSDPBENCH_SLURM_DIR


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The 4-node Slurm test cluster on this machine (real slurmctld and slurmd), started if it is not up."""
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        pytest.skip("slurm-wlm not installed or not root: run scripts/slurm_cluster.sh start as root")
    proc = subprocess.run([str(ROOT / "scripts" / "slurm_cluster.sh"), "start"], capture_output=True, text=True,
                          timeout=180)
    if proc.returncode != 0:
        pytest.fail(f"test cluster did not start:\n{proc.stdout}\n{proc.stderr}")
    return SLURM_CONF


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data not found at {SHARED_DATA} (set FSDPBENCH_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory) -> Path:
    """One smoke sweep (SMOKE_SHAPE) and its report per test session: the tests that read a whole study
    (end to end, resume, the report in a browser, predicted beside measured) share it instead of each
    sweeping again. Tests must not change it (a resume that finds everything done changes nothing)."""
    root = tmp_path_factory.mktemp("smoke")
    sweep = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={root}",
                            *SMOKE_SHAPE], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "analysis.report", str(root / "smoke")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    return root
