"""Report math on hand-made results with known answers, and robustness to broken input."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.load import load
from analysis.report import build, main
from analysis.scaling import ablation, aggregate, nccl_summary
from bench import rundir
from bench.schema import RunSpec, RunSummary


def write_run(sweep_dir: Path, status: str = "ok", tokens_per_s: float | None = None, **spec_kw) -> RunSummary:
    spec = RunSpec(**{"model": "llama2_7b", "gpus_per_node": 8, "cluster": "p5.48xlarge", **spec_kw})
    d = rundir.run_dir(sweep_dir, spec)
    summary = RunSummary(run_id=spec.run_id, sweep=sweep_dir.name, status=status, spec=spec, run_dir=str(d),
                         tokens_per_s=tokens_per_s, error=None if status == "ok" else f"{status}: boom")
    if tokens_per_s is not None and spec.kind == "train":
        summary.tflops_per_gpu = tokens_per_s * 1e-3
    rundir.write_spec(d, spec)
    rundir.write_summary(d, summary)
    return summary


SCALING = {1: 1000.0, 2: 1900.0, 4: 3700.0, 8: 7200.0, 16: 13920.0}


def test_scaling_efficiency_known_answer(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    for nodes, tps in SCALING.items():
        write_run(sweep, tokens_per_s=tps, nodes=nodes)
    agg = aggregate(load(sweep).frame).set_index("nodes")
    assert agg.loc[16, "scaling_efficiency"] == pytest.approx(0.87)  # 13920 / 16 / 1000
    assert agg.loc[2, "scaling_efficiency"] == pytest.approx(0.95)
    assert agg.loc[1, "scaling_efficiency"] == pytest.approx(1.0)
    assert agg.loc[8, "speedup"] == pytest.approx(7.2)


def test_repeats_are_medians_with_spread(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    for repeat, tps in enumerate([1100.0, 900.0, 1000.0]):
        write_run(sweep, tokens_per_s=tps, nodes=1, repeat=repeat)
    row = aggregate(load(sweep).frame).iloc[0]
    assert (row.tokens_per_s, row.tokens_per_s_min, row.tokens_per_s_max, row.ok_runs) == (1000, 900, 1100, 3)


def test_missing_baseline_is_said_and_efficiency_uses_the_next(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    write_run(sweep, status="oom", nodes=1)
    write_run(sweep, tokens_per_s=2000.0, nodes=2)
    write_run(sweep, tokens_per_s=3600.0, nodes=4)
    out = tmp_path / "report"
    build(load(sweep), out)
    text = (out / "report.md").read_text()
    assert "no ok run at 1 node(s) (oom); efficiency is relative to 2 nodes instead" in text
    agg = aggregate(load(sweep).frame).set_index("nodes")
    assert agg.loc[4, "scaling_efficiency"] == pytest.approx(0.9)  # (3600/4) / (2000/2)
    assert pd.isna(agg.loc[1, "tokens_per_s"]) and agg.loc[1, "status"] == "oom"  # failed, never 0


def test_ablation_gain_against_the_one_factor_baseline(tmp_path: Path) -> None:
    sweep = tmp_path / "ablation"
    base = dict(model="t5_3b", nodes=1, activation_checkpointing="full")
    write_run(sweep, tokens_per_s=3000.0, precision="bf16_mixed", **base)
    write_run(sweep, tokens_per_s=1000.0, precision="fp32", **base)
    write_run(sweep, tokens_per_s=2400.0, precision="bf16_mixed", wrap_policy="whole_model", **base)
    gains = ablation(aggregate(load(sweep).frame)).set_index("factor")
    assert gains.loc["precision", "gain_pct"] == pytest.approx(200.0)
    assert gains.loc["wrap_policy", "gain_pct"] == pytest.approx(25.0)
    assert "sharding" not in gains.index  # no run differs in sharding only


def test_nccl_table_medians_by_nodes_and_efa(tmp_path: Path) -> None:
    sweep = tmp_path / "efa"
    for repeat, bw in enumerate([40.0, 44.0, 42.0]):
        spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=8, efa_per_node=4, repeat=repeat)
        d = rundir.run_dir(sweep, spec)
        rundir.write_summary(d, RunSummary(run_id=spec.run_id, sweep="efa", status="ok", spec=spec,
                                           nccl_busbw_avg_gbs=bw, nccl_busbw_max_gbs=2 * bw,
                                           nccl_transport="AWS Libfabric"))
    row = nccl_summary(load(sweep).frame).iloc[0]
    assert (row.busbw_avg_gbs, row.busbw_max_gbs, row.efa_per_node, row.ok_runs) == (42.0, 84.0, 4, 3)


def test_empty_dir_is_one_clear_error(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no sweep results") and err.count("\n") == 1


def test_only_failed_runs_still_give_a_report(tmp_path: Path) -> None:
    sweep = tmp_path / "bad"
    write_run(sweep, status="oom", nodes=1)
    write_run(sweep, status="timeout", nodes=2)
    assert main([str(sweep)]) == 0
    text = (sweep / "report" / "report.md").read_text()
    assert "No successful runs" in text and "| oom |" in text and "| timeout |" in text


def test_older_schema_truncated_files_and_corrupt_summaries(tmp_path: Path) -> None:
    sweep = tmp_path / "old"
    good = write_run(sweep, tokens_per_s=1000.0, nodes=1)
    old = write_run(sweep, tokens_per_s=1900.0, nodes=2)
    path = Path(old.run_dir) / rundir.SUMMARY_JSON
    row = json.loads(path.read_text())
    for key in ("mfu", "hfu", "nvml_power_w", "extra"):  # a v0 summary had none of these
        row.pop(key)
    row["schema_version"] = 0
    path.write_text(json.dumps(row))
    broken = write_run(sweep, tokens_per_s=3000.0, nodes=4)
    text = (Path(broken.run_dir) / rundir.SUMMARY_JSON).read_text()
    (Path(broken.run_dir) / rundir.SUMMARY_JSON).write_text(text[: len(text) // 2])  # cut mid-write
    (sweep / rundir.RESULTS_PARQUET).write_bytes(b"PAR1 truncated")
    loaded = load(sweep)
    assert sorted(loaded.frame.run_id) == sorted([good.run_id, old.run_id])
    assert any("unreadable" in n for n in loaded.notes)
    assert any("without a readable summary" in n for n in loaded.notes)
    assert any("older schema" in n for n in loaded.notes)
    assert main([str(sweep)]) == 0
