"""Runs side by side within a node budget, a ledger that survives `kill -9`, one sweep per results dir.

Real processes throughout: the sweep, torchrun agents and workers in the sleep test mode (a set duration,
so the 2 cores do not decide when a run ends), or real training where a summary matters. Overlap is
judged from the times the workers themselves printed, not from the harness's own bookkeeping.
"""
from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.core import faults, rundir
from conftest import SMOKE_SHAPE

ROOT = Path(__file__).resolve().parents[2]
# The smoke sweep's two-ranks-per-node eager runs only (the shape these tests count on); the one-rank runs
# a one-GPU machine trains on its GPU are planned and run by the README's sweep.
SLEEP_LINE = re.compile(r"fsdpbench test mode: sleeping .* from (\d+\.\d+)|slept until (\d+\.\d+)")


def sweep_argv(results: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bench.sweep", "+sweep=smoke_full", f"results_root={results}", *SMOKE_SHAPE,
            *args]


def run_sweep(results: Path, *args: str, timeout: float = 600,
              rules: str = "") -> subprocess.CompletedProcess:
    """The smoke's sweep, its workers given the test hook's fault `rules`."""
    return subprocess.run(sweep_argv(results, *args), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=faults.environ(rules))


def intervals(sweep_dir: Path) -> dict[str, tuple[float, float, int, str]]:
    """run id -> (first worker start, last worker end, nodes, kind) from the workers' own lines."""
    out = {}
    for d in rundir.iter_run_dirs(sweep_dir):
        stamps = [float(a or b) for log in rundir.current_attempt_dir(d).glob("logs/*.log")
                  for a, b in SLEEP_LINE.findall(log.read_text())]
        spec = rundir.read_spec(d)
        if stamps:
            out[spec.run_id] = (min(stamps), max(stamps), spec.nodes, spec.kind)
    return out


def overlaps(a: tuple[float, float, int, str], b: tuple[float, float, int, str]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def max_nodes_in_flight(spans: dict[str, tuple[float, float, int, str]]) -> int:
    events = sorted([(s, n) for s, _, n, _ in spans.values()] + [(e, -n) for _, e, n, _ in spans.values()],
                    key=lambda ev: (ev[0], ev[1]))
    busy = peak = 0
    for _, delta in events:
        busy += delta
        peak = max(peak, busy)
    return peak


SLEEPY = ["axes.global_batch=[null]",
          "axes.nodes=[1,2]", "axes.sharding=[FULL_SHARD]", "axes.activation_checkpointing=[none]",
          "axes.precision=[fp32,bf16_mixed]",
          "nccl.collectives=[all_reduce]"]  # one probe per node count, as the spans below count them


@pytest.mark.slow  # a real sweep or a whole deep model: minutes on 2 cores (CI runs it)
def test_runs_overlap_within_the_budget_and_full_width_runs_and_probes_run_alone(tmp_path: Path) -> None:
    """Budget 2 nodes: the 1-node runs share it, a 2-node run (the whole budget) and every probe run alone."""
    proc = run_sweep(tmp_path, *SLEEPY, "launcher.max_nodes=2",
                     rules="[{match: {}, fault: sleep, seconds: 3}]")
    assert proc.returncode == 1, proc.stderr[-2000:]  # sleep-mode runs report no summary: failed, by design
    spans = intervals(tmp_path / "smoke_full")
    assert len(spans) == 6  # 4 training runs, 2 probes, every one really ran
    small = [v for v in spans.values() if v[3] == "train" and v[2] == 1]
    assert len(small) == 2 and overlaps(*small)
    for key, span in spans.items():
        if span[3] == "nccl" or span[2] == 2:
            assert not any(overlaps(span, other) for k, other in spans.items() if k != key), span
    assert max_nodes_in_flight(spans) <= 2
    assert "nodes 2/2 busy" in proc.stdout  # the progress view shows the budget in use


@pytest.mark.slow  # 15 s on 2 cores: a 2-run sweep whose runs each sleep 2 s
def test_without_a_budget_local_runs_one_at_a_time(tmp_path: Path) -> None:
    proc = run_sweep(tmp_path, *SLEEPY, "nccl.enabled=false", "axes.precision=[fp32]",
                     rules="[{match: {}, fault: sleep, seconds: 2}]")
    assert proc.returncode == 1, proc.stderr[-2000:]
    spans = list(intervals(tmp_path / "smoke_full").values())
    assert len(spans) == 2 and not overlaps(*spans)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.3)


def _group_members(pgids: list[int]) -> list[str]:
    """The live processes of these process groups ("pid state command"). A zombie is dead: it waits for a
    reaper (whatever runs as PID 1 in a container may be slow to reap orphans) and holds nothing but a pid."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid_comm, _, rest = stat.read_text().rpartition(")")
        except OSError:  # ended while listed
            continue
        state, _, pgrp = rest.split()[:3]
        if int(pgrp) in pgids and state not in ("Z", "X"):
            found.append(f"{stat.parent.name} {state} {pid_comm.partition('(')[2]}")
    return found


# Two runs whose order holds on any machine: runs start longest first (bench.run.schedule), and a full AC run
# recomputes its forward pass, so it is predicted longer than the same run without AC whatever the device's
# speed for each dtype (which moves an fp32 run before or after a bf16 one with the CPU's 16-bit units).
ONE_NODE = ["axes.global_batch=[null]",
            "axes.nodes=[1]", "axes.sharding=[FULL_SHARD]", "axes.activation_checkpointing=[full,none]",
            "nccl.enabled=false", "steps=3", "warmup_steps=1", "axes.precision=[fp32]"]


@pytest.mark.slow  # a real sweep or a whole deep model: minutes on 2 cores (CI runs it)
def test_kill_9_leaves_no_worker_a_table_and_one_attempt_on_resume(tmp_path: Path) -> None:
    rules = ("[{match: {activation_checkpointing: full}, fault: sleep, seconds: 1}, "
             "{match: {activation_checkpointing: none}, fault: hang}]")
    sweep = subprocess.Popen(sweep_argv(tmp_path, *ONE_NODE), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=faults.environ(rules))
    runs = tmp_path / "smoke_full" / "runs"
    hung = lambda: [d for d in runs.glob("*-noac-*") if any(  # noqa: E731
        r["kind"] == "step" for r in rundir.read_records(d))]
    _wait_for(lambda: runs.is_dir() and hung(), 240, "the hanging run never trained")
    sweep.send_signal(signal.SIGKILL)
    sweep.wait(timeout=30)
    job = rundir.read_ledger(hung()[0])[-1]["job"]
    with contextlib.suppress(TimeoutError):
        _wait_for(lambda: not _group_members(job["pgids"]), 60, "")
    left = _group_members(job["pgids"])
    assert not left, f"workers outlived the sweep: {left}"
    assert not subprocess.run(["pgrep", "-f", str(runs)], capture_output=True, text=True).stdout.split()
    # The table was written after the first run ended, and matches the run dirs' summaries.
    table = pd.read_csv(tmp_path / "smoke_full" / rundir.RESULTS_CSV)
    summaries = [s for d in rundir.iter_run_dirs(tmp_path / "smoke_full") if (s := rundir.read_summary(d))]
    assert sorted(table.run_id) == sorted(s.run_id for s in summaries) and len(summaries) == 1
    # The lock died with the sweep: the same command resumes; the killed run gets a second attempt, and
    # its summary, records and logs are that attempt's alone.
    done = run_sweep(tmp_path, *ONE_NODE)
    assert "ok 1" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    d = hung()[0]
    summary = rundir.read_summary(d)
    assert summary.status == "ok" and summary.attempt == 2
    records = rundir.read_records(d)
    assert [r["kind"] for r in records].count("summary") == 1
    assert [r["kind"] for r in records if r.get("rank") == 0].count("meta") == 1
    ledger = rundir.read_ledger(d)
    assert [a["attempt"] for a in ledger] == [1, 2] and "ended_at" in ledger[0]


def test_a_second_sweep_on_the_same_dir_exits_2_and_launches_nothing(tmp_path: Path) -> None:
    first = subprocess.Popen(sweep_argv(tmp_path, *ONE_NODE), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=faults.environ("[{match: {}, fault: hang}]"))
    try:
        runs = tmp_path / "smoke_full" / "runs"
        _wait_for(lambda: any(runs.glob("*/ledger.json")), 120, "the first sweep never submitted")
        started = time.monotonic()
        second = run_sweep(tmp_path, *ONE_NODE, timeout=60)
        assert second.returncode == 2 and time.monotonic() - started < 30
        assert second.stderr.count("\n") == 1 and f"pid {first.pid}" in second.stderr
        attempts = [a for d in runs.iterdir() for a in rundir.read_ledger(d)]
        assert len(attempts) == 1  # only the first sweep's one run in flight
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 130
    assert json.loads(next(runs.glob("*/summary.json")).read_text())["status"] == "cancelled"
