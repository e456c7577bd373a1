"""Days, dollars and the knee: on a constructed series whose answer is worked out by hand, and on the real
plan of p5_strong (Hydra-composed as the CLI does), against the plan's own predicted tokens/s."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.load_config import from_dict
from bench.launchers import launcher_sections
from bench.predict.budget import Point, answer, days_to_train, step_up
from bench.predict.perf import published_spread
from bench.study.answer import answer_table, format_answer
from bench.study.plan import answer_points, expand
from bench.sweep import compose

TOKENS_PER_STEP = 1024 * 4096  # a global batch of 1024 sequences of 4096 tokens
ROOT = Path(__file__).resolve().parents[2]


def _series(steps: dict[int, float | None]) -> list[Point]:
    return [Point(n, TOKENS_PER_STEP, t, "measured" if t else "infeasible") for n, t in steps.items()]


def test_the_knee_is_where_the_next_step_buys_less_than_the_threshold() -> None:
    # 1 -> 2 saves 49 of the 50 s linear scaling would (98%), 2 -> 4 24 of 25.5 (94%), 4 -> 8 7 of 13.5
    # (52%), 8 -> 16 2 of 10 (20%)
    ans = answer(_series({1: 100.0, 2: 51.0, 4: 27.0, 8: 20.0, 16: 18.0}), 1e12, 100.0, 0.5)
    rows = {r.point.nodes: r for r in ans.rows}
    assert rows[4].next_share == pytest.approx(7 / 13.5) and rows[8].next_share == pytest.approx(2 / 10)
    assert ans.strong and ans.knee is rows[8] and ans.knee_next is rows[16] and not ans.knee_beyond
    steps = 1e12 / TOKENS_PER_STEP
    assert rows[8].days == pytest.approx(steps * 20 / 86400)
    assert rows[8].usd == pytest.approx(steps * 20 / 3600 * 8 * 100)
    assert rows[2].efficiency == pytest.approx(100 / 51 / 2)
    assert ans.fastest is rows[16]
    assert ans.cheapest is rows[1]  # 100 node-seconds a step; 2 nodes 102
    # a stricter bar: 4 -> 8's 52% no longer passes
    strict = answer(_series({1: 100.0, 2: 51.0, 4: 27.0, 8: 20.0, 16: 18.0}), 1e12, None, 0.6)
    assert strict.knee.point.nodes == 4
    # a laxer one: every step passes, the knee lies past 16 nodes
    beyond = answer(_series({1: 100.0, 2: 51.0, 4: 27.0, 8: 20.0, 16: 18.0}), 1e12, None, 0.1)
    assert beyond.knee_beyond and beyond.knee.point.nodes == 16 and beyond.knee_next is None


def test_a_step_up_reads_as_faster_or_slower_than_the_node_count_before() -> None:
    """In a reader's terms, never a negative share: 1 -> 2 nodes 100 s -> 51 s is 1.96x faster (98% of
    linear); 2 -> 4 nodes 51 s -> 66.3 s is 1.30x slower."""
    ans = answer(_series({1: 100.0, 2: 51.0, 4: 66.3}), 1e12, None, 0.5)
    one, two, four = ans.rows
    assert step_up(one) == "2 nodes: 1.96x faster (98% of linear)"
    assert two.next_share == pytest.approx((51 - 66.3) / (51 * 0.5))  # -60%: what the table no longer says
    assert step_up(two) == "4 nodes: 1.30x slower"
    assert step_up(four) == "-"  # no next node count
    assert "1.30x slower" in "\n".join(answer_table(ans)) and "-60%" not in "\n".join(answer_table(ans))


def test_an_infeasible_node_count_is_skipped_and_the_base_is_the_smallest_with_a_figure() -> None:
    ans = answer(_series({1: None, 2: 40.0, 4: 30.0}), 1e12, None, 0.5)
    one, two, four = ans.rows
    assert one.days is None and one.efficiency is None and one.point.source == "infeasible"
    assert two.efficiency == 1.0 and four.efficiency == pytest.approx(40 / 30 / 2)
    assert two.next_share == pytest.approx(10 / 20)
    assert ans.knee is four and ans.knee_beyond  # 50% is not below the 50% bar
    assert ans.cheapest is two and two.usd is None  # no price: node-hours still rank them


def test_weak_scaling_has_days_at_each_batch_and_no_knee() -> None:
    points = [Point(1, 4096, 1.0, "measured"), Point(2, 8192, 1.1, "measured")]
    ans = answer(points, 1e9, 10.0, 0.5)
    assert not ans.strong and ans.knee is None and all(r.next_share is None for r in ans.rows)
    assert ans.rows[1].days == pytest.approx(1e9 / 8192 * 1.1 / 86400)
    assert ans.rows[1].efficiency == pytest.approx(8192 / 1.1 / 2 / 4096)
    assert ans.fastest is ans.rows[1] and ans.cheapest is ans.rows[0]


def test_the_plan_of_p5_strong_answers_in_days_from_its_own_predicted_tokens_per_second() -> None:
    raw, _ = compose(["+sweep=p5_strong", "memory.measure=false", "cluster.price_per_hour=50"])
    cfg = from_dict(raw, launcher_sections())
    plan = expand(cfg)
    by_nodes = {(p.spec.model, p.spec.accumulation, p.spec.nodes): p for p in plan if p.spec.kind == "train"}
    groups = answer_points(plan)
    assert len(groups) == 4  # 2 models x 2 accumulation modes
    for spec, points in groups:
        ans = answer(points, cfg.study.train_tokens, 50.0, cfg.study.knee_share)
        assert [r.point.nodes for r in ans.rows] == [1, 2, 4, 8, 16]
        for row in ans.rows:
            planned = by_nodes[(spec.model, spec.accumulation, row.point.nodes)]
            if not planned.feasible:  # llama2_70b on one node: no days
                assert row.days is None and row.point.source == "infeasible"
                continue
            tokens_per_s = planned.perf.tokens_per_s_per_gpu * planned.spec.world_size
            days = 2.0e12 / tokens_per_s / 86400  # p5_strong's study.train_tokens
            assert row.days == pytest.approx(days, rel=1e-9)
            assert row.usd == pytest.approx(days * 24 * row.point.nodes * 50)
            assert row.point.source == "predicted (published constants)"
            assert row.efficiency == pytest.approx(planned.pred_efficiency, rel=1e-9)
            spread = published_spread(row.point.nodes)  # no run calibrates them: the published rows' interval
            assert row.days_range == pytest.approx((days * math.exp(-spread), days * math.exp(spread)))
    text = format_answer(cfg.study, cfg.cluster.name, cfg.cluster.price_per_hour, plan)
    assert "and dollars to train 2e+12 tokens per node count" in text
    assert "else the published rows' on as many nodes" in text and " at ~90%, $" in text
    # the published constants scale 98-100% to 16 nodes: every step buys more than the 50% bar
    assert text.count("knee beyond 16 nodes: every step up buys at least 50% of the time linear scaling") == 4
    assert "set a price" not in text
    seven = next(a for s, p in groups if s.model == "llama2_7b" and s.accumulation == "sync_each"
                 for a in [answer(p, 2e12, 50.0, 0.5)])
    assert f"{seven.fastest.days:,.1f}" in text and f"${seven.fastest.usd:,.0f}" in text


def test_days_to_train_is_steps_times_step_time() -> None:
    assert days_to_train(86400 * 10.0, 10.0, 1.0) == 1.0


@pytest.mark.parametrize("override, message", [
    ("cluster.price_per_hour=-1", "error: cluster.price_per_hour=-1.0 must be >= 0"),
    ("cluster.price_per_hour=nan", "error: cluster.price_per_hour=nan must be a finite number >= 0"),
    ("cluster.price_per_hour=abc", "error: cluster.price_per_hour: Value 'abc' of type 'str' could not be "
                                   "converted to Float"),
    ("study.train_tokens=0", "error: study.train_tokens=0.0 must be > 0"),
    ("study.train_tokens=inf", "error: study.train_tokens=inf must be a finite number > 0"),
    ("study.knee_share=0", "error: study.knee_share=0.0 must be in (0, 1]"),
    ("study.knee_share=1.5", "error: study.knee_share=1.5 must be in (0, 1]"),
])
def test_a_bad_price_budget_or_knee_is_one_line_and_exit_2_before_anything_is_written(
        tmp_path, override: str, message: str) -> None:
    argv = [sys.executable, "-m", "bench.sweep", "+sweep=p5_strong", f"results_root={tmp_path}", override,
            "--dry-run"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == message + "\n" and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_one_node_count_has_days_but_no_knee() -> None:
    ans = answer(_series({1: None, 2: 40.0}), 1e12, 10.0, 0.5)
    assert ans.knee is None and ans.fastest is ans.cheapest is ans.rows[1]
    assert ans.rows[1].usd == pytest.approx(1e12 / TOKENS_PER_STEP * 40 / 3600 * 2 * 10)


def test_a_calibrated_prediction_gives_days_with_its_interval() -> None:
    """tokens/s x exp(+-spread) (perf.Prediction.interval) is days x exp(-+spread)."""
    spread = math.log(1.2)
    ans = answer([Point(1, 100.0, 8.64, "predicted (this study's 3 runs)", spread)], 1e6, None, 0.5)
    (row,) = ans.rows
    assert row.days == pytest.approx(1.0) and row.days_range == pytest.approx((1 / 1.2, 1.2))
    assert answer_table(ans)[1].split()[5:7] == ["1", "(0.833-1.2)"]
