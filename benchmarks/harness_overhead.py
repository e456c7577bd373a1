"""Harness overhead: the smoke sweep through `python -m bench.sweep` against the very same runs started
by bare torchrun one after another (the argument lists the sweep rendered), side by side
(target: total wall-time ratio <= 1.10).

Worker run times on this 2-core machine vary by several percent from one launch to the next, so the
script also prints the harness's own time (sweep wall time minus the time its runs' processes were
alive, i.e. Hydra, planning, collection, the results table) and the median per-run ratio of process
lifetimes, which show where a difference in the totals comes from.

    python benchmarks/harness_overhead.py [extra sweep overrides ...]
    python benchmarks/harness_overhead.py --quick    # 2 runs (FULL_SHARD bf16 at 1 and 2 nodes), one sweep
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
sys.path.insert(0, str(ROOT))

from bench.core import rundir  # noqa: E402

QUICK = ["axes.gpus_per_node=[2]", "axes.global_batch=[null]", "axes.compile=[false]",
         "axes.sharding=[FULL_SHARD]",
         "axes.precision=[bf16_mixed]", "axes.activation_checkpointing=[none]", "nccl.enabled=false"]


def sweep(results: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={results}",
                    "progress=false", *extra], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def bare(results: Path, port: int = 29611) -> tuple[float, int, dict[str, float]]:
    """Every run's rendered torchrun commands (one per node, started together), sequentially.

    Returns the wall time, the number of runs whose processes all exited 0 (so a fast failure cannot
    pass for a fast run) and each run's wall time by run dir name."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run_dirs = sorted(rundir.iter_run_dirs(results / "smoke"))
    t0, ok, per_run = time.perf_counter(), 0, {}
    for i, run_dir in enumerate(run_dirs):
        t_run = time.perf_counter()
        path = rundir.current_attempt_dir(run_dir) / rundir.SUBMISSION_DIR / "submission.json"
        argvs = json.loads(path.read_text())["argvs"]
        procs = [subprocess.Popen([a.replace("@RDZV_PORT@", str(port + i))
                                   .replace(str(run_dir), str(run_dir) + "-bare")
                                   for a in argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for argv in argvs]
        ok += all(p.wait() == 0 for p in procs)
        per_run[run_dir.name] = time.perf_counter() - t_run
    return time.perf_counter() - t0, ok, per_run


if __name__ == "__main__":
    tmp = Path(tempfile.mkdtemp(prefix="fsdpbench-harness-"))
    try:
        quick = "--quick" in sys.argv[1:]
        extra = QUICK if quick else sys.argv[1:]
        t_sweep = sweep(tmp / "a", extra)
        t_bare, bare_ok, bare_runs = bare(tmp / "a")
        t_sweep2 = t_sweep if quick else sweep(tmp / "b", extra)
        sweeps = [("sweep 1", tmp / "a", t_sweep)] + ([] if quick else [("sweep 2", tmp / "b", t_sweep2)])
        ratios = []
        for label, results, t in sweeps:
            frame = pd.read_csv(results / "smoke" / "results.csv")
            names = frame["run_dir"].map(lambda d: Path(d).name)
            per_run = [w / bare_runs[n] for w, n in zip(frame["wall_s"], names) if n in bare_runs]
            ratios.append(statistics.median(per_run))
            print(f"{label}: {t:.1f} s, of which run processes {frame['wall_s'].sum():.1f} s and the "
                  f"harness's own work {t - frame['wall_s'].sum():.1f} s "
                  f"({(t - frame['wall_s'].sum()) / t:.1%}); "
                  f"{(frame['status'] == 'ok').sum()} of {len(frame)} ok")
        print(f"bare torchrun: {t_bare:.1f} s, {bare_ok} of {len(bare_runs)} runs exited 0")
        print(f"total wall-time ratio sweep/bare: {t_sweep / t_bare:.3f} and {t_sweep2 / t_bare:.3f} "
              f"(target <= 1.10); median per-run process-lifetime ratio {ratios[0]:.3f} and {ratios[-1]:.3f}")
        if bare_ok != len(bare_runs) or not bare_runs:
            sys.exit(f"{len(bare_runs) - bare_ok} of {len(bare_runs)} bare runs failed: the comparison "
                     "is void")
    finally:
        shutil.rmtree(tmp)
