"""The scheduling rule on its own: order, fit, probes alone, and the makespan it gives."""
from __future__ import annotations

import pytest

from bench.run.schedule import Job, can_start, lower_bound, makespan, order, pick


def jobs(*spec: tuple[int, float], probe: bool = False) -> list[Job]:
    return [Job(f"{'p' if probe else 'j'}{i}-{n}x{s}", n, probe, s) for i, (n, s) in enumerate(spec)]


def test_probes_first_then_largest_node_seconds() -> None:
    plan = [*jobs((1, 10), (4, 10), (2, 30)), *jobs((2, 5), probe=True)]
    assert [j.key for j in order(plan)] == ["p0-2x5", "j2-2x30", "j1-4x10", "j0-1x10"]


def test_fit_within_the_budget_and_first_fit_behind_a_waiting_run() -> None:
    a, b, c = jobs((3, 1), (2, 1), (1, 1))
    assert pick([a, b, c], [], 4, True) == [a, c]  # b waits, c fills the node b cannot use
    assert can_start(b, [], 1, True)  # larger than the budget: still runs, alone
    assert not can_start(c, [b], None, True)  # no budget: one run at a time


def test_probes_run_alone_unless_relaxed() -> None:
    probe, = jobs((1, 1), probe=True)
    train, = jobs((1, 1))
    assert not can_start(probe, [train], 4, True) and not can_start(train, [probe], 4, True)
    assert can_start(probe, [train], 4, False)


def test_the_issue_mix_meets_the_lower_bound() -> None:
    """8 x 1 node, 4 x 2 nodes, 2 x 4 nodes of equal length on 4 nodes: 6 lengths, the bound itself."""
    mix = jobs(*[(1, 10.0)] * 8, *[(2, 10.0)] * 4, *[(4, 10.0)] * 2)
    assert lower_bound(mix, 4) == 60.0
    assert makespan(mix, 4) == pytest.approx(60.0)
    assert makespan(mix, None) == pytest.approx(140.0)  # one at a time: the sum


def test_largest_first_beats_the_plan_order() -> None:
    """Short runs first in the plan leave the long one to the end, with nodes idle beside it."""
    plan = jobs((1, 1), (1, 1), (2, 5), (1, 5))
    assert makespan(plan, 2) == pytest.approx(10.0)  # LPT: 2n5 | 1n5 + 1n1, 1n1

    def plan_order_makespan(js: list[Job], budget: int) -> float:  # the same rule without reordering
        import bench.run.schedule as s
        original = s.order
        s.order = list
        try:
            return s.makespan(js, budget)
        finally:
            s.order = original
    assert plan_order_makespan(plan, 2) == pytest.approx(11.0)


def test_runs_without_a_prediction_are_ordered_by_the_studys_finished_runs(tmp_path) -> None:
    """GPUs the cluster file does not name: nothing predicts a run, so the study's finished runs at its
    node count (their median wall time) stand in, and the longest-first order uses them."""
    import threading

    from bench.core.load_config import from_dict
    from bench.launchers import launcher_sections, placement_of
    from bench.run.runner import _Sweep
    from bench.study.plan import expand
    from bench.sweep import compose, run_options
    raw = compose(["+sweep=p5_scaling", "axes.model=[llama2_7b]", "axes.sharding=[FULL_SHARD]",
                   "cluster.gpu=null", "nccl.enabled=false", "memory.measure=false"])[0]
    cfg = from_dict(raw, launcher_sections())
    plan = {p.spec.nodes: p for p in expand(cfg)}
    options = run_options(cfg, placement_of(cfg))
    sweep = _Sweep(options, None, tmp_path, threading.Event(), None, list(plan.values()))
    assert sweep.job(plan[2]).seconds is None  # nothing finished yet: no estimate
    sweep.walls = {2: [100.0, 300.0, 260.0], 4: [50.0]}
    assert sweep.job(plan[2]).seconds == 260.0 and sweep.job(plan[4]).seconds == 50.0
    assert sweep.job(plan[8]).seconds is None
    ordered = order([sweep.job(plan[n]) for n in (4, 2)])
    assert [j.nodes for j in ordered] == [2, 4]  # 2 x 260 node-seconds before 4 x 50
