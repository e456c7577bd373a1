"""The parser on real all_gather_perf and reduce_scatter_perf outputs (bench/probes/testdata, sources in its
README): their rows, their collective and rank count, their bus bandwidth factor (n-1)/n, and probe outputs
that hold several collectives or only some of them. Expected values are read off the tables."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.core.schema import RunSpec
from bench.probes.parse import by_collective, parse, parse_all
from bench.probes.records import records_from_output

DATA = Path(__file__).parent / "testdata"
AG_2180, RS_2180 = "ag_2.18.0_rtx5090_2ranks.txt", "rs_2.18.0_rtx5090_2ranks.txt"
AG_2176, AG_2185 = "ag_2.17.6_gb300_8ranks.txt", "ag_2.18.5_gb10_2ranks.txt"
RS_OLD = "rs_2.13-2.16_excerpt_8ranks.txt"


def text(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("name,collective,ranks,rows,version", [
    (AG_2180, "all_gather", 2, 16, "2.18.0"), (RS_2180, "reduce_scatter", 2, 16, "2.18.0"),
    (AG_2176, "all_gather", 8, 46, "2.17.6"), (AG_2185, "all_gather", 2, 2, "2.18.5")])
def test_complete_outputs_of_each_version(name: str, collective: str, ranks: int, rows: int,
                                          version: str) -> None:
    r = parse(text(name))
    assert (r.collective, r.ranks, len(r.rows), r.tests_version) == (collective, ranks, rows, version)
    assert r.status == "ok" and r.avg_busbw == pytest.approx(r.avg_busbw_printed, abs=0.011)


@pytest.mark.parametrize("name", [AG_2180, RS_2180, AG_2176, AG_2185])
def test_bus_bandwidth_is_algbw_times_n_minus_1_over_n_not_the_all_reduce_factor(name: str) -> None:
    """Every printed row satisfies busbw = size / time x (n-1)/n to the table's rounding (2 decimals; time
    to 4-6 digits); all-reduce's 2(n-1)/n would double it."""
    r = parse(text(name))
    n = r.ranks
    for row in r.rows:
        algbw = row.size / row.time_us / 1e3  # GB/s
        assert row.algbw == pytest.approx(algbw, abs=0.006, rel=1e-3)
        assert row.busbw == pytest.approx(algbw * (n - 1) / n, abs=0.006, rel=1e-3)
    big = max(r.rows, key=lambda row: row.algbw)
    assert big.busbw < 0.9 * big.algbw * 2 * (n - 1) / n


def test_rows_as_printed() -> None:
    ag = parse(text(AG_2176))
    first, last = ag.rows[0], ag.rows[-1]
    assert (first.size, first.count, first.dtype, first.redop, first.root, first.placement) == (
        4096, 128, "float", "none", -1, "out-of-place")
    assert (first.time_us, first.algbw, first.busbw, first.wrong) == (28.51, 0.14, 0.13, 0)
    assert (last.size, last.placement, last.time_us, last.algbw, last.busbw) == (
        17179869184, "in-place", 40243.2, 426.90, 373.54)
    assert ag.busbw_max == 378.90 and ag.algbw_max == 433.03 and ag.out_of_bounds == 0
    rs = parse(text(RS_2180))
    row = next(x for x in rs.rows if x.size == 33554432 and x.placement == "out-of-place")
    assert (row.count, row.redop, row.time_us, row.algbw, row.busbw) == (4194304, "sum", 6181.84, 5.43, 2.71)
    assert rs.busbw_max == 2.73 and rs.avg_busbw_printed == 1.73537
    gb10 = parse(text(AG_2185))
    assert [(x.size, x.time_us, x.busbw) for x in gb10.rows] == [(17179869184, 374425.0, 22.94),
                                                               (17179869184, 373792.0, 22.98)]


def test_an_older_excerpt_is_told_by_its_count_column() -> None:
    """No version header, no binary name, no device lines, no footer: the count column (each rank's share,
    128 B of float over 8 ranks = 4) says reduce-scatter over 8 ranks, and the excerpt is truncated."""
    r = parse(text(RS_OLD))
    assert r.binary is None and r.ranks is None
    assert (r.collective, r.inferred_ranks(), r.status, len(r.rows)) == ("reduce_scatter", 8, "truncated", 14)
    assert r.rows[-1].size == 256 and r.rows[-1].count == 8


def test_a_probe_output_with_several_collectives_is_read_for_each(shared_data) -> None:
    all_reduce = (shared_data / "nccl-tests" / "sample_09.txt").read_text()
    joined = text(AG_2176) + text(RS_2180) + all_reduce
    assert [r.collective for r in parse_all(joined)] == ["all_gather", "reduce_scatter", "all_reduce"]
    each = by_collective(joined)
    assert {k: len(v.rows) for k, v in each.items()} == {"all_gather": 46, "reduce_scatter": 16,
                                                          "all_reduce": 56}
    for collective, result in each.items():
        spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=4, collective=collective)
        summary = records_from_output(joined, spec)[-1]
        assert summary["status"] == "ok" and summary["collective"] == collective
        assert summary["busbw_max_gbs"] == result.busbw_max
        assert summary["busbw_avg_gbs"] == result.avg_busbw_printed


def test_a_probe_output_holding_only_some_collectives_is_parsed_for_those() -> None:
    """A job that ran its all-gather and died in its reduce-scatter's table: the gather is whole, the
    reduce-scatter truncated at the row it died in; the all-reduce it never reached is a failed summary
    that says what the output holds."""
    rs = text(RS_2180)
    died = text(AG_2180) + rs[:rs.index("    33554432")]
    each = by_collective(died)
    assert each["all_gather"].status == "ok" and len(each["all_gather"].rows) == 16
    assert each["reduce_scatter"].status == "truncated" and each["reduce_scatter"].rows[-1].size == 16777216
    assert "all_reduce" not in each
    spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=1, collective="all_reduce")
    summary = records_from_output(died, spec)[-1]
    assert summary["status"] == "failed"
    assert summary["error"] == "the output holds all_gather, reduce_scatter results, not all_reduce"
    gathered = records_from_output(died, RunSpec(kind="nccl", model="none", nodes=2, collective="all_gather"))
    assert gathered[-1]["status"] == "ok" and len([r for r in gathered if r["kind"] == "nccl"]) == 16


def test_all_reduce_outputs_are_still_all_reduce(shared_data) -> None:
    """The all-reduce fixtures (no binary name before 2.17): count = size / 4, so never a gather."""
    for name in ("sample_01.txt", "sample_06.txt", "sample_08.txt", "sample_09.txt"):
        r = parse((shared_data / "nccl-tests" / name).read_text())
        assert r.collective == "all_reduce" and r.shares_per_rank() == 1
