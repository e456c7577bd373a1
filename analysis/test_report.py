"""Report math on hand-made results with known answers, and robustness to broken input."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import report
from analysis.columns import Columns
from analysis.load import load
from analysis.parity import loss_parity
from analysis.report import build, main, pages
from analysis.scaling import ablation, aggregate, nccl_summary
from analysis.sections import SECTIONS, Section
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary


def write_run(sweep_dir: Path, status: str = "ok", tokens_per_s: float | None = None,
              **spec_kw) -> RunSummary:
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


def test_the_answer_comes_first_with_the_known_efficiency(tmp_path: Path) -> None:
    """1-16 nodes at 1000/1900/3700/7200/13920 tokens/s: 87% at 16 nodes, 13920/(16x8) = 109 tokens/s/GPU;
    the sentence, the chart's labels and the order of the page carry it. A configuration whose 16-node run
    OOMed is named at 16 nodes, not left as a missing point."""
    sweep = tmp_path / "study"
    for nodes, tps in SCALING.items():
        write_run(sweep, tokens_per_s=tps, nodes=nodes, activation_checkpointing="full")
    for nodes in (1, 2):
        write_run(sweep, tokens_per_s=SCALING[nodes] * 0.9, nodes=nodes, sharding="HYBRID_SHARD")
    write_run(sweep, status="oom", nodes=16, sharding="HYBRID_SHARD")
    out = tmp_path / "report"
    shown = pages(load(sweep), out)
    md = (out / "report.md").read_text()
    assert ("llama2_7b, FULL_SHARD bf16_mixed + full AC: 87% scaling efficiency from 1 to 16 nodes, "
            "109 tokens/s/GPU") in shown["answer"].body
    for table in ("headline", "scaling"):  # efficiency in one format on the page: percent, as the answer says
        efficiency = shown[table].body["scaling efficiency"]
        assert "87%" in set(efficiency) and all(e.endswith("%") for e in efficiency.dropna()), table
    assert "llama2_7b, HYBRID_SHARD bf16_mixed: oom at 16 nodes" in shown["answer"].body
    first = ["answer", "headline", "throughput_vs_nodes", "scaling", "provenance"]
    assert [i for i in shown if i in first] == first  # the answer first, where the numbers come from last
    assert sorted(md.index(f"## {shown[i].title}\n") for i in first) == [md.index(f"## {shown[i].title}\n")
                                                                          for i in first]
    svg = (out / "throughput_vs_nodes.svg").read_text()
    assert all(f">{label}<" in svg for label in ("95%", "92%", "90%", "87%"))  # efficiency at each point
    page = (out / "report.html").read_text()
    # one self-contained file
    assert page.count("<svg") == len(list(out.glob("*.svg"))) and "<img" not in page
    assert "<strong>tokens/s</strong>" in page and "**tokens/s**" not in page  # Definitions rendered
    short = pd.read_csv(out / "scaling_short.csv")
    assert len(short.columns) <= 12 < len(pd.read_csv(out / "scaling.csv").columns)
    assert "compile" not in short.columns and "offload" not in short.columns  # axes this study did not vary


def test_a_weak_and_a_strong_run_of_one_configuration_are_two_rows_that_say_which(tmp_path: Path) -> None:
    """At one node count, micro batch 2 a step and a global batch of 32 (micro batch 2 x 2 steps x 8 GPUs)
    are different runs: the scaling tables name each one's batch, so no two rows read alike."""
    sweep = tmp_path / "study"
    write_run(sweep, tokens_per_s=1000.0, nodes=1, micro_batch=2)
    write_run(sweep, tokens_per_s=1100.0, nodes=1, micro_batch=2, global_batch=32)
    out = tmp_path / "report"
    build(load(sweep), out)
    for table in ("scaling_short.csv", "scaling.csv"):
        rows = pd.read_csv(out / table)
        assert sorted(rows["batch"]) == ["gb32 sync_each", "mb2"], table
        described = rows.drop(columns=[c for c in rows.columns if "tokens/s" in c or "samples" in c
                                       or "TFLOPS" in c])
        assert not described.duplicated().any(), table


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
    assert "no ok run at 1 node (oom); efficiency is relative to 2 nodes instead" in text
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


def test_ablation_rows_of_one_factor_name_what_each_holds_fixed(tmp_path: Path) -> None:
    """fp32 -> bf16_mixed on tiny_llama at 1 node twice, once with AC none and once with AC full: two rows
    that differ only in what they hold fixed, and say so."""
    sweep = tmp_path / "ablation"
    for ac, fp32, bf16 in (("none", 1000.0, 1500.0), ("full", 800.0, 1000.0)):
        write_run(sweep, tokens_per_s=fp32, precision="fp32", activation_checkpointing=ac)
        write_run(sweep, tokens_per_s=bf16, precision="bf16_mixed", activation_checkpointing=ac)
    rows = ablation(aggregate(load(sweep).frame))
    rows = rows[rows["factor"] == "precision"]  # (the AC rows: none -> full at each precision)
    held = dict(zip(rows["held_fixed"], rows["gain_pct"].round(1)))
    assert len(rows) == 2 and len(held) == 2
    none = next(h for h in held if "AC none" in h)
    full = next(h for h in held if "AC full" in h)
    assert held[none] == 50.0 and held[full] == 25.0
    assert "bf16" not in none and "fp32" not in none  # the factor itself is not held fixed
    assert none.startswith("FULL_SHARD, AC none, wrap ") and "seq " in none
    text = build(load(sweep), tmp_path / "out").read_text()
    assert "held fixed" in text and none in text and full in text


def test_ablation_rows_for_compile_float8_and_offload(tmp_path: Path) -> None:
    sweep = tmp_path / "axes"
    base = dict(model="llama3_1_8b", nodes=1, activation_checkpointing="selective_op")
    write_run(sweep, tokens_per_s=5762.0, **base)  # the reference trainer's 8B figures on 8 H100
    write_run(sweep, tokens_per_s=6667.0, compile=True, **base)
    write_run(sweep, tokens_per_s=8532.0, compile=True, precision="fp8_tensorwise", **base)
    write_run(sweep, tokens_per_s=2881.0, offload="cpu", **base)
    rows = ablation(aggregate(load(sweep).frame))
    got = {(r.factor, str(r.baseline), str(r.optimised)): round(r.gain_pct, 1) for r in rows.itertuples()}
    assert got == {("compile", "False", "True"): 15.7,  # 6667 / 5762
                   ("precision", "bf16_mixed", "fp8_tensorwise"): 28.0,  # 8532 / 6667, both compiled
                   ("offload", "none", "cpu"): -50.0}
    text = build(load(sweep), tmp_path / "out").read_text()
    assert "FULL_SHARD fp8_tensorwise + selective_op AC + compile:" in text  # the answer names the options
    assert "BF16 peak too" in text and "| compile | offload |" in text


def test_results_from_before_the_new_axes_read_as_their_defaults(tmp_path: Path) -> None:
    sweep = tmp_path / "old"
    write_run(sweep, tokens_per_s=1000.0, nodes=1)
    from bench.run.collect import write_results
    frame = write_results(sweep).drop(columns=["compile", "offload"])  # a table written before them
    frame.to_parquet(sweep / rundir.RESULTS_PARQUET, index=False)
    frame.to_csv(sweep / rundir.RESULTS_CSV, index=False)
    loaded = load(sweep).frame
    assert list(loaded["compile"]) == [False] and list(loaded["offload"]) == ["none"]


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


def test_a_probe_only_study_gets_an_answer_sentence(tmp_path: Path) -> None:
    """2 nodes: TCP (0 EFA) at 1.0 GB/s, 4 EFA at 8.2 GB/s (repeats 8.0/8.2/8.4): 8.2x TCP, in the answer."""
    sweep = tmp_path / "efa"
    for efa, bws in ((0, [1.0]), (4, [8.0, 8.4, 8.2])):
        for repeat, bw in enumerate(bws):
            spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=8, efa_per_node=efa,
                           repeat=repeat)
            rundir.write_summary(rundir.run_dir(sweep, spec), RunSummary(
                run_id=spec.run_id, sweep="efa", status="ok", spec=spec, nccl_busbw_avg_gbs=bw,
                nccl_busbw_max_gbs=1.5 * bw))
    assert main([str(sweep)]) == 0
    shown = pages(load(sweep), sweep / "report")
    assert shown["answer"].body == ["2 nodes: 4 EFA gave 8.2 GB/s avg bus bandwidth (max 12.3), 8.2x TCP; "
                                    "0 EFA gave 1.0 GB/s avg bus bandwidth (max 1.5)"]
    assert list(shown["efa"].body["GPUs/node"]) == [8, 8]  # a probe of 1 GPU/node is not one of 8


def test_a_one_rank_probe_is_not_shown_as_network_bandwidth(tmp_path: Path) -> None:
    """One rank's busbw is 0 by definition: the EFA table leaves it out and says so; nccl.csv keeps it."""
    sweep = tmp_path / "efa"
    for nodes, gpus, bw in ((1, 1, 0.0), (2, 8, 8.2)):
        spec = RunSpec(kind="nccl", model="none", nodes=nodes, gpus_per_node=gpus, efa_per_node=4)
        rundir.write_summary(rundir.run_dir(sweep, spec), RunSummary(
            run_id=spec.run_id, sweep="efa", status="ok", spec=spec, nccl_busbw_avg_gbs=bw,
            nccl_busbw_max_gbs=bw, nccl_algbw_max_gbs=3.0))
    assert main([str(sweep)]) == 0
    out = sweep / "report"
    efa = pd.read_csv(out / "efa.csv")
    assert efa["nodes"].tolist() == [2] and len(pd.read_csv(out / "nccl.csv")) == 2
    assert ("1 one-rank all-reduce probe(s) measured no network (bus bandwidth is 0 by definition on one "
            "rank): left out of the EFA table, kept in nccl.csv") in (out / "report.md").read_text()


def test_an_efa_study_keeps_its_nccl_tables_to_8_columns_on_the_page(tmp_path: Path) -> None:
    """efa_probe's shape: 5 node counts x 4 EFA counts. The page shows the per-size table at 16 nodes (size +
    4 EFA columns, 16 nodes' figures), the by-node table in 8 columns; the CSVs keep all 20 placements; the
    HTML page keeps every column, collapsed."""
    sweep = tmp_path / "efa"
    for nodes in (1, 2, 4, 8, 16):
        for efa in (0, 1, 4, 32):
            bw = 1.0 + efa + nodes / 100
            spec = RunSpec(kind="nccl", model="none", nodes=nodes, gpus_per_node=8, efa_per_node=efa)
            sizes = [{"size": size, "busbw": bw * i, "algbw": bw * i / 2, "time_us": 10.0 * i}
                     for i, size in enumerate((1 << 20, 1 << 25, 1 << 30), 1)]
            rundir.write_summary(rundir.run_dir(sweep, spec), RunSummary(
                run_id=spec.run_id, sweep="efa", status="ok", spec=spec, nccl_busbw_avg_gbs=2 * bw,
                nccl_busbw_max_gbs=3 * bw, extra={"sizes": sizes}))
    shown = pages(load(sweep), sweep / "report")
    per_size, by_nodes = shown["nccl_sizes"].body, shown["nccl"].body
    assert len(per_size.columns) == 5 and len(by_nodes.columns) <= 8
    assert "busbw (GB/s) 16 nodes 32 EFA" in per_size and not any("8 nodes" in c for c in per_size.columns)
    assert per_size.set_index("size (B)").loc[1 << 30, "busbw (GB/s) 16 nodes 32 EFA"] == pytest.approx(
        99.48)  # 16 nodes, 32 EFA, 1 GiB: (1 + 32 + 0.16) x 3
    full = pd.read_csv(sweep / "report" / "nccl_sizes.csv")
    assert len(full.columns) == 21 and len(pd.read_csv(sweep / "report" / "nccl.csv").columns) > 8
    assert shown["nccl_sizes"].full.shape == full.shape  # the HTML's collapsed table: every column


def test_empty_dir_is_one_clear_error(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no sweep results") and err.count("\n") == 1


def test_only_failed_runs_still_give_a_report(tmp_path: Path) -> None:
    sweep = tmp_path / "bad"
    write_run(sweep, status="oom", nodes=1)
    write_run(sweep, status="timeout", nodes=2)
    shown = pages(load(sweep), sweep / "report")
    assert shown["none_ok"].body == ["every run failed or was pruned: see the run status table"]
    assert sorted(shown["status"].body["status"]) == ["oom", "timeout"]
    assert shown["status"].note == "0 of 2 runs ok; the 2 not ok above"
    text = (sweep / "report" / "report.md").read_text()
    assert "| oom |" in text and "| timeout |" in text


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


def test_foreign_and_incomplete_files_are_notes_not_tracebacks(tmp_path: Path, capsys) -> None:
    """A csv of someone else's columns, a sweep.yaml that is a YAML list, a summary without its fields (it
    would pass as a default ok run), and the note naming the source really used."""
    sweep = tmp_path / "mixed"
    good = write_run(sweep, tokens_per_s=1000.0, nodes=1)
    hollow = write_run(sweep, tokens_per_s=1900.0, nodes=2)
    (Path(hollow.run_dir) / rundir.SUMMARY_JSON).write_text(json.dumps({"run_id": hollow.run_id,
                                                                        "status": "ok"}))
    (sweep / rundir.RESULTS_CSV).write_text("name,score\nalice,3\n")
    (sweep / rundir.SWEEP_CONFIG).write_text("- just\n- a list\n")
    loaded = load(sweep)
    assert list(loaded.frame.run_id) == [good.run_id]  # the hollow summary is a run not finished
    assert any("without a readable summary" in n for n in loaded.notes)
    assert f"{sweep / rundir.RESULTS_CSV}: not a results table (no run_id, status" in loaded.notes[0]
    assert loaded.notes[0].endswith("rebuilt from the run dirs' summaries")
    assert main([str(sweep)]) == 0 and "Traceback" not in capsys.readouterr().err
    # a broken parquet beside a good csv: the note names the csv as the source
    pd.DataFrame([good.to_row()]).to_csv(sweep / rundir.RESULTS_CSV, index=False)
    (sweep / rundir.RESULTS_PARQUET).write_bytes(b"PAR1 truncated")
    notes = load(sweep).notes
    assert notes[0] == (f"{sweep / rundir.RESULTS_PARQUET}: unreadable (ArrowInvalid); "
                        "read results.csv instead")


def test_loss_parity_flags_the_strategy_that_trains_something_else(tmp_path: Path) -> None:
    sweep = tmp_path / "parity"
    curve = [10.0, 9.0, 8.5, 8.0]
    planted = {"FULL_SHARD": curve, "SHARD_GRAD_OP": [x * (1 + 1e-4) for x in curve],  # fp32 noise: same
               "NO_SHARD": curve[:2] + [8.5 * 1.01, 8.0]}  # 1% off at step 2: departs (fp32 tolerance 0.1%)
    for sharding, losses in planted.items():
        s = write_run(sweep, tokens_per_s=1.0, sharding=sharding, precision="fp32")
        s.extra = {"losses": losses}
        rundir.write_summary(Path(s.run_dir), s)
    write_run(sweep, tokens_per_s=1.0, sharding="NO_SHARD", precision="bf16_mixed")  # alone in its group
    parity = loss_parity(load(sweep).frame).set_index("run")
    assert parity.loc["SHARD_GRAD_OP AC=none transformer_block r0", "verdict"] == "same curve"
    assert parity.loc["NO_SHARD AC=none transformer_block r0", "max_rel_deviation"] == pytest.approx(0.01)
    assert parity.loc["NO_SHARD AC=none transformer_block r0", "verdict"] == "DEPARTS"
    assert set(parity["reference"]) == {"FULL_SHARD AC=none transformer_block r0"} and len(parity) == 2
    shown = pages(load(sweep), tmp_path / "out")
    assert sorted(shown["loss_parity"].body["verdict"]) == ["DEPARTS", "same curve"]
    assert any("departs from FULL_SHARD" in note for note in shown["notes"].body)
    written = pd.read_csv(tmp_path / "out" / "loss_parity.csv")  # the table beside the page, as a CSV
    assert sorted(written["verdict"]) == ["DEPARTS", "same curve"]


def test_cost_tables_known_answers(tmp_path: Path) -> None:
    sweep = tmp_path / "priced"
    sweep.mkdir()
    (sweep / rundir.SWEEP_CONFIG).write_text("cluster:\n  name: p5.48xlarge\n  price_per_hour: 100\n")
    ok = write_run(sweep, tokens_per_s=10000.0, nodes=2)
    ok.wall_s = 1800.0  # 2 nodes x 0.5 h x $100 = $100
    rundir.write_summary(Path(ok.run_dir), ok)
    failed = write_run(sweep, status="oom", nodes=1)
    failed.wall_s = 360.0  # 1 node x 0.1 h = $10, paid for although it failed
    rundir.write_summary(Path(failed.run_dir), failed)
    build(load(sweep), tmp_path / "out")
    sweeps = pd.read_csv(tmp_path / "out" / "cost_sweeps.csv")
    assert sweeps["USD"].tolist() == [pytest.approx(110.0)]
    assert sweeps["GPU-hours"].tolist() == [pytest.approx(8.8)]
    per_config = pd.read_csv(tmp_path / "out" / "cost.csv").set_index("nodes")
    assert per_config.loc[2, "USD per run"] == pytest.approx(100.0)
    assert per_config.loc[2, "USD per 1M tokens"] == pytest.approx(200 / 3600 / 10000 * 1e6)  # $5.56
    assert per_config.loc[2, "days to train 1e+12 tokens"] == pytest.approx(1e12 / 10000 / 86400)
    assert per_config.loc[2, "USD to train 1e+12 tokens"] == pytest.approx(200 * 1e12 / 10000 / 3600)
    assert main([str(sweep), "--out", str(tmp_path / "o2"), "--price", "p5.48xlarge=50"]) == 0
    assert pd.read_csv(tmp_path / "o2" / "cost_sweeps.csv")["USD"].tolist() == [pytest.approx(55.0)]
    assert main([str(sweep), "--price", "cheap"]) == 2


def test_the_largest_miss_names_a_cause_that_fits_the_device() -> None:
    """A calibrated CPU run's miss is named by its 16-bit compute dtype where it has one (precision on a
    CPU), else said unknown, never the machine's noise; an uncalibrated CPU run's is the published
    constants'; a GPU run's is what bounds its step."""
    from analysis.predicted import CAUSES, CPU_16BIT_CAUSE, CPU_UNKNOWN_CAUSE, largest_miss
    table = pd.DataFrame({"model": ["tiny_llama"] * 2,
                          "configuration": ["FULL_SHARD fp16_mixed", "FULL_SHARD fp32"],
                          "precision": ["fp16_mixed", "fp32"],
                          "nodes": [2, 1], "tokens_per_s_per_gpu": [102.0, 500.0],
                          "pred_tokens_per_s_per_gpu": [898.0, 510.0], "pred_bound": ["compute-bound"] * 2,
                          "pred_source": ["this study's 5 runs", "this study's 6 runs"]})
    table["error"] = table.tokens_per_s_per_gpu / table.pred_tokens_per_s_per_gpu - 1
    cpu, gpu = largest_miss(table, cpu=True)[0], largest_miss(table, cpu=False)[0]
    assert "tiny_llama FULL_SHARD fp16_mixed at 2 nodes ran 8.80x slower than predicted (102 vs 898" in cpu
    assert cpu.endswith(CPU_16BIT_CAUSE.format(dtype="fp16")) and gpu.endswith(CAUSES["compute-bound"])
    fp32 = largest_miss(table.iloc[[1]], cpu=True)[0]
    assert "FULL_SHARD fp32 at 1 node" in fp32 and fp32.endswith(CPU_UNKNOWN_CAUSE)
    published = largest_miss(table.assign(pred_source="published constants"), cpu=True)[0]
    assert "which no CPU run calibrated" in published


def test_each_predicted_row_shows_the_base_its_efficiency_was_predicted_against(tmp_path: Path) -> None:
    """The 2-node run launched first, predicted with the published constants (1000 tokens/s/GPU at 2 nodes
    against 1250 at 1 node: 80%); the 1-node run launched later, calibrated on the study's 3 runs (900).
    The row says 80% of 1250 and which prediction, not 80% beside a base row of 900 (which reads 111%)."""
    sweep = tmp_path / "study"
    for nodes, pred, base, source in ((2, 1000.0, 1250.0, "published constants"),
                                      (1, 900.0, 900.0, "this study's 3 runs")):
        summary = write_run(sweep, tokens_per_s=800.0 * nodes * 8, nodes=nodes)
        summary.pred_tokens_per_s_per_gpu, summary.pred_base_tokens_per_s_per_gpu = pred, base
        summary.pred_scaling_efficiency, summary.pred_source = pred / base, source
        rundir.write_summary(Path(summary.run_dir), summary)
    out = tmp_path / "report"
    build(load(sweep), out)
    short = pd.read_csv(out / "predicted_short.csv").set_index("nodes x GPUs")
    column = "predicted efficiency (of the base, predicted with)"
    assert short.loc["2x8", column] == "80% of 1,250 (published constants)"
    assert short.loc["1x8", column] == "100% of 900 (this study's 3 runs)"
    assert len(short.columns) + 1 <= 8  # the page's limit (analysis/test_browser.py), the index included


def test_a_run_held_back_by_a_straggler_is_flagged_beside_its_efficiency(tmp_path: Path) -> None:
    """The 4-node run's summary named node3 (its compute 2.4x the others', 1.2 s a step they waited): the
    page flags that row beside its efficiency and says why; the 2-node run, whose slowest node was within
    the tolerance, is not flagged. The study's preflight, which named node3 too, is its own table."""
    sweep = tmp_path / "study"
    for nodes in (1, 2, 4):
        summary = write_run(sweep, tokens_per_s=SCALING[nodes], nodes=nodes)
        if nodes > 1:
            summary.slowest_node = f"node{nodes - 1}"
            summary.slowest_node_held_s = 1.2 if nodes == 4 else 0.01
            summary.slowest_node_excess = 1.4 if nodes == 4 else 0.02
            summary.straggler = "node3" if nodes == 4 else None
            rundir.write_summary(rundir.run_dir(sweep, summary.spec), summary)
    rows = [{"node": f"node{i}", "answered": True, "matmul_tflops": 0.3 if i == 3 else 1.0, "copy_gbs": 9.0,
             "pair_busbw_gbs": 2.0, "torch": "2.13.0",
             "problems": ["matmul TFLOPS 70% below"] if i == 3 else []}
            for i in range(1, 5)]
    rundir.write_json(sweep / rundir.PREFLIGHT_JSON, {"when": "2026-11-27T07:30:00", "seconds": 55.0,
                                                      "tolerance": 0.25, "rows": rows, "links": [],
                                                      "pairs": []})
    out = tmp_path / "report"
    shown = pages(load(sweep), out)
    preflight = shown["preflight"].body.set_index("node")
    assert list(preflight.loc["node3"]) == ["study", 0.3, 9.0, 2.0, "2.13.0", "matmul TFLOPS 70% below"]
    assert list(preflight.loc["node1"]) == ["study", 1.0, 9.0, 2.0, "2.13.0", "ok"]
    notes = shown["notes"].body
    assert "study: preflight of 4 node(s) at 2026-11-27T07:30:00: named node3 (tolerance 25%)" in notes
    scaling = shown["scaling"].body.set_index("nodes")
    assert list(scaling.loc[4, ["scaling efficiency", "straggler"]]) == [
        "92%", "node3 (compute +140%, 1.2 s a step)"]
    assert pd.isna(scaling.loc[2, "straggler"])
    assert any(n.startswith("study: 1 run(s) were held back by a straggler (node3)") for n in notes)


def test_a_floor_prediction_is_counted_apart_not_named_the_largest_miss() -> None:
    """A CPU-offload run 13x below its prediction (the H200's: 2,784 against 38,095) is what the model leaves
    out, not a miss of its constants: the median and the largest miss are the other runs'."""
    from analysis.predicted import largest_miss
    from bench.predict.perf import FLOOR
    table = pd.DataFrame({"model": ["llama3_2_1b"] * 3,
                          "configuration": ["bf16", "bf16 + offload cpu", "fp32"],
                          "nodes": [1, 1, 1], "tokens_per_s_per_gpu": [48641.0, 2784.0, 4963.0],
                          "pred_tokens_per_s_per_gpu": [46605.0, 38095.0, 5242.0],
                          "pred_bound": ["compute-bound", "host-bound", "compute-bound"],
                          "pred_source": ["published constants",
                                          f"published constants{FLOOR}CPU offload (...)",
                                          "published constants"]})
    table["error"] = table.tokens_per_s_per_gpu / table.pred_tokens_per_s_per_gpu - 1
    line = largest_miss(table, cpu=False)[0]
    assert "(median over 2)" in line and "left out, their prediction a floor only: 1 (CPU offload" in line
    assert "fp32 at 1 node ran 1.06x slower" in line
    only = largest_miss(table.iloc[[1]], cpu=False)
    assert only == ["prediction: left out, their prediction a floor only: 1 (CPU offload (...))"]


def test_the_efa_table_shows_the_three_collectives_side_by_side(tmp_path: Path) -> None:
    """Probes of each collective at 2 nodes with 4 and 32 EFA (repeats' medians), and a training run whose
    communication model names the probes that fed it."""
    sweep = tmp_path / "efa"
    figures = {"all_reduce": 100.0, "all_gather": 70.0, "reduce_scatter": 80.0}
    for collective, bw in figures.items():
        for efa in (4, 32):
            for repeat, jitter in enumerate((0.9, 1.0, 1.1)):
                spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=8, efa_per_node=efa,
                               collective=collective, repeat=repeat, cluster="p5.48xlarge")
                value = bw * efa / 32 * jitter
                sizes = [{"size": 2**28, "busbw": value, "algbw": value, "time_us": 1.0}]
                rundir.write_summary(rundir.run_dir(sweep, spec), RunSummary(
                    run_id=spec.run_id, sweep="efa", status="ok", spec=spec, nccl_busbw_avg_gbs=value / 2,
                    nccl_busbw_max_gbs=value, nccl_transport="AWS Libfabric", extra={"sizes": sizes}))
    train = RunSpec(model="llama2_7b", nodes=2, gpus_per_node=8, efa_per_node=32, cluster="p5.48xlarge")
    rundir.write_summary(rundir.run_dir(sweep, train), RunSummary(
        run_id=train.run_id, sweep="efa", status="ok", spec=train, step_time_s=2.0, tokens_per_s=1000.0))
    shown = pages(load(sweep), sweep / "report")
    efa = pd.read_csv(sweep / "report" / "efa.csv").set_index("EFA adapters")
    assert efa.loc[32, "max busbw (GB/s)"] == 100.0 and efa.loc[4, "max busbw (GB/s)"] == 12.5
    assert efa.loc[32, "all-gather max busbw (GB/s)"] == 70.0
    assert efa.loc[32, "reduce-scatter max busbw (GB/s)"] == 80.0
    assert efa.loc[32, "all-gather avg busbw (GB/s)"] == 35.0 and efa.loc[32, "ok runs"] == 9
    assert shown["efa"].body.equals(efa.reset_index()[shown["efa"].body.columns])  # the page: every column
    comm = pd.read_csv(sweep / "report" / "comm_model.csv").iloc[0]
    assert comm["probes used"] == ("all-gather: all_gather probe at 2 nodes; "
                                   "reduce-scatter: reduce_scatter probe at 2 nodes")
    assert comm["all-gather busbw (GB/s)"] == 70.0
    assert list(shown["comm_model"].body["probes used"]) == [comm["probes used"]]


def test_each_section_is_declared_once_and_names_every_column_it_shows() -> None:
    """One id per section, and a name for every column it declares (the vocabulary or its own), so no
    table reaches a page with a column nobody named."""
    ids = [s.id for s in SECTIONS]
    assert len(set(ids)) == len(ids)
    for section in (s for s in SECTIONS if s.columns):
        for keys, page in ((section.columns.long, False), (section.columns.short, True)):
            names = section.columns.names(keys or (), "1e+12 tokens", page)
            assert all(names.values()) and not any("{" in n for n in names.values()), section.id


def test_a_section_is_one_entry(tmp_path: Path, monkeypatch) -> None:
    """A section appended to the list (runs per node count, 1, 1 and 2) reaches its CSV, both pages and the
    Definitions, with nothing else edited; a detail section is a line of the Markdown naming its CSV."""
    sweep = tmp_path / "study"
    for nodes, repeat in ((1, 0), (2, 0), (2, 1)):
        write_run(sweep, tokens_per_s=SCALING[nodes], nodes=nodes, repeat=repeat)
    count = Section("runs_by_nodes", "Runs by node count",
                    lambda i: i.frame.groupby("nodes").size().reset_index(name="runs"),
                    Columns(("nodes", "runs")), definition="how many runs each node count has.")
    detail = Section("runs_listed", "Every run", lambda i: i.frame[["run_id", "nodes"]], detail=True)
    monkeypatch.setattr(report, "SECTIONS", [*SECTIONS[:-1], count, detail, SECTIONS[-1]])
    out = tmp_path / "report"
    shown = pages(load(sweep), out)
    assert pd.read_csv(out / "runs_by_nodes.csv").values.tolist() == [[1, 1], [2, 2]]
    assert list(shown)[-3:] == ["runs_by_nodes", "runs_listed", "provenance"]
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "| nodes | runs |\n|---|---|\n| 1 | 1 |\n| 2 | 2 |" in md
    assert "- **Runs by node count**: how many runs each node count has." in md
    assert "- Every run: [runs_listed.csv](runs_listed.csv)" in md and "| run_id | nodes |" not in md
    assert "<section id='runs_by_nodes'>" in page and "<details id='runs_listed' class='detail'>" in page
    assert all(run_id in page for run_id in pd.read_csv(out / "runs_listed.csv")["run_id"])
