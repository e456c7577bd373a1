"""What a run's profiler trace costs (trainer/trace_record.py): the wall time the traced steps, writing the
trace and splitting it add to a run, and the disk its traces take, at several simulated node counts (one
rank a node, as the local launcher runs them; all on this machine's cores).

    python benchmarks/trace_cost.py [--nodes 2 16] [--steps 2] [--ranks all|per_node] [--quick]

Each node count trains the same small run twice, without and with a trace, in one torchrun each; the
cost is the difference of their wall times and, from the trace records, the slowest rank's recording and
splitting time and the trace files' bytes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core.records import parse_records  # noqa: E402


def run(nodes: int, trace_steps: int, ranks: str, run_dir: Path) -> tuple[float, list[dict]]:
    """One torchrun of `nodes` one-rank nodes; its wall time and trace records."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nodes}",
           f"--log-dir={run_dir / 'torchelastic'}", "-m", "trainer", "--model", "tiny_llama", "--nodes",
           str(nodes), "--gpus-per-node", "1", "--steps", "4", "--warmup-steps", "1", "--seq-len", "64",
           "--micro-batch", "1", "--precision", "fp32", "--run-dir", str(run_dir)]
    if trace_steps:
        cmd += ["--trace-steps", str(trace_steps), "--trace-ranks", ranks]
    began = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    return time.monotonic() - began, [r for r in parse_records(out.splitlines()) if r["kind"] == "trace"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--ranks", default="all", choices=("all", "per_node"))
    parser.add_argument("--quick", action="store_true", help="2 nodes, one traced step (the slow suite)")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.steps = [2], 1
    print(f"{'nodes':>5} {'plain s':>8} {'traced s':>9} {'added s':>8} {'record s':>9} {'split s':>8} "
          f"{'traces':>6} {'MiB all':>8} {'KiB/rank':>9}")
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as traced_dir:
            plain, _ = run(nodes, 0, args.ranks, Path(plain_dir))
            traced, records = run(nodes, args.steps, args.ranks, Path(traced_dir))
            sizes = [r["bytes"] or 0 for r in records]
            print(f"{nodes:>5} {plain:>8.1f} {traced:>9.1f} {traced - plain:>8.1f} "
                  f"{max(r['record_s'] for r in records):>9.1f} {max(r['analyse_s'] for r in records):>8.1f} "
                  f"{len(records):>6} {sum(sizes) / 2**20:>8.2f} {sum(sizes) / len(sizes) / 2**10:>9.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
