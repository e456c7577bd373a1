"""Where a run's wall time goes: one-rank and 2x2 runs of the smoke study, each phase of each run from the
harness's and the worker's own clocks, the median over several runs; with warm workers (the local launcher's
default: each CPU worker forked by the sweep's warm process, its imports done) beside cold ones
(launcher.local.warm_workers=false: each worker imports torch, FSDP2 and transformers itself), and beside
another checkout (`--against REV`, in a git worktree, as it runs by default), in alternating sweeps. The warm
process's own imports are paid once per sweep, by its first CPU run (in that run's launcher start).

Phases (wall-clock times; the worker's from its summary's `timeline`, rank 0's view):
  launcher start   torchrun agent's process start -> the worker process's start (torch's import in the agent,
                   the rendezvous, the spawn)
  worker imports   the worker's process start -> its arguments parsed (the interpreter, torch, the trainer)
  process group    -> init_process_group done
  model + wrap     -> the model built, FSDP-wrapped, materialised, the optimizer made (transformers' import)
  warmup           the warm-up steps (their perf_counter times)
  timed steps      the timed steps (their perf_counter times)
  trace            the profiled steps, writing the trace and splitting it (rank 0's record)
  exit             -> the harness sees the agent exit (summary, barrier, teardown, the agent's exit)
  harness          the harness's own work after a run (logs, collection, the results table, calibration)
                   until it starts the next one
The fixed cost is the wall time less the warm-up, timed steps and trace: what a run costs that is not the
study, paid by every run of a smoke study in a user's CI.

    python benchmarks/run_cost.py [--repeats 5] [--rounds 2] [--against HEAD~3]
    python benchmarks/run_cost.py --quick     # 3 one-rank runs and 1 2x2 run, warm and cold
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core import rundir  # noqa: E402
from bench.core.records import parse_records  # noqa: E402

SHAPES = {  # the smoke's own runs: FULL_SHARD bf16 without AC, one rank; and two nodes of two ranks
    "1x1": ["axes.nodes=[1]", "axes.gpus_per_node=[1]"],
    "2x2": ["axes.nodes=[2]", "axes.gpus_per_node=[2]"],
}
ONE_CONFIG = ["axes.sharding=[FULL_SHARD]", "axes.precision=[bf16_mixed]",
              "axes.activation_checkpointing=[none]", "axes.compile=[false]", "axes.global_batch=[null]",
              "nccl.enabled=false", "exclude=[]",
              "progress=false"]
PHASES = ("launcher start", "worker imports", "process group", "model + wrap", "warmup", "timed steps",
          "trace", "exit", "harness")


def boot_to_unix() -> float:
    """Add to seconds since boot (/proc's clock) to get wall-clock time."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime


def sweep(checkout: Path, overrides: list[str], results: Path, shape: str, repeats: int) -> float:
    """One sweep of `repeats` runs of the shape at that checkout; its wall time."""
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={results}",
                           *SHAPES[shape], *ONE_CONFIG, *overrides, f"repeats={repeats}"], cwd=checkout,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sweep at {checkout} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - began


def run_phases(results: Path, offset: float) -> list[dict[str, float]]:
    """Every run of the sweep, in the order it ran: its phases in seconds (a phase the run's code does not
    stamp is missing)."""
    runs = []
    for run_dir in rundir.iter_run_dirs(results / "smoke"):
        summary = json.loads((run_dir / "summary.json").read_text())
        attempt = rundir.current_attempt_dir(run_dir)
        records = [r for f in sorted((attempt / "records").glob("rank*.jsonl"))
                   for r in parse_records(f.read_text().splitlines())]
        final = next(r for r in records if r["kind"] == "summary" and r.get("rank") == 0)
        ledger = json.loads((run_dir / "ledger.json").read_text())["attempts"][-1]
        agent = min(ledger["job"]["start_times"]) / os.sysconf("SC_CLK_TCK") + offset
        traced = next((r for r in records if r["kind"] == "trace" and r.get("rank") == 0), {})
        runs.append({"agent": agent, "done": agent + summary["wall_s"], "timeline": final.get("timeline", {}),
                     "step_times": final["step_times_s"], "warmup_steps": summary["warmup_steps"],
                     "trace_s": (traced.get("record_s") or 0) + (traced.get("analyse_s") or 0)})
    runs.sort(key=lambda r: r["agent"])
    return [_phases(r, runs[i + 1]["agent"] if i + 1 < len(runs) else None) for i, r in enumerate(runs)]


def _phases(r: dict[str, Any], next_start: float | None) -> dict[str, float]:
    """One run's phases. The steps and the trace come from the records every version writes (the steps'
    perf_counter times, the trace's recording and splitting), so the fixed cost is comparable across
    checkouts; the start-up phases need the summary's `timeline` (a checkout without it shows none)."""
    t, warm = r["timeline"], sum(r["step_times"][:r["warmup_steps"]])
    timed = sum(r["step_times"][r["warmup_steps"]:])
    phases = {"wall": r["done"] - r["agent"], "warmup": warm, "timed steps": timed, "trace": r["trace_s"],
              "harness": next_start - r["done"] if next_start is not None else None}
    if {"process_start", "args", "process_group", "setup", "trace"} <= set(t):
        phases |= {"launcher start": t["process_start"] - r["agent"],
                   "worker imports": t["args"] - t["process_start"],
                   "process group": t["process_group"] - t["args"],
                   "model + wrap": t["setup"] - t["process_group"],
                   "exit": r["done"] - t["trace"]}
    phases["fixed"] = phases["wall"] - warm - timed - r["trace_s"]
    return {k: v for k, v in phases.items() if v is not None}


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in runs for k in r}
    return {k: statistics.median(r[k] for r in runs if k in r) for k in keys}


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT, check=True,
                   capture_output=True)
    return where


def table(columns: dict[str, dict[str, float]]) -> str:
    names = list(columns)
    lines = [f"{'phase (median s)':<18}" + "".join(f"{n:>22}" for n in names)]
    for phase in (*PHASES, "wall", "fixed"):
        cells = [columns[n].get(phase) for n in names]
        lines.append(f"{phase:<18}" + "".join(f"{'-':>22}" if c is None else f"{c:>22.2f}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each shape per sweep")
    parser.add_argument("--rounds", type=int, default=1,
                        help="sweeps of each shape and checkout, alternating")
    parser.add_argument("--against", help="a git revision to measure beside this checkout")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    shapes = {"1x1": 3, "2x2": 1} if args.quick else {s: args.repeats for s in SHAPES}
    tmp = Path(tempfile.mkdtemp(prefix="fsdpbench-run-cost-"))
    checkouts = {"warm": (ROOT, ["launcher.local.warm_workers=true"]),
                 "cold": (ROOT, ["launcher.local.warm_workers=false"])}
    try:
        if args.against:
            checkouts[args.against] = (worktree(args.against, tmp / "against"), [])
        offset = boot_to_unix()
        columns: dict[str, dict[str, float]] = {}
        for shape, repeats in shapes.items():
            per: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
            walls: dict[str, list[float]] = {name: [] for name in checkouts}
            for k in range(args.rounds):
                order = list(checkouts) if k % 2 == 0 else list(reversed(checkouts))
                for name in order:
                    results = tmp / f"{shape}-{k}-{name.replace('/', '_').replace(' ', '_')}"
                    walls[name].append(sweep(*checkouts[name], results, shape, repeats))
                    per[name] += run_phases(results, offset)
            for name in checkouts:
                columns[f"{shape} {name}"] = medians(per[name])
                print(f"{shape} at {name}: {len(per[name])} runs in {args.rounds} sweep(s) of "
                      f"{statistics.median(walls[name]):.1f} s (median)")
        print(table(columns))
        for shape in shapes:
            for name in checkouts:
                print(f"fixed cost {shape} at {name}: {columns[f'{shape} {name}']['fixed']:.2f} s median")
    finally:
        if args.against:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "against")], cwd=ROOT,
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
