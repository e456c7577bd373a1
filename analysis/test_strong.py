"""Strong scaling in days and dollars: known step times give known days, dollars, efficiencies and knee."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.scaling import CONFIG
from analysis.strong import knee_sentences, strong_rows

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
    weak = {**rows[0], "batch": "mb1", "global_batch": 0, "step_time_s": 5.0}  # no days for weak scaling here
    return pd.DataFrame([*rows, weak])


def test_days_dollars_efficiency_and_knee_from_the_step_times() -> None:
    rows = strong_rows(_agg(), {"p5.48xlarge": 100.0}, 1e12).set_index("nodes")
    assert list(rows.index) == [1, 2, 4, 8, 16]  # the weak-scaling row is not a strong-scaling one
    steps = 1e12 / TOKENS_PER_STEP
    assert rows.loc[1, "days_to_train"] == pytest.approx(steps * 100 / 86400)
    assert rows.loc[8, "usd_to_train"] == pytest.approx(steps * 20 / 3600 * 8 * 100)
    assert rows.loc[2, "efficiency"] == pytest.approx(100 / 51 / 2)
    assert rows.loc[4, "next_share"] == pytest.approx((27 - 20) / (27 * 0.5))
    assert list(rows["source"]) == ["measured"] * 4 + ["predicted"]  # 16 nodes: the plan's 18 s
    assert rows.loc[16, "step_time_s"] == 18.0 and rows.loc[16, "efficiency"] == pytest.approx(100 / 18 / 16)
    (sentence,) = knee_sentences(rows.reset_index(), 1e12, 0.5)
    # 4 -> 8 nodes buys 52% of a linear gain, 8 -> 16 only 20%: the knee is at 8 nodes
    assert sentence.startswith("llama2_7b, FULL_SHARD bf16_mixed + full AC, global batch 1024 sync_each: "
                               f"8 nodes train 1e+12 tokens in {steps * 20 / 86400:.1f} days, "
                               f"${steps * 20 / 3600 * 8 * 100:,.0f}")
    assert "past 8 nodes another node buys less than 50%" in sentence and "16 nodes buy 20%" in sentence
    assert "(predicted)" in sentence  # the 16-node figure is the plan's
    (beyond,) = knee_sentences(rows.reset_index(), 1e12, 0.1)  # a lower bar: no knee within 16 nodes
    assert beyond.startswith("llama2_7b, FULL_SHARD bf16_mixed + full AC, global batch 1024 sync_each: "
                             "16 nodes")
    assert "the knee lies beyond the planned node counts" in beyond


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
