"""The report's step split on hand-made runs with a known answer: the points of efficiency lost from 1 to 2
nodes, decomposed into parts that add up, in the first screen's sentence, the table and the chart."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis.load import load
from analysis.report import build
from analysis.split import lost_points, split_table
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary

# profiled seconds per step of each part (the 2-node trace ran at half speed under the profiler: scaled
# to its measured step of 1.25 s its parts are 0.7 compute, 0.3 reduce-scatter, 0.15 waiting, 0.1 other)
ONE = {"compute": 0.7, "exposed_reduce_scatter": 0.1, "other": 0.2}
TWO = {"compute": 1.4, "exposed_reduce_scatter": 0.6, "waiting": 0.3, "other": 0.2}
PARTS = ("compute", "exposed_all_gather_fwd", "exposed_all_gather_bwd", "exposed_reduce_scatter",
         "exposed_all_reduce", "waiting", "optimizer", "other")


def _run(sweep: Path, nodes: int, step: float, parts: dict[str, float], slowest: str | None) -> None:
    spec = RunSpec(model="llama2_7b", gpus_per_node=8, cluster="p5.48xlarge", nodes=nodes)
    d = rundir.run_dir(sweep, spec)
    tokens = 8000.0  # per GPU per step, the same at both node counts (weak scaling)
    split = {**dict.fromkeys(PARTS, 0.0), **parts, "step_s": sum(parts.values())}
    summary = RunSummary(run_id=spec.run_id, sweep=sweep.name, status="ok", spec=spec, run_dir=str(d),
                         step_time_s=step, tokens_per_s_per_gpu=tokens / step,
                         tokens_per_s=tokens / step * 8 * nodes, tflops_per_gpu=1.0, trace_split=split,
                         pred_exposed_comm_s=0.2, slowest_node=slowest,
                         trace_collectives={"reduce_scatter": {"bytes": 1 << 30, "s": 0.3, "count": 32}})
    rundir.write_spec(d, spec)
    rundir.write_summary(d, summary)


def test_the_points_lost_are_decomposed_into_parts_that_add_up(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    _run(sweep, 1, 1.0, ONE, None)
    _run(sweep, 2, 1.25, TWO, "node7")
    table = split_table(load(sweep).frame).set_index("nodes")
    assert table.loc[2, "exposed_reduce_scatter"] == pytest.approx(0.3)  # scaled to the measured step
    assert table.loc[2, "exposed_comm_s"] == pytest.approx(0.3)
    assert table.loc[2, "exposed_comm_error"] == pytest.approx(0.2 / 0.3 - 1)
    lost, parts = lost_points(table.loc[1], table.loc[2])
    assert lost == pytest.approx(20.0)  # efficiency 1.0 / 1.25 = 80%
    assert parts["exposed_reduce_scatter"] == pytest.approx(16.0)  # (0.3 - 0.1) / 1.25
    assert parts["waiting"] == pytest.approx(12.0) and parts["other"] == pytest.approx(-8.0)
    assert sum(parts.values()) == pytest.approx(lost)
    out = tmp_path / "report"
    build(load(sweep), out)
    md = (out / "report.md").read_text()
    answer = md.split("## The answer", 1)[1].split("##", 1)[0]
    assert ("from 1 node to 2 nodes 20 points of per-GPU efficiency lost: 16 exposed reduce-scatter, "
            "12 waiting for node7, -8 other (host, data, idle)") in answer
    assert "## Where the step went" in md and (out / "step_split.png").is_file()
    assert (out / "step_split.csv").read_text().count("\n") == 3  # header and two node counts


def test_runs_without_a_trace_leave_no_split(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    _run(sweep, 1, 1.0, ONE, None)
    frame = load(sweep).frame
    frame["trace_split"] = None
    assert split_table(frame).empty
