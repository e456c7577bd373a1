"""Memory before launch, measured: planning time of `p5_scaling --dry-run` with the fake-tensor
measurement cold, cached and off, and the analytic estimate against the measured peak for every planned
configuration of p5_scaling, p4de_scaling, ablation and p5_options.

    python benchmarks/memory_plan.py [--cache-dir DIR]   # a fresh DIR measures cold (about 30 min on 2 cores)
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.config import from_dict  # noqa: E402
from bench.memory import MemoryPlanner  # noqa: E402
from bench.plan import expand  # noqa: E402
from bench.sweep import compose  # noqa: E402

SWEEPS = ("p5_scaling", "p4de_scaling", "ablation", "p5_options")


def plan_seconds(cache: Path, *extra: str) -> float:
    """Wall time of the CLI's dry run (what a user waits for), in a fresh results root."""
    with tempfile.TemporaryDirectory() as results:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=p5_scaling", "--dry-run",
                        f"results_root={results}", f"memory.cache_dir={cache}", *extra], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        return time.perf_counter() - started


def compare(sweep: str, cache: Path) -> list[float]:
    """Analytic / measured - 1 for each distinct measured configuration of the sweep, printed as a table."""
    raw, _ = compose([f"+sweep={sweep}", f"memory.cache_dir={cache}"])
    cfg = from_dict(raw)
    seen, errors = set(), []
    print(f"\n{sweep} ({cfg.cluster.name}):")
    for p in expand(cfg, MemoryPlanner(cfg, out=sys.stderr)):
        m = p.memory
        key = (p.spec.model, p.spec.nodes, p.spec.sharding, p.spec.precision, p.spec.activation_checkpointing,
               p.spec.wrap_policy, p.spec.offload, p.spec.micro_batch, p.spec.seq_len)
        if m is None or key in seen:
            continue
        seen.add(key)
        if m.source != "measured":
            print(f"  {p.spec.label:<92} analytic {m.analytic_gib:8.1f}   {m.note}")
            continue
        errors.append(m.analytic_gib / m.gpu_gib - 1)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(m.categories.items(), key=lambda kv: -kv[1]))
        print(f"  {p.spec.label:<92} analytic {m.analytic_gib:8.1f}  measured {m.gpu_gib:8.1f}  "
              f"{errors[-1]:+7.1%}  ({parts})")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh one (cold)")
    args = parser.parse_args()
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="fsdpbench-memory-"))
    cold, cached = plan_seconds(cache), plan_seconds(cache)
    off = plan_seconds(cache, "memory.measure=false")
    print(f"planning p5_scaling --dry-run: {cold:.1f} s cold (measuring), {cached:.1f} s cached, "
          f"{off:.1f} s with memory.measure=false")
    everything = []
    for sweep in SWEEPS:
        errors = compare(sweep, cache)
        everything += errors
        if errors:
            print(f"  {sweep}: {len(errors)} configurations, median |analytic - measured| "
                  f"{statistics.median(map(abs, errors)):.1%}, worst {max(errors, key=abs):+.1%}, "
                  f"{sum(abs(e) <= 0.10 for e in errors)} within 10%")
    within = sum(abs(e) <= 0.10 for e in everything)
    print(f"\nall four: {len(everything)} configurations, median "
          f"{statistics.median(map(abs, everything)):.1%}, worst {max(everything, key=abs):+.1%}, "
          f"{within} within 10%")


if __name__ == "__main__":
    main()
