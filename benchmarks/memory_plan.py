"""Memory before launch, measured: planning time of `p5_scaling --dry-run` with the fake-tensor
measurement cold, cached and off, and for every planned configuration of p5_scaling, p4de_scaling, ablation
and p5_options the measured peak beside the lower bound the planner falls back on (state alone), so the
table shows how much of each peak the fallback cannot see. A brought model's costs: its FLOP count (Mistral
7B, in each measurement) and a census (Qwen3 0.6B, a family with no formula, counted before it is planned).

How far off the analytic peak formula the measurement replaced was, measured the same way:
benchmarks/evidence/README.md, "Memory before launch".

The planner measures a deep model on two shallow copies of it and one configuration per shard group
(trainer/memory.py and bench/predict/memory.py say why both are exact). --check proves it: every measured
configuration of the four sweeps stepped whole at its own world size, beside what the planner measured,
equal within 0.5% or the script exits 1 (about 40 minutes on 2 cores: Llama 2 70B on 128 ranks stepped
whole takes two minutes).

    python benchmarks/memory_plan.py [--cache-dir DIR]   # a fresh DIR measures cold
    python benchmarks/memory_plan.py --check [--sweeps S ...]  # the planner's figures against whole steps
    python benchmarks/memory_plan.py --quick [--check]   # the smoke sweep's configurations alone
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core.load_config import from_dict  # noqa: E402
from bench.core.models import model_source  # noqa: E402
from bench.launchers import launcher_sections  # noqa: E402
from bench.predict.memory import (  # noqa: E402
    CUBLAS_WORKSPACE_GIB,
    MEMORY_FIELDS,
    MemoryPlanner,
    lower_bound,
    measure_in_workers,
)
from bench.study.plan import expand  # noqa: E402
from bench.sweep import compose  # noqa: E402

SWEEPS = ("p5_scaling", "p4de_scaling", "ablation", "p5_options")
QUICK_CHECK = ("axes.model=[small_llama]",)  # on the smoke sweep: 8 blocks, measured on 3 and 4
CHECK_TOLERANCE = 0.005


@contextlib.contextmanager
def fresh_cache() -> Iterator[Path]:
    """An empty memory cache for a cold plan, removed afterwards (a benchmark leaves nothing in /tmp)."""
    with tempfile.TemporaryDirectory(prefix="fsdpbench-memory-") as cache:
        yield Path(cache)


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
    with fresh_cache() as cache:
        cold = plan_seconds(cache, f"axes.model=[{model}]", sweep=sweep)
        cached = plan_seconds(cache, f"axes.model=[{model}]", sweep=sweep)
        entries = [json.loads(p.read_text()) for p in (cache / "memory").glob("*.json")]
    if not entries or any(e.get("count_s") is None for e in entries):
        sys.exit(f"planning {sweep} with {model} counted no FLOPs")
    counting, measuring = (sum(e[k] for e in entries) for k in ("count_s", "seconds"))
    name = Path(model).parent.name or model
    print(f"{sweep} with a brought model ({name}): {len(entries)} configurations, "
          f"the FLOP count {counting:.1f} s of {measuring:.1f} s measuring ({counting / measuring:.0%}); "
          f"plan {cold:.1f} s cold, {cached:.1f} s cached")


COUNTED = {False: str(ROOT / "bench/core/testdata/hf/qwen3_0_6b/config.json"), True: "tiny_qwen3"}


def census_cost(sweep: str, model: str) -> None:
    """A family with no formula is counted from the model before it is planned (python -m trainer.census):
    the census alone, and the plan with it cold and cached (the census is cached too)."""
    name, config = model_source(model)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainer.census"], input=config + "\n", text=True, cwd=ROOT,
                   capture_output=True, check=True)
    counting = time.perf_counter() - started
    with fresh_cache() as cache:
        cold = plan_seconds(cache, f"axes.model=[{model}]", sweep=sweep)
        cached = plan_seconds(cache, f"axes.model=[{model}]", sweep=sweep)
        censused = list((cache / "census").glob("*.json"))
    if not censused:
        sys.exit(f"planning {sweep} with {model} took no census")
    print(f"{sweep} with {name} ({json.loads(config)['model_type']}, counted from the model): the census "
          f"{counting:.1f} s (a process of its own); plan {cold:.1f} s cold, {cached:.1f} s cached")


def compare(sweep: str, cache: Path) -> list[float]:
    """Lower bound / measured for each distinct measured configuration of the sweep, printed as a table."""
    raw, _ = compose([f"+sweep={sweep}", f"memory.cache_dir={cache}"])
    cfg = from_dict(raw, launcher_sections())
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


def planned_and_whole(sweep: str, cache: Path, *extra: str) -> list[tuple[str, float, float, dict]]:
    """(label, planned peak, whole peak, whole record) for each configuration of the sweep the planner
    measured: the planner's figure from the cache, and the same spec stepped whole at its own world size."""
    raw, _ = compose([f"+sweep={sweep}", f"memory.cache_dir={cache}", *extra])
    cfg = from_dict(raw, launcher_sections())
    planned = {p.spec.run_id: (p.spec, p.memory) for p in expand(cfg, MemoryPlanner(cfg, out=sys.stderr))
               if p.memory is not None and p.memory.source == "measured"}
    distinct = {json.dumps([s.to_dict()[k] for k in (*MEMORY_FIELDS, "model_config")]): s
                for s, _ in planned.values()}  # by world size, not shard group: each checked
    specs = sorted(distinct.values(), key=lambda s: -s.arch.layers * s.world_size)
    rows = []
    cuda = cfg.cluster.gpu is not None  # measured as the planner does for a GPU cluster, workspace included
    args, workspace = (("--whole", "--cuda"), CUBLAS_WORKSPACE_GIB) if cuda else (("--whole",), 0.0)
    for spec, record in measure_in_workers(specs, cfg.memory.workers, 3600, args=args):
        if "error" in record:
            sys.exit(f"{spec.label}: the whole step failed: {record['error']}")
        rows.append((spec.label, planned[spec.run_id][1].gpu_gib, record["peak_gib"] + workspace, record))
        print(f"  {rows[-1][0]:<92} planned {rows[-1][1]:8.3f}  whole {rows[-1][2]:8.3f} GiB "
              f"({record['seconds']:.0f} s)", file=sys.stderr, flush=True)
    return rows


def check(sweeps: tuple[str, ...], *extra: str) -> bool:
    """Every configuration the planner measures, as it measures them (shallow copies, one per shard group)
    and whole at its own world size: equal within CHECK_TOLERANCE, and what each way costs."""
    with fresh_cache() as cache:
        started = time.perf_counter()
        for sweep in sweeps:  # the planner's way first, cold: its cost is the planning a user waits for
            raw = compose([f"+sweep={sweep}", f"memory.cache_dir={cache}", *extra])[0]
            cfg = from_dict(raw, launcher_sections())
            list(expand(cfg, MemoryPlanner(cfg, out=sys.stderr)))
        planning = time.perf_counter() - started
        rows = [row for sweep in sweeps for row in planned_and_whole(sweep, cache, *extra)]
        entries = len(list((cache / "memory").glob("*.json")))
    errors = [abs(planned / whole - 1) for _, planned, whole, _ in rows]
    whole_s = sum(record["seconds"] for *_, record in rows)
    worst = max(range(len(rows)), key=errors.__getitem__)
    print(f"check over {', '.join(sweeps)}: {len(rows)} configurations measured whole at their own world "
          f"size ({whole_s:.0f} s of measuring) against the planner's {entries} shallow measurements "
          f"({planning:.0f} s cold, {cfg.memory.workers} processes): max |difference| "
          f"{errors[worst]:.2e} ({rows[worst][0]}), median {statistics.median(errors):.2e}; "
          f"{sum(e <= CHECK_TOLERANCE for e in errors)} of {len(rows)} within {CHECK_TOLERANCE:.1%}")
    return all(e <= CHECK_TOLERANCE for e in errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh one (cold)")
    parser.add_argument("--quick", action="store_true", help="the smoke sweep alone (tiny models)")
    parser.add_argument("--check", action="store_true", help="the planner's peaks against whole steps")
    parser.add_argument("--sweeps", nargs="+", choices=SWEEPS, default=SWEEPS, help="default: all four")
    args = parser.parse_args()
    sweeps = ("smoke",) if args.quick else tuple(args.sweeps)
    if args.check:
        sys.exit(0 if check(sweeps, *QUICK_CHECK * args.quick) else 1)
    with contextlib.ExitStack() as stack:
        cache = args.cache_dir or stack.enter_context(fresh_cache())
        plans(sweeps, cache, args.quick)


def plans(sweeps: tuple[str, ...], cache: Path, quick: bool) -> None:
    """What planning costs cold, cached and without measuring; the FLOP count's and the census's costs; the
    lower bound against the measured peak of every configuration."""
    cold, cached = plan_seconds(cache, sweep=sweeps[0]), plan_seconds(cache, sweep=sweeps[0])
    off = plan_seconds(cache, "memory.measure=false", sweep=sweeps[0])
    print(f"planning {sweeps[0]} --dry-run: {cold:.1f} s cold (measuring), {cached:.1f} s cached, "
          f"{off:.1f} s with memory.measure=false")
    flop_count_cost(sweeps[0], BROUGHT[quick])
    census_cost(sweeps[0], COUNTED[quick])
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
