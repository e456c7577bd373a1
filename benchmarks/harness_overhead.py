"""Harness overhead: the smoke sweep through `python -m bench.sweep` against the very same runs started
by bare torchrun one after another (the argument lists the sweep rendered), side by side
(target: total wall-time ratio <= 1.10).

    python benchmarks/harness_overhead.py [extra sweep overrides ...]
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sweep(results: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={results}", "progress=false",
                    *extra], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def bare(results: Path, port: int = 29611) -> float:
    """Every run's rendered torchrun commands (one per node, started together), sequentially."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    subs = sorted((results / "smoke" / "runs").glob("*/submission/submission.json"))
    t0 = time.perf_counter()
    for i, path in enumerate(subs):
        argvs = json.loads(path.read_text())["argvs"]
        run_dir = path.parent.parent
        procs = [subprocess.Popen([a.replace("@RDZV_PORT@", str(port + i)).replace(str(run_dir), str(run_dir) + "-bare")
                                   for a in argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for argv in argvs]
        for p in procs:
            p.wait()
    return time.perf_counter() - t0


if __name__ == "__main__":
    tmp = Path(tempfile.mkdtemp(prefix="fsdpbench-harness-"))
    try:
        extra = sys.argv[1:]
        t_sweep = sweep(tmp / "a", extra)
        t_bare = bare(tmp / "a")
        t_sweep2 = sweep(tmp / "b", extra)
        runs = len(list((tmp / "a" / "smoke" / "runs").glob("*/summary.json")))
        median_sweep = sorted([t_sweep, t_sweep2])[0]
        print(f"{runs} runs: sweep {t_sweep:.1f} s and {t_sweep2:.1f} s, bare torchrun {t_bare:.1f} s; "
              f"ratio {t_sweep / t_bare:.3f} and {t_sweep2 / t_bare:.3f} (target <= 1.10)")
    finally:
        shutil.rmtree(tmp)
