"""The report's step split on hand-made runs with a known answer: the points of efficiency lost from 1 to 2
nodes, decomposed into parts that add up, in the first screen's sentence, the table and the chart; the
table names each row's configuration and marks where the two readings of waiting part; the chart draws a
panel per configuration whose labels do not collide, and of a study of many configurations the ones the
answer names, linking the rest."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from analysis import step_split
from analysis.load import load
from analysis.plots import split_chart
from analysis.report import pages
from analysis.step_split import charted, measured, split_table
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary
from bench.predict.split import lost_points

# profiled seconds per step of each part (the 2-node trace ran at half speed under the profiler: scaled
# to its measured step of 1.25 s its parts are 0.7 compute, 0.3 reduce-scatter, 0.15 waiting, 0.1 other)
ONE = {"compute": 0.7, "exposed_reduce_scatter": 0.1, "other": 0.2}
TWO = {"compute": 1.4, "exposed_reduce_scatter": 0.6, "waiting": 0.3, "other": 0.2}
PARTS = ("compute", "exposed_all_gather_fwd", "exposed_all_gather_bwd", "exposed_reduce_scatter",
         "exposed_all_reduce", "waiting", "collective_copies", "optimizer", "other")


def _run(sweep: Path, nodes: int, step: float, parts: dict[str, float], slowest: str | None,
         readings: dict[str, float] | None = None, **config: object) -> None:
    spec = RunSpec(model="llama2_7b", gpus_per_node=8, cluster="p5.48xlarge", nodes=nodes, **config)
    d = rundir.run_dir(sweep, spec)
    tokens = 8000.0  # per GPU per step, the same at both node counts (weak scaling)
    split = {**dict.fromkeys(PARTS, 0.0), **parts, "step_s": sum(parts.values()), **(readings or {})}
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
    lost, parts = lost_points(measured(table.loc[1]), measured(table.loc[2]))
    assert lost == pytest.approx(20.0)  # efficiency 1.0 / 1.25 = 80%
    assert parts["exposed_reduce_scatter"] == pytest.approx(16.0)  # (0.3 - 0.1) / 1.25
    assert parts["waiting"] == pytest.approx(12.0) and parts["other"] == pytest.approx(-8.0)
    assert sum(parts.values()) == pytest.approx(lost)
    out = tmp_path / "report"
    shown = pages(load(sweep), out)
    assert any(a.startswith("llama2_7b, FULL_SHARD bf16_mixed at 2 nodes loses 20 points of per-GPU "
                            "efficiency against 1 node (measured), 16 of them exposed reduce-scatter")
               for a in shown["answer"].body)
    assert any("from 1 node to 2 nodes 20 points of per-GPU efficiency lost: 16 exposed reduce-scatter, "
               "12 waiting for node7, -8 other (host, data, idle)" in s for s in shown["points"].body)
    assert "step_split" in shown and (out / "step_split.png").is_file()
    assert (out / "step_split.csv").read_text().count("\n") == 3  # header and two node counts


def test_runs_without_a_trace_leave_no_split(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    _run(sweep, 1, 1.0, ONE, None)
    frame = load(sweep).frame
    frame["trace_split"] = None
    assert split_table(frame).empty


def test_each_row_names_its_configuration_and_says_where_the_readings_of_waiting_part(tmp_path,
                                                                                     monkeypatch) -> None:
    """Two configurations alike but for precision and AC: their rows say which is which. Where the
    arrivals' reading of waiting and the duration rule's are apart by more than 2% of the step, or the
    durations contradict the rule's premise, the row gives both readings and why (on how many collectives,
    what is at stake); where they agree it says so; a run whose ranks shared no clock has the duration
    rule's reading alone. With room for one configuration in the chart, it draws the one the answer names
    and the page links the chart of both."""
    monkeypatch.setattr(step_split, "MAX_CHARTED", 1)
    sweep = tmp_path / "study"
    checked = {"premise_checked": 30, "premise_contradicted": 0, "premise_at_stake_s": 0.0}
    contradicted = {**checked, "premise_contradicted": 12, "premise_at_stake_s": 0.12}
    # TWO's waiting 0.3 of a 2.5 s profiled step, scaled to the measured 1.0 s: 0.12, by durations 0.04
    _run(sweep, 2, 1.0, TWO, None, readings={**contradicted, "waiting_duration_rule": 0.1}, precision="fp32")
    _run(sweep, 1, 1.0, ONE, None, readings={**contradicted, "waiting_duration_rule": 0.0}, precision="fp32")
    _run(sweep, 2, 1.0, TWO, None, readings={**checked, "waiting_duration_rule": 0.29},
         activation_checkpointing="full")
    apart = {"waiting_duration_rule": 0.1, "premise_checked": 0, "premise_contradicted": 0,
             "premise_at_stake_s": 0.0}  # no clock shared: nothing checked
    _run(sweep, 1, 1.0, {**ONE, "waiting": 0.1}, None, readings=apart, activation_checkpointing="full")
    out = tmp_path / "report"
    shown = pages(load(sweep), out)
    table = pd.read_csv(out / "step_split.csv").set_index(["precision", "AC", "nodes"])
    assert {"batch", "GPUs/node"} <= set(table.columns)
    rule = table["duration rule"]
    assert rule[("fp32", "none", 2)] == ("apart by 8.0% of the step; premise contradicted on 12 of 30 "
                                         "collectives (48 ms at stake)")
    assert rule[("fp32", "none", 1)] == ("within 0.0% of the step; premise contradicted on 12 of 30 "
                                         "collectives (120 ms at stake)")
    assert rule[("bf16_mixed", "full", 2)] == "agrees"
    assert rule[("bf16_mixed", "full", 1)] == "not checked: no shared clock (waiting is the duration rule's)"
    assert table.loc[("fp32", "none", 2), "waiting by the duration rule (s)"] == pytest.approx(0.04)
    assert table.loc[("fp32", "none", 2), "waiting for a peer (s)"] == pytest.approx(0.12)
    page = shown["step_split"].body.set_index(["configuration", "nodes x GPUs"])
    assert page.loc[("FULL_SHARD fp32", "2x8"), "waiting (s)"] == pytest.approx(0.12)
    assert page.loc[("FULL_SHARD bf16_mixed + full AC", "1x8"), "waiting (s)"] == pytest.approx(
        table.loc[("bf16_mixed", "full", 1), "waiting for a peer (s)"])
    # the audit is the CSV's, and the page's note names its columns and counts the rows it flags (the two
    # fp32 rows: apart, and the premise contradicted)
    assert not {"waiting by the duration rule (s)", "duration rule", "traced runs"} & set(page.columns)
    assert len(page.columns) + 2 <= 16  # the index's two columns included
    assert shown["step_split"].note.endswith("on 2 of 4 rows.")
    assert shown["step_split"].full.equals(pd.read_csv(out / "step_split.csv").astype(
        shown["step_split"].full.dtypes.to_dict()))  # the HTML keeps every column, collapsed
    assert "[step_split_all.png](step_split_all.png)" in (out / "report.md").read_text()
    assert (out / "step_split_all.png").is_file()


def _overlapping(fig) -> list[tuple[str, str]]:
    """Pairs of the figure's visible texts (tick labels, titles, axis labels, the legend's) whose boxes
    overlap, drawn."""
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes if ax.get_visible() for t in (
        *ax.get_xticklabels(), *ax.get_yticklabels(), ax.title, ax.xaxis.label, ax.yaxis.label)
        if t.get_visible() and t.get_text()] + [fig._suptitle, *fig.legends[0].get_texts()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]


def test_a_study_of_many_configurations_charts_the_named_ones_legibly(tmp_path: Path) -> None:
    """Eight configurations at 1 and 2 nodes, more than a chart draws legibly: the chart draws those the
    answer names, a panel each with its node counts beneath, its title saying where every one is; the
    chart of every configuration has a panel each; no label of either collides with another."""
    sweep = tmp_path / "study"
    configs = [{"precision": p, "activation_checkpointing": ac, "micro_batch": mb}
               for p in ("fp32", "bf16_mixed") for ac in ("none", "full") for mb in (1, 2)]
    for config in configs:
        for nodes in (1, 2):
            _run(sweep, nodes, 1.0 + 0.1 * nodes, TWO, None, **config)
    table = split_table(load(sweep).frame)
    assert len(table) == 16
    named = pd.DataFrame([{"model": "llama2_7b", "configuration": "FULL_SHARD bf16_mixed + full AC"}])
    shown = charted(table, named)  # both micro batches: the label names the configuration, not its batch
    assert len(shown) == 4 and set(zip(shown["precision"], shown["activation_checkpointing"])) == {
        ("bf16_mixed", "full")}
    drawn, every = split_chart(shown), split_chart(table)
    panels = [ax for ax in drawn.axes if ax.get_visible()]
    assert [[t.get_text() for t in ax.get_xticklabels()] for ax in panels] == [["1", "2"], ["1", "2"]]
    assert [ax.get_title() for ax in panels] == ["mb1", "mb2"]  # what tells them apart
    assert "the 2 configurations the answer names of 8, every one in step_split_all.png" in \
        drawn._suptitle.get_text().replace("\n", " ")
    assert len([ax for ax in every.axes if ax.get_visible()]) == 8
    assert _overlapping(drawn) == [] and _overlapping(every) == []


def test_the_split_says_how_far_runs_of_the_same_work_read_apart(tmp_path: Path) -> None:
    """A configuration's repeat and a strong-scaling run of one micro-batch a step do the same work as its
    weak run at 2 nodes: three pairs, each run as the other's prediction. The strong run at 1 node
    accumulates two micro-batches a step: no twin of the weak one."""
    sweep = tmp_path / "study"
    _run(sweep, 1, 1.0, ONE, None)
    _run(sweep, 1, 2.0, ONE, None, global_batch=16)  # 8 ranks, 2 sequences each: 2 micro-batches a step
    _run(sweep, 2, 1.25, TWO, None)  # scaled: 0.7 compute, 0.3 reduce-scatter, 0.15 waiting, 0.1 other
    _run(sweep, 2, 1.25, TWO, None, global_batch=16)  # 16 ranks, one micro-batch each: the same work
    _run(sweep, 2, 1.25, {**TWO, "exposed_reduce_scatter": 0.8, "waiting": 0.1}, None, repeat=1)
    sentence = step_split.noise_sentence(load(sweep).frame)
    # reduce-scatter 0.3 vs 0.4 (twice) and 0.3 vs 0.3: |errors| 0, 0, 0.25, 0.25, 0.33, 0.33; waiting
    # 0.15 vs 0.05 (twice): 0, 0, 0.67, 0.67, 2, 2
    assert sentence == ("Runs of the same work (3 pairs: a configuration's repeats, or a strong-scaling run "
                        "of one micro-batch a step and its weak twin) read apart by a median 0% in compute, "
                        "25% in exposed communication (reduce-scatter 25%), 67% in waiting for a peer, 0% in "
                        "other (host, data, idle), each taken as the other's prediction: a difference "
                        "between rows smaller than that is within the trace's own noise")
    assert pages(load(sweep), tmp_path / "report")["points"].body[-1] == sentence
    _run(tmp_path / "alone", 2, 1.25, TWO, None)
    assert step_split.noise_sentence(load(tmp_path / "alone").frame) is None
