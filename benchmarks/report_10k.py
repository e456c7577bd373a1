"""Report speed: a synthetic results tree of 10,000 runs (target: loaded and reported in < 20 s), and
the report of real smoke results (target: < 10 s), each as a fresh `python -m analysis.report` process.

    python benchmarks/report_10k.py [results/smoke]
    python benchmarks/report_10k.py --quick    # 300 synthetic runs, no smoke results
"""
from __future__ import annotations

import argparse
import itertools
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core import rundir  # noqa: E402
from bench.core.schema import RunSpec, RunSummary  # noqa: E402
from bench.run.collect import write_results  # noqa: E402


def synthesize(sweep_dir: Path, n_runs: int = 10_000) -> None:
    """Run dirs with summaries (ok, with some failures; loss curves, wall times) and five all-reduce probes,
    and the results table, as a sweep leaves them."""
    rng = random.Random(0)
    axes = itertools.product(range(1000), ["llama2_7b", "llama2_13b", "llama2_70b", "llama3_1_8b"],
                             ["FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD"],
                             ["bf16_mixed", "fp32"], ["none", "full"], [1, 2, 4, 8, 16])
    for repeat, model, sharding, precision, ac, nodes in itertools.islice(axes, n_runs):  # every config first
        spec = RunSpec(model=model, nodes=nodes, gpus_per_node=8, sharding=sharding, precision=precision,
                       activation_checkpointing=ac, repeat=repeat, cluster="p5.48xlarge", seq_len=4096)
        ok = rng.random() > 0.05
        tps = 3000.0 * nodes * 8 * (0.9 ** (nodes.bit_length() - 1)) * rng.uniform(0.95, 1.05)
        summary = RunSummary(run_id=spec.run_id, sweep=sweep_dir.name, status="ok" if ok else "oom",
                             spec=spec, tokens_per_s=tps if ok else None,
                             tflops_per_gpu=tps * 4e-11 if ok else None, mfu=tps * 4e-14 if ok else None,
                             mem_peak_alloc_gib=40.0 if ok else None,
                             pred_mem_gib=38.0, pred_mem_source="measured", step_time_s=1.0 if ok else None,
                             error=None if ok else "OutOfMemoryError: CUDA out of memory", wall_s=300.0,
                             extra={"losses": [11.0 - 0.1 * i for i in range(10)]} if ok else {})
        d = rundir.run_dir(sweep_dir, spec)
        rundir.write_summary(d, summary)
    for nodes in (1, 2, 4, 8, 16):  # all-reduce probes, so the communication model has bandwidths
        spec = RunSpec(kind="nccl", model="none", nodes=nodes, gpus_per_node=8, efa_per_node=0,
                       cluster="p5.48xlarge")
        sizes = [{"size": 8 << k, "busbw": 400.0 / nodes * k / 30, "algbw": 1.0, "time_us": 1.0}
                 for k in range(30)]
        rundir.write_summary(rundir.run_dir(sweep_dir, spec), RunSummary(
            run_id=spec.run_id, sweep=sweep_dir.name, status="ok", spec=spec,
            nccl_busbw_max_gbs=400.0 / nodes, wall_s=60.0, extra={"sizes": sizes}))
    write_results(sweep_dir)


def timed_report(path: Path, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "analysis.report", str(path), "--out", str(out)], cwd=ROOT,
                   check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("smoke", nargs="?", type=Path, default=ROOT / "results" / "smoke")
    parser.add_argument("--quick", action="store_true", help="300 synthetic runs, no smoke results")
    args = parser.parse_args()
    n_runs = 300 if args.quick else 10_000
    tmp = Path(tempfile.mkdtemp(prefix="fsdpbench-report-"))
    try:
        sweep = tmp / "synthetic"
        t0 = time.perf_counter()
        synthesize(sweep, n_runs)
        made = sum(1 for _ in rundir.iter_run_dirs(sweep))
        if made != n_runs + 5:  # the runs and five probes: the axes must still hold that many
            sys.exit(f"synthesized {made} run dirs, not {n_runs} runs and 5 probes")
        print(f"synthesized {n_runs:,} runs in {time.perf_counter() - t0:.1f} s")
        print(f"report of {n_runs:,} runs (results table): {timed_report(sweep, tmp / 'r1'):.1f} s "
              "(target < 20 s)")
        (sweep / rundir.RESULTS_PARQUET).unlink()
        (sweep / rundir.RESULTS_CSV).unlink()
        print(f"report of {n_runs:,} runs (rebuilt from run dirs): {timed_report(sweep, tmp / 'r2'):.1f} s "
              "(target < 20 s)")
        if not args.quick and args.smoke.is_dir():
            times = sorted(timed_report(args.smoke, tmp / "r3") for _ in range(3))
            print(f"report of {args.smoke}: median {times[1]:.1f} s over 3 (target < 10 s)")
        elif not args.quick:
            print(f"no smoke results at {args.smoke}: run `python -m bench.sweep +sweep=smoke` first")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
