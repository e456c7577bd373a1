"""Harness overhead: the smoke sweep through `python -m bench.sweep` against the very same runs started
by bare torchrun one after another (the argument lists the sweep rendered), side by side
(target: total wall-time ratio <= 1.10).

Worker run times on this 2-core machine vary by several percent from one launch to the next, so the
script also prints the harness's own time (sweep wall time minus the time its runs' processes were
alive, i.e. Hydra, planning, collection, the results table) and the median per-run ratio of process
lifetimes, which show where a difference in the totals comes from.

    python benchmarks/harness_overhead.py [extra sweep overrides ...]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def sweep(results: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={results}", "progress=false",
                    *extra], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def bare(results: Path, port: int = 29611) -> tuple[float, int, dict[str, float]]:
    """Every run's rendered torchrun commands (one per node, started together), sequentially.

    Returns the wall time, the number of runs whose processes all exited 0 (so a fast failure cannot
    pass for a fast run) and each run's wall time by run dir name."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    subs = sorted((results / "smoke" / "runs").glob("*/submission/submission.json"))
    t0, ok, per_run = time.perf_counter(), 0, {}
    for i, path in enumerate(subs):
        t_run = time.perf_counter()
        argvs = json.loads(path.read_text())["argvs"]
        run_dir = path.parent.parent
        procs = [subprocess.Popen([a.replace("@RDZV_PORT@", str(port + i)).replace(str(run_dir), str(run_dir) + "-bare")
                                   for a in argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for argv in argvs]
        ok += all(p.wait() == 0 for p in procs)
        per_run[run_dir.name] = time.perf_counter() - t_run
    return time.perf_counter() - t0, ok, per_run


if __name__ == "__main__":
    tmp = Path(tempfile.mkdtemp(prefix="fsdpbench-harness-"))
    try:
        extra = sys.argv[1:]
        t_sweep = sweep(tmp / "a", extra)
        t_bare, bare_ok, bare_runs = bare(tmp / "a")
        t_sweep2 = sweep(tmp / "b", extra)
        ratios = []
        for label, results, t in (("sweep 1", tmp / "a", t_sweep), ("sweep 2", tmp / "b", t_sweep2)):
            frame = pd.read_csv(results / "smoke" / "results.csv")
            names = frame["run_dir"].map(lambda d: Path(d).name)
            per_run = [w / bare_runs[n] for w, n in zip(frame["wall_s"], names) if n in bare_runs]
            ratios.append(statistics.median(per_run))
            print(f"{label}: {t:.1f} s, of which run processes {frame['wall_s'].sum():.1f} s and the harness's "
                  f"own work {t - frame['wall_s'].sum():.1f} s ({(t - frame['wall_s'].sum()) / t:.1%}); "
                  f"{(frame['status'] == 'ok').sum()} of {len(frame)} ok")
        print(f"bare torchrun: {t_bare:.1f} s, {bare_ok} of {len(bare_runs)} runs exited 0")
        print(f"total wall-time ratio sweep/bare: {t_sweep / t_bare:.3f} and {t_sweep2 / t_bare:.3f} "
              f"(target <= 1.10); median per-run process-lifetime ratio {ratios[0]:.3f} and {ratios[1]:.3f}")
    finally:
        shutil.rmtree(tmp)
