"""Planning speed: compose + validate + expand a sweep of >= 10,000 runs (target: under 5 s).

    python benchmarks/plan_10k.py
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config import from_dict  # noqa: E402
from bench.plan import expand  # noqa: E402
from bench.sweep import compose  # noqa: E402

OVERRIDES = ["+sweep=p5_scaling",
             "axes.model=[llama2_7b,llama2_13b,llama2_70b,llama3_1_8b,llama3_1_70b,llama3_2_1b,llama3_2_3b,"
             "t5_3b,t5_11b]", "axes.nodes=[1,2,4,8,16]",
             "axes.sharding=[FULL_SHARD,SHARD_GRAD_OP,HYBRID_SHARD,NO_SHARD]",
             "axes.precision=[fp32,bf16_mixed,fp16_mixed,bf16_pure]",
             "axes.activation_checkpointing=[none,full,selective]",
             "axes.wrap_policy=[transformer_block,whole_model]", "axes.micro_batch=[1,2,4]", "repeats=1"]


def once() -> tuple[float, int, int]:
    t0 = time.perf_counter()
    raw, _ = compose(OVERRIDES)
    plan = expand(from_dict(raw))
    return time.perf_counter() - t0, len(plan), sum(not p.feasible for p in plan)


if __name__ == "__main__":
    times = []
    for _ in range(5):
        elapsed, runs, infeasible = once()
        times.append(elapsed)
    print(f"planned {runs} runs ({infeasible} infeasible): median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s over 5 repetitions (target < 5 s)")
