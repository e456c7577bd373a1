"""Instrumentation overhead of the worker: the same training loop with and without per-step metric
records and the NVML sampler, run side by side in alternating pairs (target: median ratio <= 1.02).

    python benchmarks/trainer_overhead.py [--pairs 4] [--model tiny_llama] [--nproc 2]
    python benchmarks/trainer_overhead.py --quick    # one pair of 10 steps

On a machine without GPU the sampler has nothing to sample (recorded as such), so the CPU figure covers
the step records, memory queries and device synchronisation; on a GPU it includes the NVML thread.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core.records import parse_records  # noqa: E402


def run(model: str, nproc: int, instrument: bool, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fsdpbench-torchrun-") as logs:  # else torchrun's stay in /tmp
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               f"--log-dir={logs}", "-m", "trainer", "--model", model, "--gpus-per-node", str(nproc),
               "--steps", str(steps), "--warmup-steps", "5", "--seq-len", "128", "--micro-batch", "2",
               "--nvml-interval-s", "0.1"]
        if not instrument:
            cmd.append("--no-instrument")
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return next(r for r in parse_records(out.splitlines()) if r["kind"] == "summary")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--model", default="tiny_llama")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="one pair of 10 steps")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.steps = 1, 10
    ratios, on_times, off_times = [], [], []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)  # alternate who goes first
        result = {flag: run(args.model, args.nproc, flag, args.steps)["step_time_s"] for flag in order}
        on_times.append(result[True])
        off_times.append(result[False])
        ratios.append(result[True] / result[False])
        print(f"pair {i}: instrumented {result[True]:.4f} s/step, plain {result[False]:.4f} s/step, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"median step time: instrumented {statistics.median(on_times):.4f} s, plain "
          f"{statistics.median(off_times):.4f} s; median ratio {statistics.median(ratios):.3f} "
          f"(target <= 1.02) over {args.pairs} pairs of {args.model} x{args.nproc}")
