"""How much one profiled step's split differs from the next, and so how many steps a study should trace
(`trace.steps`): each multi-rank run's traces are split again one profiled step at a time, as its worker
split them all (each collective's wait read across the groups the rank's meta record names), and per part
the steps' coefficient of variation is printed with what the mean of k steps keeps of it (cv / sqrt(k)).

    python benchmarks/trace_noise.py --study results/smoke   # a study traced at 2 or more steps
    python benchmarks/trace_noise.py --quick                 # one 2-rank run, 4 traced steps, then that

The steps' mean is checked against the split each rank recorded: a reading that differs from the worker's
is an error, not a figure.
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.core.records import parse_records, records_path, trace_path  # noqa: E402
from bench.core.rundir import current_attempt_dir  # noqa: E402
from trainer.trace import load, timeline  # noqa: E402
from trainer.trace_split import PARTS, split  # noqa: E402
from trainer.trace_waits import exchanged, fsdp_groups, set_waits  # noqa: E402

SHOWN = ("compute", "exposed_all_gather_fwd", "exposed_all_gather_bwd", "exposed_reduce_scatter",
         "exposed_all_reduce", "waiting")
TOLERANCE_S = 1e-6  # the steps' mean against the recorded split: the same arithmetic, so rounding only


def _records(attempt: Path, rank: int) -> dict[str, dict]:
    path = records_path(attempt, rank)
    if not path.exists():
        return {}
    with path.open() as f:
        return {r["kind"]: r for r in parse_records(f) if r["kind"] in ("meta", "trace")}


def per_step(attempt: Path) -> tuple[int, dict[str, list[float]]] | None:
    """The run's node count and per part the seconds in each profiled step (the median over ranks, as the
    summary takes it); None for a run with one rank, one step, or a rank without its trace."""
    ranks, records = [], []
    while (found := _records(attempt, len(ranks))):
        ranks.append(len(ranks))
        records.append(found)
    if len(ranks) < 2 or any("trace" not in r or "meta" not in r for r in records):
        return None
    import torch
    tls = [timeline(load(trace_path(attempt, r), torch.__version__)) for r in ranks]
    if len(tls[0].windows) < 2:
        return None
    mine = [exchanged(tl, r, fsdp_groups(rec["meta"]["shard_group"], rec["meta"]["replicate_group"]),
                      rec["meta"]["host"]) for r, (tl, rec) in enumerate(zip(tls, records))]
    for tl, m in zip(tls, mine):
        set_waits(tl, m, mine)
    steps: dict[str, list[float]] = {k: [] for k in PARTS}
    for w in range(len(tls[0].windows)):
        one = [split(_window(tl, w))["parts"] for tl in tls]
        for k in PARTS:
            steps[k].append(statistics.median(p[k] for p in one))
    for tl, rec in zip(tls, records):
        _check(split(tl)["parts"], rec["trace"]["split"]["parts"], attempt)
    return records[0]["meta"]["spec"]["nodes"], steps


def _window(tl, w: int):
    """The timeline cut to its w-th profiled step (the split counts only time inside a window)."""
    one = copy.copy(tl)
    one.windows = [tl.windows[w]]
    return one


def _check(mine: dict[str, float], recorded: dict[str, float], attempt: Path) -> None:
    off = {k: (mine[k], recorded.get(k, 0.0)) for k in PARTS
           if abs(mine[k] - recorded.get(k, 0.0)) > TOLERANCE_S}
    if off:
        raise SystemExit(f"{attempt}: the traces split here differ from the worker's split: {off}")


def cv(values: list[float]) -> float | None:
    mean = statistics.mean(values)
    return statistics.stdev(values) / mean if mean > 1e-4 else None  # a part under 0.1 ms: no share


def report(runs: dict[str, tuple[int, dict[str, list[float]]]]) -> None:
    print(f"{'run':62} {'part':24} {'ms per profiled step':>30} {'mean':>7} {'cv':>5}")
    pooled: dict[tuple[int, str], list[float]] = {}
    for name, (nodes, steps) in runs.items():
        for k in SHOWN:
            c = cv(steps[k])
            if c is None:
                continue
            pooled.setdefault((nodes, k), []).append(c)
            ms = " ".join(f"{v * 1e3:6.1f}" for v in steps[k])
            print(f"{name[:62]:62} {k:24} {ms:>30} {statistics.mean(steps[k]) * 1e3:7.1f} {c:5.0%}")
    print("\nper node count and part: the median of the runs' step-to-step cv, and what a k-step mean keeps:")
    for (nodes, k), cvs in sorted(pooled.items(), key=lambda item: (item[0][0], SHOWN.index(item[0][1]))):
        med = statistics.median(cvs)
        kept = ", ".join(f"{n} steps {med / math.sqrt(n):.0%}" for n in (1, 2, 3, 6))
        print(f"  {nodes} node(s) {k:24} {len(cvs):3} runs, step-to-step cv {med:4.0%}; a mean of {kept}")


def study(path: Path) -> dict[str, tuple[int, dict[str, list[float]]]]:
    runs = {}
    for run in sorted(p for p in (path / "runs").iterdir() if p.is_dir()):
        found = per_step(current_attempt_dir(run))
        if found is not None:
            runs[run.name] = found
    if not runs:
        raise SystemExit(f"{path}: no run with two or more ranks traced at two or more steps (trace.steps)")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--study", type=Path, action="append", help="a results dir whose runs kept their "
                        "traces (repeat to pool studies)")
    parser.add_argument("--quick", action="store_true", help="one 2-rank run traced 4 steps (the slow suite)")
    args = parser.parse_args()
    if args.quick:
        from trace_cost import run
        with tempfile.TemporaryDirectory() as run_dir:
            run(2, 4, "all", Path(run_dir))
            found = per_step(Path(run_dir))
            assert found is not None, "the quick run left no 2-rank, 4-step traces"
            report({"tiny_llama 2x1 FULL_SHARD fp32, 4 traced steps": found})
    elif args.study:
        runs: dict[str, tuple[int, dict[str, list[float]]]] = {}
        for path in args.study:
            runs.update({f"{path.name}/{name}": found for name, found in study(path).items()})
        report(runs)
    else:
        parser.error("give --study DIR or --quick")


if __name__ == "__main__":
    main()
