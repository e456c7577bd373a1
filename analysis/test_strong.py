"""Scaling in days and dollars: known step times give known days, dollars, efficiencies and knee; a plan
with no finished run gives the predicted answer, and finished runs replace its rows."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis import report
from analysis.scaling import CONFIG
from analysis.strong import knee_sentences, strong_rows
from bench.core import rundir
from bench.core.load_config import from_dict
from bench.core.schema import RunSummary
from bench.launchers import launcher_sections
from bench.predict.budget import Point, answer
from bench.run.collect import write_results
from bench.study.plan import expand
from bench.sweep import compose, write_plan

TOKENS_PER_STEP = 1024 * 4096
STEPS = {1: 100.0, 2: 51.0, 4: 27.0, 8: 20.0, 16: None}  # measured; 16 nodes has no ok run
PREDICTED = {1: 98.0, 2: 50.0, 4: 26.0, 8: 19.0, 16: 18.0}


def _agg() -> pd.DataFrame:
    config = {"sweep": "s", "cluster": "p5.48xlarge", "model": "llama2_7b", "model_config": "",
              "gpus_per_node": 8, "sharding": "FULL_SHARD", "precision": "bf16_mixed",
              "activation_checkpointing": "full", "wrap_policy": "transformer_block", "compile": False,
              "offload": "none", "batch": "gb1024 sync_each", "seq_len": 4096, "efa_per_node": 32}
    assert set(config) == set(CONFIG)
    rows = [{**config, "nodes": n, "global_batch": 1024, "micro_batch": 128 // n, "grad_accum": 1.0,
             "step_time_s": STEPS[n], "pred_step_time_s": PREDICTED[n],
             "status": "ok" if STEPS[n] else "timeout"}
            for n in STEPS]
    weak = {**rows[0], "batch": "mb1", "global_batch": 0, "micro_batch": 1, "step_time_s": 5.0}
    return pd.DataFrame([*rows, weak])


def test_days_dollars_efficiency_and_knee_from_the_step_times() -> None:
    every = strong_rows(_agg(), {"p5.48xlarge": 100.0}, 1e12)
    rows = every[every["scaling"] == "strong"].set_index("nodes")
    assert list(rows.index) == [1, 2, 4, 8, 16]  # the weak-scaling row is not a strong-scaling one
    (weak,) = every[every["scaling"] == "weak"].itertuples()
    # weak scaling: 1 sequence per GPU, 8 GPUs: 8 x 4096 tokens a step, 5 s each
    assert weak.tokens_per_step == 8 * 4096
    assert weak.days_to_train == pytest.approx(1e12 / (8 * 4096) * 5 / 86400)
    steps = 1e12 / TOKENS_PER_STEP
    assert rows.loc[1, "days_to_train"] == pytest.approx(steps * 100 / 86400)
    assert rows.loc[8, "usd_to_train"] == pytest.approx(steps * 20 / 3600 * 8 * 100)
    assert rows.loc[2, "efficiency"] == pytest.approx(100 / 51 / 2)
    assert rows.loc[4, "next_share"] == pytest.approx((27 - 20) / (27 * 0.5))
    assert rows.loc[4, "next_step"] == "8 nodes: 1.35x faster (52% of linear)"  # 27 s -> 20 s
    assert list(rows["source"]) == ["measured"] * 4 + ["predicted; ran: timeout"]  # 16 nodes: 18 s
    assert rows.loc[16, "step_time_s"] == 18.0 and rows.loc[16, "efficiency"] == pytest.approx(100 / 18 / 16)
    assert list(rows["answer"]) == ["cheapest", "", "", "knee", "fastest"]
    (sentence,) = knee_sentences(every, 1e12, 0.5)
    # 4 -> 8 nodes buys 52% of a linear gain, 8 -> 16 only 20%: the knee is at 8 nodes
    assert sentence.startswith("llama2_7b, FULL_SHARD bf16_mixed + full AC, global batch 1024 sync_each: "
                               f"8 nodes train 1e+12 tokens in {steps * 20 / 86400:.4g} days, "
                               f"${steps * 20 / 3600 * 8 * 100:,.0f}")
    assert "past 8 nodes another node buys less than 50%" in sentence and "16 nodes buy 20%" in sentence
    days, usd = steps * 18 / 86400, steps * 18 / 3600 * 16 * 100
    # days as every figure on the page: four significant figures (analysis/render.py number)
    assert f"16 nodes train 1e+12 tokens in {days:.4g} days, ${usd:,.0f}, predicted; ran: timeout" in sentence
    assert "fastest: 16 nodes" in sentence and "cheapest: 1 node trains" in sentence
    (beyond,) = knee_sentences(every, 1e12, 0.1)  # a lower bar: no knee within 16 nodes
    assert beyond.startswith("llama2_7b, FULL_SHARD bf16_mixed + full AC, global batch 1024 sync_each: "
                             "16 nodes")
    assert "the knee lies beyond the planned node counts" in beyond


def test_two_clusters_with_one_configuration_get_an_answer_each() -> None:
    """The same model and configuration on two clusters (or EFA counts, or sweeps, or a sweep copied under
    another name): each is answered against its own node counts, at its own price, and named apart."""
    agg = _agg()
    other = agg.assign(cluster="p4de.24xlarge", step_time_s=agg["step_time_s"] * 2,
                       pred_step_time_s=agg["pred_step_time_s"] * 2)
    rows = strong_rows(pd.concat([agg, other], ignore_index=True),
                       {"p5.48xlarge": 100.0, "p4de.24xlarge": 40.0}, 1e12)
    strong = rows[rows["scaling"] == "strong"]
    assert strong.groupby("configuration_id")["nodes"].apply(list).tolist() == [[1, 2, 4, 8, 16]] * 2
    assert sorted(set(strong["configuration"])) == [
        f"FULL_SHARD bf16_mixed + full AC, global batch 1024 sync_each (cluster {c})"
        for c in ("p4de.24xlarge", "p5.48xlarge")]
    first, second = knee_sentences(rows, 1e12, 0.5)
    assert "(cluster p4de.24xlarge): 8 nodes" in first and "(cluster p5.48xlarge): 8 nodes" in second
    steps = 1e12 / TOKENS_PER_STEP
    assert f"${steps * 40 / 3600 * 8 * 40:,.0f}" in first  # p4de sorts first: twice the time, its price
    assert f"${steps * 20 / 3600 * 8 * 100:,.0f}" in second


def test_a_budget_refuses_two_points_at_one_node_count() -> None:
    with pytest.raises(ValueError, match="one point per node count"):
        answer([Point(2, 1.0, 1.0, "measured"), Point(2, 1.0, 2.0, "measured")], 1e12, None)


def test_no_price_no_dollars() -> None:
    rows = strong_rows(_agg(), {}, 1e12)
    assert rows["usd_to_train"].isna().all() and rows["days_to_train"].notna().all()
    assert "$" not in knee_sentences(rows, 1e12, 0.5)[0]


def test_a_slower_next_node_count_is_called_slower_not_a_negative_share() -> None:
    agg = _agg()
    agg.loc[agg["nodes"] == 2, "step_time_s"] = 120.0  # 2 nodes take longer than 1 (a CPU study's loopback)
    rows = strong_rows(agg, {}, 1e12)
    (sentence,) = knee_sentences(rows, 1e12, 0.5)
    assert "1 node trains 1e+12 tokens" in sentence
    assert "the next node count is slower at this global batch (2 nodes train" in sentence
    assert "buy -" not in sentence


def test_a_planned_study_reports_the_predicted_answer_and_finished_runs_replace_its_rows(tmp_path) -> None:
    """p5_strong's real plan (as `python -m bench.sweep` writes it) and no finished run: the report gives
    days and dollars from the plan's predicted tokens/s, marked with their source; then the 7B's one-node
    run finishes and its row is measured, the others' efficiency now against it."""
    raw, yaml_text = compose(["+sweep=p5_strong", "memory.measure=false"])
    plan = expand(from_dict(raw, launcher_sections()))
    sweep = tmp_path / "p5_strong"
    write_plan(sweep, plan, yaml_text)
    out = tmp_path / "report"
    assert report.main([str(sweep), "--out", str(out), "--price", "98.32"]) == 0
    strong = pd.read_csv(out / "strong.csv")
    seven = strong[strong["configuration"].str.endswith("sync_each") & (strong["model"] == "llama2_7b")]
    planned = {p.spec.nodes: p for p in plan if p.spec.model == "llama2_7b" and p.spec.kind == "train"
               and p.spec.accumulation == "sync_each"}
    assert list(seven["nodes"]) == [1, 2, 4, 8, 16]
    for _, row in seven.iterrows():
        p = planned[row["nodes"]]
        days = 2e12 / (p.perf.tokens_per_s_per_gpu * p.spec.world_size) / 86400  # study.train_tokens 2e12
        assert row["days to train 2e+12 tokens"] == pytest.approx(days, rel=1e-9)
        assert row["USD to train 2e+12 tokens"] == pytest.approx(days * 24 * row["nodes"] * 98.32, rel=1e-9)
        assert row["source"] == "predicted (published constants)"
    seventy = strong[(strong["model"] == "llama2_70b") & (strong["nodes"] == 1)]
    assert set(seventy["source"]) == {"infeasible"} and seventy["days to train 2e+12 tokens"].isna().all()
    text = (out / "report.md").read_text()
    assert "- Nothing has run yet: the plan's prediction (plan.csv)\n" in text
    assert ("llama2_7b, FULL_SHARD bf16_mixed + full AC, global batch 1024 sync_each: 16 nodes train 2e+12 "
            "tokens in") in text
    assert "predicted (published constants)" in text and "No successful runs" not in text

    one = planned[1]
    measured = one.perf.step_time_s * 1.25  # slower than predicted
    summary = RunSummary(run_id=one.spec.run_id, sweep="p5_strong", status="ok", spec=one.first_spec,
                         step_time_s=measured, tokens_per_s=1024 * 4096 / measured, **one.predicted())
    rundir.write_summary(rundir.run_dir(sweep, one.spec), summary)
    write_results(sweep)
    assert report.main([str(sweep), "--out", str(out), "--price", "98.32"]) == 0
    strong = pd.read_csv(out / "strong.csv")
    seven = strong[strong["configuration"].str.endswith("sync_each") & (strong["model"] == "llama2_7b")]
    seven = seven.set_index("nodes")
    assert seven.loc[1, "source"] == "measured" and seven.loc[2, "source"].startswith("predicted")
    days = 2e12 / (1024 * 4096) * measured / 86400
    assert seven.loc[1, "days to train 2e+12 tokens"] == pytest.approx(days)
    assert seven.loc[1, "USD to train 2e+12 tokens"] == pytest.approx(
        2e12 / (1024 * 4096) * measured / 3600 * 98.32)
    two = planned[2].perf.step_time_s
    assert seven.loc[2, "strong-scaling efficiency"] == pytest.approx(measured / two / 2)
    assert "Nothing has run yet" not in (out / "report.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--train-tokens", "0"], "error: --train-tokens must be a positive number of tokens, got 0"),
    (["--knee-share", "1.5"], "error: the knee threshold must be in (0, 1], got 1.5"),
    (["--knee-share", "0"], "error: the knee threshold must be in (0, 1], got 0.0"),
    (["--price", "-3"], "error: bad --price: --price -3: a price cannot be negative"),
    (["--price", "abc"], "error: bad --price: could not convert string to float: 'abc'"),
])
def test_the_report_refuses_a_bad_budget_knee_or_price_before_writing(tmp_path, capsys, args,
                                                                      message) -> None:
    raw, yaml_text = compose(["+sweep=p5_strong", "memory.measure=false", "axes.model=[llama2_7b]"])
    write_plan(tmp_path / "p5_strong", expand(from_dict(raw, launcher_sections())), yaml_text)
    assert report.main([str(tmp_path / "p5_strong"), "--out", str(tmp_path / "out"), *args]) == 2
    assert capsys.readouterr().err == message + "\n" and not (tmp_path / "out").exists()
