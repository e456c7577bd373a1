"""Memory before launch, measured: planning time of `p5_scaling --dry-run` with the fake-tensor
measurement cold, cached and off, and for every planned configuration of p5_scaling, p4de_scaling, ablation
and p5_options the measured peak beside the lower bound the planner falls back on (state alone), so the
table shows how much of each peak the fallback cannot see.

The analytic peak formula the measurement replaced was compared the same way before its removal (median
11.9% off, worst -49.0%, 19 of 92 configurations under-estimated): `git checkout ee49b92 && python
benchmarks/memory_plan.py`.

    python benchmarks/memory_plan.py [--cache-dir DIR]   # a fresh DIR measures cold
    python benchmarks/memory_plan.py --quick             # the smoke sweep's configurations alone
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.config import from_dict  # noqa: E402
from bench.predict.memory import MemoryPlanner, lower_bound  # noqa: E402
from bench.plan import expand  # noqa: E402
from bench.sweep import compose  # noqa: E402

SWEEPS = ("p5_scaling", "p4de_scaling", "ablation", "p5_options")


def plan_seconds(cache: Path, *extra: str, sweep: str = "p5_scaling") -> float:
    """Wall time of the CLI's dry run (what a user waits for), in a fresh results root."""
    with tempfile.TemporaryDirectory() as results:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bench.sweep", f"+sweep={sweep}", "--dry-run",
                        f"results_root={results}", f"memory.cache_dir={cache}", *extra], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        return time.perf_counter() - started


BROUGHT = {False: str(ROOT / "bench/core/testdata/hf/mistral_7b_v0.1/config.json"), True: "tiny_mistral"}


def flop_count_cost(sweep: str, model: str) -> None:
    """A brought model's plan counts its FLOPs on fake tensors (trainer.memory.counted_step): what that
    adds to each cold measurement, and to a cached plan (nothing: the count is cached with the peak)."""
    cache = Path(tempfile.mkdtemp(prefix="fsdpbench-memory-"))
    cold = plan_seconds(cache, f"axes.model=[{model}]", sweep=sweep)
    cached = plan_seconds(cache, f"axes.model=[{model}]", sweep=sweep)
    entries = [json.loads(p.read_text()) for p in (cache / "memory").glob("*.json")]
    if not entries or any(e.get("count_s") is None for e in entries):
        sys.exit(f"planning {sweep} with {model} counted no FLOPs")
    counting, measuring = (sum(e[k] for e in entries) for k in ("count_s", "seconds"))
    print(f"{sweep} with a brought model ({Path(model).parent.name or model}): {len(entries)} configurations, "
          f"the FLOP count {counting:.1f} s of {measuring:.1f} s measuring ({counting / measuring:.0%}); "
          f"plan {cold:.1f} s cold, {cached:.1f} s cached")


def compare(sweep: str, cache: Path) -> list[float]:
    """Lower bound / measured for each distinct measured configuration of the sweep, printed as a table."""
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
        bound = lower_bound(p.spec, "-")
        if m.source != "measured":
            print(f"  {p.spec.label:<92} lower bound {bound.gpu_gib:8.1f}   {m.note}")
            continue
        errors.append(bound.gpu_gib / m.gpu_gib)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(m.categories.items(), key=lambda kv: -kv[1]))
        print(f"  {p.spec.label:<92} measured {m.gpu_gib:8.1f}  lower bound {bound.gpu_gib:8.1f} "
              f"({errors[-1]:4.0%})  need {m.need_gib(p.spec):6.1f}  "
              f"{'fits' if p.feasible else 'infeasible'}  ({parts})")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh one (cold)")
    parser.add_argument("--quick", action="store_true", help="the smoke sweep alone (tiny models)")
    args = parser.parse_args()
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="fsdpbench-memory-"))
    sweeps = ("smoke",) if args.quick else SWEEPS
    cold, cached = plan_seconds(cache, sweep=sweeps[0]), plan_seconds(cache, sweep=sweeps[0])
    off = plan_seconds(cache, "memory.measure=false", sweep=sweeps[0])
    print(f"planning {sweeps[0]} --dry-run: {cold:.1f} s cold (measuring), {cached:.1f} s cached, "
          f"{off:.1f} s with memory.measure=false")
    flop_count_cost(sweeps[0], BROUGHT[args.quick])
    everything = []
    for sweep in sweeps:
        errors = compare(sweep, cache)
        everything += errors
        if errors:
            print(f"  {sweep}: {len(errors)} configurations measured; the lower bound is a median "
                  f"{statistics.median(errors):.0%} of the peak (min {min(errors):.0%}, "
                  f"max {max(errors):.0%})")
    if not everything:
        sys.exit("no configuration was measured: the lower bound is compared with nothing")
    print(f"\nall {len(sweeps)}: {len(everything)} configurations measured; lower bound / peak median "
          f"{statistics.median(everything):.0%}, min {min(everything):.0%}")


if __name__ == "__main__":
    main()
