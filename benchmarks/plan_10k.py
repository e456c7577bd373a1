"""Planning speed: compose + validate + expand a sweep of >= 10,000 runs (target: under 5 s).

    python benchmarks/plan_10k.py [--quick]    # quick: one repetition instead of five
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.core.load_config import from_dict  # noqa: E402
from bench.launchers import launcher_sections  # noqa: E402
from bench.study.plan import expand  # noqa: E402
from bench.sweep import compose  # noqa: E402

OVERRIDES = ["+sweep=p5_scaling",
             "axes.model=[llama2_7b,llama2_13b,llama2_70b,llama3_1_8b,llama3_1_70b,llama3_2_1b,llama3_2_3b,"
             "t5_3b,t5_11b]", "axes.nodes=[1,2,4,8,16]",
             "axes.sharding=[FULL_SHARD,SHARD_GRAD_OP,HYBRID_SHARD,NO_SHARD]",
             "axes.precision=[fp32,bf16_mixed,fp16_mixed,bf16_pure]",
             "axes.activation_checkpointing=[none,full,selective]",
             "axes.wrap_policy=[transformer_block,whole_model]", "axes.micro_batch=[1,2,4]", "repeats=1",
             "axes.seq_len=[512]"]  # every model's limit (T5: 512): the plan refuses longer runs in one line


def once() -> tuple[float, int, int]:
    t0 = time.perf_counter()
    raw, _ = compose(OVERRIDES)
    plan = expand(from_dict(raw, launcher_sections()))
    return time.perf_counter() - t0, len(plan), sum(not p.feasible for p in plan)


RUNS = 10_000  # what the target is stated for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition")
    repetitions = 1 if parser.parse_args().quick else 5
    times = []
    for _ in range(repetitions):
        elapsed, runs, infeasible = once()
        times.append(elapsed)
    if runs < RUNS:
        sys.exit(f"the sweep plans {runs} runs, fewer than the {RUNS:,} the target is stated for")
    print(f"planned {runs} runs ({infeasible} infeasible): median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s over {repetitions} repetitions (target < 5 s)")


if __name__ == "__main__":
    main()
