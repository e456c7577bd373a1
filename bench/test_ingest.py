"""Bring your own logs: real nccl-tests outputs (all_reduce_perf, all_gather_perf, reduce_scatter_perf)
become runs of a results dir, and the report shows their bandwidth as the table printed it."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.load import load
from analysis.report import main as report, pages
from bench.ingest import main as ingest
from bench.probes.parse import parse


def test_old_outputs_become_probe_runs_and_reach_the_report(shared_data: Path, tmp_path: Path,
                                                            capsys) -> None:
    sample = shared_data / "nccl-tests" / "sample_01.txt"  # EKS, 2 ranks over EFA ("found 1 nics")
    notes = tmp_path / "notes.txt"
    notes.write_text("nccl-tests crashed before printing anything\n")
    rc = ingest([str(sample), str(notes), str(tmp_path / "missing.txt"), "--nodes", "2",
                 "--gpus-per-node", "1", "--efa", "1", "--cluster", "eks-t4",
                 "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert rc == 0
    assert f"skipped {notes}: no nccl-tests results table" in err and "missing.txt" in err  # listed
    table = pd.read_csv(tmp_path / "results" / "nccl_ingest" / "results.csv")
    assert len(table) == 1
    row = table.iloc[0]
    parsed = parse(sample.read_text())
    assert row.status == "ok" and row.nccl_transport == "AWS Libfabric"  # checked as a swept probe is
    assert row.nccl_busbw_avg_gbs == parsed.avg_busbw_printed == 1.15327
    assert row.nccl_busbw_max_gbs == parsed.busbw_max == 3.15
    assert report([str(tmp_path / "results" / "nccl_ingest")]) == 0
    efa = pages(load(tmp_path / "results" / "nccl_ingest"), tmp_path / "report")["efa"].body
    # nodes, GPUs/node, EFA, transport, NICs, avg, max, ok runs
    assert efa.values.tolist() == [[2, 1, 1, "AWS Libfabric", "1", 1.15327, 3.15, 1]]


def test_a_wrong_efa_label_is_flagged_not_kept(shared_data: Path, tmp_path: Path) -> None:
    sample = shared_data / "nccl-tests" / "sample_01.txt"
    assert ingest([str(sample), "--nodes", "2", "--gpus-per-node", "1", "--efa", "4",
                   "--results", str(tmp_path)]) == 0
    row = pd.read_csv(tmp_path / "nccl_ingest" / "results.csv").iloc[0]
    assert row.status == "nccl_error" and "found 1 nics" in row.error


def test_a_16_rank_a3_output_keeps_its_printed_figures(shared_data: Path, tmp_path: Path) -> None:
    """Another layout and launcher (sample_05: 16 ranks, an 'Avg bus bandwidth' footer, no NCCL INFO lines):
    2 nodes x 8 GPUs, as its device list says."""
    sample = shared_data / "nccl-tests" / "sample_05.txt"
    parsed = parse(sample.read_text())
    assert parsed.inferred_ranks() == 16
    assert ingest([str(sample), "--nodes", "2", "--gpus-per-node", "8", "--efa", "0",
                   "--results", str(tmp_path)]) == 0
    row = pd.read_csv(tmp_path / "nccl_ingest" / "results.csv").iloc[0]
    assert row.status == "ok" and row.nccl_busbw_avg_gbs == parsed.avg_busbw_printed == 70.742
    assert row.nccl_busbw_max_gbs == parsed.busbw_max == 338.82


def test_a_log_of_several_collectives_becomes_a_run_of_each(tmp_path: Path) -> None:
    """A job's log that ran all_gather_perf then reduce_scatter_perf (bench/probes/testdata's real 2.18.0
    tables): one probe run per collective, each with its own table's figures, side by side in the EFA
    table."""
    data = Path(__file__).resolve().parent / "probes" / "testdata"
    log = tmp_path / "job.log"
    log.write_text((data / "ag_2.18.0_rtx5090_2ranks.txt").read_text()
                   + (data / "rs_2.18.0_rtx5090_2ranks.txt").read_text())
    assert ingest([str(log), "--nodes", "2", "--gpus-per-node", "1", "--efa", "0",
                   "--results", str(tmp_path / "results")]) == 0
    table = pd.read_csv(tmp_path / "results" / "nccl_ingest" / "results.csv").set_index("collective")
    assert sorted(table.index) == ["all_gather", "reduce_scatter"]
    assert table.loc["all_gather", "nccl_busbw_avg_gbs"] == 1.53568
    assert table.loc["reduce_scatter", "nccl_busbw_max_gbs"] == 2.73
    assert report([str(tmp_path / "results" / "nccl_ingest")]) == 0
    efa = pd.read_csv(tmp_path / "results" / "nccl_ingest" / "report" / "efa.csv").iloc[0]
    assert efa["all-gather max busbw (GB/s)"] == 2.50 and efa["reduce-scatter avg busbw (GB/s)"] == 1.73537
