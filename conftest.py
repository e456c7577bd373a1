"""Shared fixtures: real torchrun processes for the worker tests, paths to ../shared reference data."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.core.gpus import local_gpus
from bench.core.records import parse_records
from bench.core.warm import SOCKET_ENV
from bench.launchers.processes import WarmProcess
from trainer.flight import BUFFER_ENV

ROOT = Path(__file__).resolve().parent
SHARED_DATA = Path(os.environ.get("FSDPBENCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
# The full smoke sweep (smoke_full) with two ranks per simulated node: every strategy at 1 and 2 nodes, AC and
# fp32 on FULL_SHARD, the strong-scaling pair (16 training runs) and 6 probes (the one-rank runs are the
# one-GPU CI's and add nothing on CPU)
SMOKE_SHAPE = ["axes.gpus_per_node=[2]", "nccl.gpus_per_node=[2]", "axes.compile=[false]"]
# for a test's sweep whose runs' split nobody reads (the run id is the same: the trace is not in it): a trace
# costs a tiny 2-rank run about 5 s here (benchmarks/trace_cost.py)
UNTRACED = ["trace.enabled=false"]


def alive(pid: int | str) -> bool:
    """Whether a process still runs: neither gone nor a zombie waiting for its reaper (/proc/PID/stat's
    state, after the command name's closing parenthesis)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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


_WARM: list[WarmProcess] = []  # this test process's warm process (pytest_configure)


def pytest_configure(config: pytest.Config) -> None:
    """A process that runs tests starts a warm process (trainer/warm.py, the local sweep's: torch and
    transformers imported once) and names it in its environment, so the workers, memory measurers, census
    and preflight commands its tests start on CPU fork from it instead of importing torch each (a command
    of another interpreter or checkout, a Slurm job's and a sweep's GPU workers still start cold); none
    where there are GPUs, nor in pytest-xdist's controller, which runs no test."""
    xdist_controller = not hasattr(config, "workerinput") and config.getoption("numprocesses", None)
    if local_gpus() or xdist_controller:
        return
    warm = WarmProcess.start(sys.executable, {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
                             str(ROOT))
    _WARM.append(warm)
    os.environ[SOCKET_ENV] = str(warm.socket)


def pytest_unconfigure(config: pytest.Config) -> None:
    for warm in _WARM:
        warm.stop()
    os.environ.pop(SOCKET_ENV, None)


def run_torchrun(module_args: list[str], nproc: int, timeout: float = 240, env: dict | None = None,
                 ) -> WorkerResult:
    """Run `python -m <module> ...` under a real torchrun with `nproc` gloo processes (torchrun's agent and
    the worker's own modules, `trainer`, `trainer.series` and `nccl.probe`, in the session's warm process,
    as a local sweep runs them)."""
    with tempfile.TemporaryDirectory(prefix="fsdpbench-torchrun-") as logs:  # else torchrun's stay in /tmp
        cmd = [sys.executable, "-m", "bench.core.torchrun", "--standalone", f"--nproc-per-node={nproc}",
               "--max-restarts=0", f"--log-dir={logs}", "-m", *module_args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    output = proc.stdout + proc.stderr
    return WorkerResult(proc.returncode, output, list(parse_records(output.splitlines())))


@pytest.fixture
def torchrun():
    return run_torchrun


class Series:
    """Worker runs the test modules declare when they are imported, trained on first use by world size: all
    runs of one world size declared so far in one `python -m trainer.series` under torchrun (the worker's
    own train_run for each, in one process group), instead of a torchrun each. A worker's start-up
    (torch, transformers, rendezvous) is most of a tiny run's time on 2 cores."""

    def __init__(self) -> None:
        self.pending: dict[int, dict[str, list[str]]] = {}  # nproc -> run id -> worker arguments
        self.done: dict[str, WorkerResult] = {}

    def declare(self, args: list[str], nproc: int) -> str:
        """A run to train (worker arguments, without the module); returns its run id. The worker validates
        the arguments when the series runs (trainer.series parses every list before the first run)."""
        from trainer.config import spec_of
        run_id = spec_of(args).run_id
        if run_id not in self.done:  # a trained run is never queued again
            known = self.pending.setdefault(nproc, {}).setdefault(run_id, args)
            assert known == args, f"two runs share the run id {run_id}: {known}, {args}"
        return run_id

    def result(self, args: list[str], nproc: int) -> WorkerResult:
        """The run's records (its run id's), training every pending run of its world size if needed."""
        run_id = self.declare(args, nproc)
        if run_id not in self.done:
            todo = self.pending.pop(nproc)
            whole = run_torchrun(["trainer.series", json.dumps(list(todo.values()))], nproc=nproc,
                                 timeout=900, env={BUFFER_ENV: "20000"})
            for rid in todo:
                self.done[rid] = WorkerResult(whole.returncode, whole.output,
                                              [r for r in whole.records if r.get("run_id") == rid])
        return self.done[run_id]


SERIES = Series()


SLURM_CONF = "/tmp/fsdpbench-slurm/slurm.conf"  # scripts/slurm_cluster.sh's default FSDPBENCH_SLURM_DIR


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The 4-node Slurm test cluster on this machine (real slurmctld and slurmd), started if it is not up;
    one that is up keeps running with its jobs (`start` is idempotent; `restart` is the clean start)."""
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        pytest.skip("slurm-wlm not installed or not root: run scripts/slurm_cluster.sh start as root")
    proc = subprocess.run([str(ROOT / "scripts" / "slurm_cluster.sh"), "start"], capture_output=True,
                          text=True, timeout=180)
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
    """One smoke_full sweep (SMOKE_SHAPE) and its report per test session, in <root>/smoke_full: the tests
    that read a whole study (end to end, resume, the report in a browser, predicted beside measured) share
    it instead of each sweeping again. Tests must not change it (a resume that finds everything done changes
    nothing)."""
    root = tmp_path_factory.mktemp("smoke")
    sweep = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke_full", f"results_root={root}",
                            *SMOKE_SHAPE], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "analysis.report", str(root / "smoke_full")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    return root


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (--dist loadgroup) each test module runs on one worker, so a module's fixtures
    (a memory reference, a sweep) are computed once, not once per worker; the modules that read the
    session's trained runs (conftest.Series) share the group "series" they name themselves."""
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=lambda item: _group(item) not in LONGEST_GROUPS)  # stable: each group keeps its order


# The groups that take longest (the session's trained runs, the fake-against-real memory fixture: over a
# minute each on 2 cores): started first, so that neither is the last to end while the other worker idles
LONGEST_GROUPS = ("series", "trainer.test_memory")


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0] if marker and marker.args else marker.kwargs.get("name", "")) if marker else ""
