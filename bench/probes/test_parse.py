"""The nccl-tests parser on the real outputs in ../shared/data/nccl-tests (see its README for sources).

Expected values are read off the tables by hand (row counts, first/last rows, maxima); the Avg bus
bandwidth check recomputes nccl-tests' own definition from the parsed rows.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from bench.core.schema import RunSpec
from bench.probes.parse import parse, parse_all, parse_json, printed_versions, strip_prefix
from bench.probes.records import check_transport, records_from_output

COMPLETE = ["sample_01.txt", "sample_05.txt", "sample_06.txt", "sample_07.txt", "sample_08.txt",
            "sample_09.txt"]


def text(shared_data, name: str) -> str:
    return (shared_data / "nccl-tests" / name).read_text()


@pytest.mark.parametrize("name", COMPLETE)
def test_mean_of_parsed_busbw_reproduces_the_avg_line(shared_data, name: str) -> None:
    r = parse(text(shared_data, name))
    assert r.status == "ok" and r.complete
    assert r.avg_busbw == pytest.approx(r.avg_busbw_printed, abs=0.011)


def test_srun_prefixed_table_without_footer(shared_data) -> None:
    r = parse(text(shared_data, "sample_02.txt"))  # lines start with "0: " (srun -l)
    assert len(r.rows) == 2 * 29  # 8 B .. 2 GiB, out-of-place and in-place
    first = r.rows[0]
    assert (first.size, first.count, first.dtype, first.redop, first.root, first.placement) == (
        8, 2, "float", "sum", -1, "out-of-place")
    assert (first.time_us, first.algbw, first.busbw, first.wrong) == (164.3, 0.0, 0.0, 0)
    last_in = r.rows[-1]
    assert (last_in.size, last_in.placement, last_in.time_us, last_in.busbw) == (
        2147483648, "in-place", 51406.0, 78.33)
    assert r.busbw_max == 78.33
    assert r.status == "truncated"  # no Avg line: the excerpt stops at the table
    assert r.inferred_ranks() == 16  # 78.33 / 41.78 = 2 * 15 / 16


def test_mpirun_tags_and_nccl_info_inside_the_table(shared_data) -> None:
    r = parse(text(shared_data, "sample_01.txt"))  # [1,0]<stdout>: prefixes, 2 ranks, NCCL 2.12
    assert len(r.rows) == 62 and r.ranks == 2
    assert all(row.busbw == row.algbw for row in r.rows)  # 2(n-1)/n = 1 for two ranks
    assert r.rows[0].size == 0 and r.rows[-1].size == 1073741824
    assert r.nccl_version == "2.12.7+cuda11.4"
    assert r.network == "AWS Libfabric"
    assert any("Selected Provider is efa" in e for e in r.transport_evidence)


def test_pre_2_13_layout_with_error_column(shared_data) -> None:
    r = parse(text(shared_data, "sample_08.txt"))  # size count type redop time algbw busbw error
    assert len(r.rows) == 2 * 13
    row = r.rows[0]
    assert (row.size, row.redop, row.root, row.time_us, row.busbw, row.error, row.wrong) == (
        1048576, "sum", None, 135.3, 15.02, 7e-07, None)
    assert r.busbw_max == 191.56 and r.avg_busbw_printed == 113.289


def test_2_17_and_2_18_version_headers(shared_data) -> None:
    r18 = parse(text(shared_data, "sample_09.txt"))
    assert r18.tests_version == "2.18.3" and r18.ranks == 8 and len(r18.rows) == 2 * 28
    assert r18.rows[0].dtype == "int8" and r18.busbw_max == 107.63
    assert r18.config["iters"] == "20" and r18.config["maxBytes"] == "134217728"


def test_wrong_results_and_missing_footer(shared_data) -> None:
    r = parse(text(shared_data, "sample_10.txt"))  # 2.17.9, validation errors from 2 MB up
    assert r.tests_version == "2.17.9" and r.status == "wrong_results"
    row = next(x for x in r.rows if x.size == 2097152 and x.placement == "out-of-place")
    assert row.wrong == 18134
    assert r.wrong_total == (18134 + 9609 + 96817 + 124342 + 763876 + 530181 + 404221 + 103664 + 951005
                             + 820604 + 113492 + 0)


@pytest.mark.parametrize("name", ["sample_04.txt", "sample_14.txt", "sample_15.txt"])
def test_excerpts_whose_rows_do_not_reproduce_the_avg_are_truncated(shared_data, name: str) -> None:
    r = parse(text(shared_data, name))
    assert r.rows and r.avg_busbw_printed is not None
    assert r.status == "truncated"


def test_single_large_message_excerpt(shared_data) -> None:
    r = parse(text(shared_data, "sample_14.txt"))
    assert [(x.size, x.placement, x.busbw) for x in r.rows] == [
        (2147483648, "out-of-place", 468.60), (2147483648, "in-place", 468.62)]


def test_crash_mid_table(shared_data) -> None:
    full = text(shared_data, "sample_06.txt")
    cut = full[: full.index("   134217728      33554432") + 40]  # dies while printing a row
    r = parse(cut)
    assert r.status == "truncated" and r.rows[-1].size == 67108864
    assert len(r.rows) == 2 * 24  # 8 B .. 64 MiB; the half-written row is dropped


def test_concatenated_logs_give_one_result_each(shared_data) -> None:
    results = parse_all(text(shared_data, "sample_06.txt") + text(shared_data, "sample_09.txt"))
    assert [len(r.rows) for r in results] == [62, 56]
    assert [r.status for r in results] == ["ok", "ok"]


def test_nccl_info_lines_inside_a_table_leave_its_rows_alone(shared_data) -> None:
    clean = text(shared_data, "sample_06.txt")
    noisy = clean.replace("\n     1048576 ",
                          "\nhost:1:1 [0] NCCL INFO Channel 00 via NET/Socket/0\n     1048576 ", 1)
    assert noisy != clean
    a, b = parse(clean), parse(noisy)
    assert b.rows == a.rows and len(a.rows) == 62
    assert b.transport_evidence and not a.transport_evidence


def test_json_output(shared_data) -> None:
    """-J output in nccl-tests' JSON layout, carrying the rows of a real table."""
    table = parse(text(shared_data, "sample_06.txt"))
    pairs = list(zip(table.rows[0::2], table.rows[1::2]))
    doc = {"config": {"nthreads": 1, "ngpus": 1, "devices": [{"rank": i} for i in range(16)]},
           "nccl_version": 21903, "results": [
               {"size": o.size, "count": o.count, "type": o.dtype, "redop": o.redop, "root": "    -1",
                "out_of_place": {"time": o.time_us, "alg_bw": o.algbw, "bus_bw": o.busbw, "nwrong": o.wrong},
                "in_place": {"time": i.time_us, "alg_bw": i.algbw, "bus_bw": i.busbw, "nwrong": i.wrong},
                "actual_iterations": 20, "experiment_name": "all_reduce"} for o, i in pairs],
           "out_of_bounds": {"count": 0, "okay": True},
           "average_bus_bandwidth": {"bandwidth": table.avg_busbw_printed, "okay": "unchecked"}, "errors": []}
    r = parse_json(json.dumps(doc))
    assert r.rows == table.rows and r.ranks == 16 and r.nccl_version == "2.19.3"
    assert r.status == "ok"


def test_prefixes_are_stripped() -> None:
    assert strip_prefix("[1,0]<stdout>:  8  2 float") == "  8  2 float"
    assert strip_prefix("12:           8") == "          8"
    assert strip_prefix("2026-11-22T16:20:11.123456Z # Avg bus bandwidth : 1") == "# Avg bus bandwidth : 1"
    assert strip_prefix("\x1b[32m# Avg\x1b[0m") == "# Avg"
    # a row mpirun read in two pieces (Open MPI 4.1, seen in the MPIJob contract test): tagged twice
    assert strip_prefix("[1,0]<stdout>:   134217728    [1,0]<stdout>:  33554432     float     sum      -1") \
        == "   134217728      33554432     float     sum      -1"


def test_records_and_transport_check(shared_data) -> None:
    out = text(shared_data, "sample_01.txt")
    efa = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=1, efa_per_node=1)
    records = records_from_output(out, efa)
    summary = records[-1]
    assert summary["kind"] == "summary" and summary["status"] == "ok"
    assert summary["busbw_avg_gbs"] == 1.15327 and summary["transport"] == "AWS Libfabric"
    assert len(records) == 63
    assert check_transport(summary, efa, out)["status"] == "ok"
    socket = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=1, efa_per_node=0)
    flagged = check_transport(summary, socket, out)
    assert flagged["status"] == "nccl_error" and "Socket" in flagged["error"]
    # sample_01 is a 1-adapter run ("found 1 nics"): kept at 1 EFA, flagged if its row says 4.
    assert summary["nics"] == 1 and summary["network_measurement"]
    four = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=1, efa_per_node=4)
    mislabelled = check_transport(summary, four, out)
    assert mislabelled["status"] == "nccl_error" and "found 1 nics" in mislabelled["error"]


def _same(a, b) -> None:
    assert (a.rows, a.avg_busbw_printed, a.ranks, a.config, a.nccl_version, a.network, a.status) == (
        b.rows, b.avg_busbw_printed, b.ranks, b.config, b.nccl_version, b.network, b.status)


@pytest.mark.parametrize("prefix", ["{i}: ", " {i}: ", "10{i}: ", "[1,{i}]<stdout>:",
                                    "2026-11-22T16:20:11.123Z ", "\x1b[32m"])
def test_a_launcher_prefix_on_every_line_changes_nothing(shared_data, prefix: str) -> None:
    clean = text(shared_data, "sample_06.txt")
    prefixed = "\n".join(prefix.format(i=i % 3) + line for i, line in enumerate(clean.splitlines()))
    _same(parse(prefixed), parse(clean))
    _same(parse(clean.replace("\n", "\r\n")), parse(clean))


def test_rows_converted_in_bulk_equal_rows_read_one_by_one(shared_data) -> None:
    """A half-written line sends the whole table down the line-by-line path; the rest must not change."""
    for name in COMPLETE:
        clean = text(shared_data, name)
        lines = clean.splitlines()
        last = max(i for i, line in enumerate(lines) if strip_prefix(line).strip()[:1].isdigit())
        lines.insert(last + 1, "   99   ")
        one_by_one, bulk = parse("\n".join(lines)), parse(clean)
        assert one_by_one.rows == bulk.rows and len(bulk.rows) >= 4


def test_summary_figures_agree_with_the_rows(shared_data) -> None:
    """status and the summary read per-table figures kept beside the columns: they must be the rows'."""
    results = parse_all("".join(text(shared_data, n) + "\n" for n in sorted(COMPLETE + ["sample_10.txt"])))
    assert len(results) == 7
    for r in results:
        assert r.avg_busbw == pytest.approx(sum(x.busbw for x in r.rows) / len(r.rows), rel=1e-12)
        assert r.busbw_max == max(x.busbw for x in r.rows) and r.algbw_max == max(x.algbw for x in r.rows)
        assert r.wrong_total == sum(x.wrong or 0 for x in r.rows)


def test_tables_keep_their_order_when_one_is_read_line_by_line(shared_data) -> None:
    lines = text(shared_data, "sample_08.txt").splitlines()  # no footer after the Avg line's table
    avg = next(i for i, line in enumerate(lines) if "Avg bus bandwidth" in line)
    rows = [line for line in lines if line.strip()[:1].isdigit()]
    # rows, the Avg line, then the first rows again with one cut short: two blocks of one run
    r = parse("\n".join(lines[:avg + 1] + rows[:3] + ["   4096"]))
    assert [x.size for x in r.rows[-6:]] == [1048576, 1048576, 2097152, 2097152, 4194304, 4194304]
    assert len(r.rows) == 2 * 13 + 6


def test_cut_inside_a_footer_line_is_truncated_not_a_crash(shared_data) -> None:
    full = text(shared_data, "sample_06.txt")
    r = parse(full[: full.index("# Avg bus bandwidth") + len("# Avg bus bandwidth    :")])
    assert r.avg_busbw_printed is None and r.status == "truncated" and len(r.rows) == 62


def test_version_lines_cut_short_are_not_a_crash(shared_data) -> None:
    full = text(shared_data, "sample_09.txt")
    assert parse(full).tests_version == "2.18.3"
    rest = full.split("\n", 1)[1]
    r = parse("# nccl-tests version\n" + rest + "\nNCCL version")
    assert r.tests_version is None and r.status == "ok" and len(r.rows) == 2 * 28


def test_not_available_wrong_counts_are_none(shared_data) -> None:
    table = text(shared_data, "sample_06.txt")
    r = parse(re.sub(r"(?m)^(\s+\d+\s+\d+\s+\S+\s+\S+\s+-?\d+(?:\s+\S+){3})\s+0(\s+(?:\S+\s+){3})0$",
                     r"\1    N/A\2N/A", table))
    assert len(r.rows) == 62 and all(x.wrong is None for x in r.rows)
    assert r.status == "ok" and r.wrong_total == 0


def _fields(r) -> tuple:
    return (r.rows, r.avg_busbw_printed, r.out_of_bounds, r.ranks, r.tests_version, r.nccl_version, r.config,
            r.network, r.transport_evidence, r.errors, r.status)


def test_runs_are_cut_at_config_and_version_lines_once_rows_are_seen(shared_data) -> None:
    """A config or version line with no rows since the run began belongs to that run; one after rows
    starts the next. A second config line starts a run even with no rows between."""
    one = text(shared_data, "sample_09.txt")  # version line, config line, table, footer
    config = next(line for line in one.splitlines() if "nThread" in line)
    results = parse_all(one + "\n" + one)
    assert [r.tests_version for r in results] == ["2.18.3", "2.18.3"]
    assert [len(r.rows) for r in results] == [56, 56]
    assert [r.status for r in results] == ["ok", "ok"]
    configs_only = parse_all(config + "\n" + config.replace("iters: 20", "iters: 7") + "\n")
    assert [r.config["iters"] for r in configs_only] == ["20", "7"]
    assert all(r.status == "failed" for r in configs_only)


def test_cells_are_read_as_python_reads_them() -> None:
    """Decimal cells of every length and exponent, read exactly as float() reads them."""
    rnd = random.Random(3)
    cells = ["0.00", "-0.00", "1e-30", "123456789012345678901234.5", "0.1", "9007199254740993", "1e22",
             "1e23", "2.2250738585072014e-308", "0.30000000000000004"]
    while len(cells) < 3000:
        x = rnd.uniform(0, 10 ** rnd.randint(0, 14))
        cells.append(f"{x:.{rnd.randint(0, 19)}f}" if rnd.random() < 0.7 else f"{x:.{rnd.randint(0, 19)}e}")
    header = ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
              "     time   algbw   busbw #wrong")
    rows = [f"{8 * (i + 1)} {2 * (i + 1)} float sum -1 {cells[i]} {cells[i - 1]} {cells[i - 2]} "
            "0 1.0 2.0 3.0 0"
            for i in range(len(cells))]
    r = parse("\n".join([header] + rows))
    out_of_place = r.rows[::2]
    assert [(x.time_us, x.algbw, x.busbw) for x in out_of_place] == [
        (float(cells[i]), float(cells[i - 1]), float(cells[i - 2])) for i in range(len(cells))]
    assert [x.size for x in out_of_place] == [8 * (i + 1) for i in range(len(cells))]


def test_a_config_line_after_a_new_table_stays_in_that_tables_run(shared_data) -> None:
    """The header after rows starts a run; the config line that follows belongs to it (a run began since
    the last config), while a config line right after another one starts its own."""
    one = text(shared_data, "sample_09.txt")
    lines = one.splitlines()
    config = next(i for i, line in enumerate(lines) if "nThread" in line)
    header = next(i for i, line in enumerate(lines) if line.lstrip("#").split()[:1] == ["size"])
    table = lines[header:]
    second = "\n".join(table[:2] + [lines[config].replace("iters: 20", "iters: 7")] + table[2:])
    results = parse_all("\n".join(lines[:header] + table[:5]) + "\n" + second)
    assert [r.config.get("iters") for r in results] == ["20", "7"]
    assert [len(r.rows) for r in results] == [2 * (5 - 2), 56]


def test_unicode_digits_that_int_cannot_read_do_not_crash_the_parser(shared_data) -> None:
    """str.isdigit() is true for "²", which int() rejects: such cells are not numbers, not a crash."""
    plain = text(shared_data, "sample_06.txt")
    footer = next(line for line in plain.splitlines() if "Out of bounds values" in line)
    odd = plain.replace(footer, "# Out of bounds values : ² OK")
    row = next(line for line in plain.splitlines() if line.split()[:1] == ["8"])
    odd = odd.replace(row, row.replace("8", "8²", 1))
    r = parse(odd)
    assert r.out_of_bounds is None
    assert len(r.rows) == len(parse(plain).rows) - 2  # the 8² line is dropped, not read


def test_rank_count_from_the_bandwidth_ratio_where_no_device_lines(shared_data) -> None:
    """busbw/algbw = 2(n-1)/n: the rank count the table itself implies, checked against the device list."""
    checked = 0
    for name in COMPLETE:
        full = parse(text(shared_data, name))
        if not full.ranks:
            continue
        checked += 1
        no_devices = "\n".join(line for line in text(shared_data, name).splitlines()
                               if not re.match(r"^(\[\d+,\d+\]<stdout>:)?#+\s*Rank\s", line))
        r = parse(no_devices)
        assert r.ranks is None and r.inferred_ranks() == full.ranks, name
    assert checked >= 3


def test_one_rank_is_not_a_network_measurement(shared_data) -> None:
    one = parse(text(shared_data, "sample_06.txt"))
    assert one.network_measurement and one.inferred_ranks() > 1
    header = next(line for line in text(shared_data, "sample_06.txt").splitlines() if "#wrong" in line)
    single = parse(header + "\n"
                   + "   1048576   262144  float  sum  -1  10.0  104.86  0.00  0  9.9  105.92  0.00  0")
    assert single.inferred_ranks() == 1 and not single.network_measurement


def test_nics_found_are_read_from_nccl_info(shared_data) -> None:
    # "NET/OFI Selected Provider is efa (found 1 nics)" x 2 ranks
    r = parse(text(shared_data, "sample_01.txt"))
    assert r.nics == 1 and r.network == "AWS Libfabric"
    more = text(shared_data, "sample_01.txt").replace("(found 1 nics)", "(found 4 nics)", 1)
    assert parse(more).nics == 4
    assert parse(text(shared_data, "sample_06.txt")).nics is None  # no aws-ofi-nccl there


# Prefixes of log shippers and launchers the parser has no pattern for, each built per line i: containerd's
# CRI log line, fluent-bit's tag, docker compose's service column, journald's, a prefix holding a "#", and one
# that starts with numbers (so a row and a noise line both start with a digit)
UNKNOWN_PREFIXES = ["2026-11-22T16:20:11.{i:09d}Z stdout F ",
                    "[{i}] kube.var.log.containers.nccl-{w}_default: ", "nccl-worker-{w}  | ",
                    "Nov 22 16:20:{s:02d} ip-10-0-0-{w} fsdpbench[{p}]: ", "job#{w} rank{w}> ",
                    "{i} {p} node-{w} | "]
FIXTURES = sorted([f"nccl-tests/{n}" for n in COMPLETE + ["sample_02.txt", "sample_03.txt", "sample_04.txt",
                                                          "sample_10.txt", "sample_14.txt", "sample_15.txt"]]
                  + [f"testdata/{p.name}" for p in (Path(__file__).parent / "testdata").glob("*.txt")])


def _fixture(shared_data, name: str) -> str:
    kind, file = name.split("/")
    return (shared_data / kind / file if kind == "nccl-tests" else Path(__file__).parent / kind / file
            ).read_text()


@pytest.mark.parametrize("name", FIXTURES)
def test_unfamiliar_prefixes_on_every_line_of_every_fixture_change_nothing(shared_data, name: str) -> None:
    """Read through a prefix of any text, anchored on the table's header: every run the clean output gives,
    with the same rows, footer, versions, network and status."""
    clean = _fixture(shared_data, name)
    want = parse_all(clean)
    assert want and all(r.rows for r in want)
    for prefix in UNKNOWN_PREFIXES:
        prefixed = "\n".join(prefix.format(i=i, w=i % 3, s=i % 60, p=1000 + i) + line
                             for i, line in enumerate(clean.splitlines()))
        got = parse_all(prefixed)
        assert len(got) == len(want), (prefix, [len(r.rows) for r in got])
        for a, b in zip(got, want):
            _same(a, b)
            assert (a.tests_version, a.binary, a.collective, a.nics, a.groups, len(a.errors)) == (
                b.tests_version, b.binary, b.collective, b.nics, b.groups, len(b.errors)), prefix


def test_the_versions_nccl_and_its_plugin_print_are_read_from_a_log(shared_data) -> None:
    """NCCL's own line before 2.14 ("NCCL version 2.12.7+cuda11.4", sample_01, under mpirun tags) and its
    INFO line since; aws-ofi-nccl's "Using" (before 1.7, sample_01) and "Initializing" lines. The INFO lines
    are from aws-samples/awsome-distributed-training's FSDP Slurm guide (srun -l, NCCL 2.26.2, aws-ofi-nccl
    1.14.0 on p5); two nodes that differ show as two versions."""
    assert printed_versions(text(shared_data, "sample_01.txt")) == {"nccl": ["2.12.7+cuda11.4"],
                                                                    "aws_ofi_nccl": ["1.5.0aws"]}
    hyperpod = ("1: p5-dy-gpu-2:62571:62571 [1] NCCL INFO NCCL version 2.26.2+cuda12.2\n"
                "1: p5-dy-gpu-2:62574:62574 [4] NCCL INFO cudaDriverVersion 12040\n"
                "2: p5-dy-gpu-3:60823:61204 [2] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0\n"
                "2: p5-dy-gpu-3:60823:61204 [2] NCCL INFO NET/OFI Using Libfabric version 1.22\n")
    assert printed_versions(hyperpod) == {"nccl": ["2.26.2+cuda12.2"], "aws_ofi_nccl": ["1.14.0"]}
    mixed = hyperpod + hyperpod.replace("2.26.2+cuda12.2", "2.27.3+cuda12.8")
    assert printed_versions(mixed)["nccl"] == ["2.26.2+cuda12.2", "2.27.3+cuda12.8"]
    table = text(shared_data, "sample_06.txt")  # no version line of its own
    assert parse(hyperpod + table).nccl_version == "2.26.2+cuda12.2"  # the parser reads the INFO form too
    assert printed_versions("NCCL version\n") == {"nccl": [], "aws_ofi_nccl": []}  # cut short: none
