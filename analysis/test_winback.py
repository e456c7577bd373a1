"""The change that wins the points back, in the report: on a study of hand-made traced runs, each
configuration's measured loss at its largest node count, the change the study's own model predicts wins
the most back (the plan's code, bench/predict/split.py), the gain the study measured where it ran that
change beside it; one such sentence per model on the first screen (analysis/test_step_split.py reads it on the
page); figures on the page never in exponent notation."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.first_screen import change_sentences
from analysis.load import load
from analysis.render import number
from analysis.step_split import split_table
from analysis.winback import sentence, study_model, verdicts
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary
from bench.predict.split import best_change

CONFIG = {"sweep_name": "p5", "launcher": {"name": "slurm"}, "nccl": {"enabled": False},
          "axes": {"model": ["llama2_7b"], "nodes": [1, 16], "micro_batch": [2], "seq_len": [4096]},
          "cluster": {"name": "p5.48xlarge", "instance_type": "p5.48xlarge", "gpu": "H100-SXM",
                      "gpus_per_node": 8, "efa_per_node": 32, "gpu_memory_gib": 80, "max_nodes": 16}}
TOKENS = 8192.0  # per GPU per step: micro batch 2 of 4096


def _run(sweep: Path, nodes: int, efa: int, step: float, scatter: float) -> None:
    """A traced ok run: its step of compute 0.9 s, the rest exposed reduce-scatter."""
    spec = RunSpec(model="llama2_7b", nodes=nodes, gpus_per_node=8, micro_batch=2, seq_len=4096,
                   efa_per_node=efa, cluster="p5.48xlarge", launcher="slurm")
    d = rundir.run_dir(sweep, spec)
    split = {"compute": step - scatter, "exposed_reduce_scatter": scatter, "step_s": step}
    rundir.write_spec(d, spec)
    rundir.write_summary(d, RunSummary(
        run_id=spec.run_id, sweep=sweep.name, status="ok", spec=spec, run_dir=str(d), step_time_s=step,
        tokens_per_s_per_gpu=TOKENS / step, tokens_per_s=TOKENS / step * 8 * nodes, tflops_per_gpu=400.0,
        trace_split={**dict.fromkeys(("exposed_all_gather_fwd", "exposed_all_gather_bwd",
                                      "exposed_all_reduce", "waiting", "collective_copies", "optimizer",
                                      "other"), 0.0), **split},
        pred_mem_gib=40.0, pred_mem_source="measured"))


def _study(tmp_path: Path) -> Path:
    sweep = tmp_path / "p5"
    sweep.mkdir()
    (sweep / rundir.SWEEP_CONFIG).write_text(yaml.safe_dump(CONFIG))
    _run(sweep, 1, 0, 1.0, 0.1)
    _run(sweep, 16, 0, 4.0, 3.1)  # over TCP: 75 points lost, 77.5 of them the reduce-scatter's
    _run(sweep, 1, 32, 1.0, 0.1)
    _run(sweep, 16, 32, 1.25, 0.35)  # on its adapters: 20 points lost
    return sweep


def test_each_configuration_names_the_change_its_model_predicts_and_what_the_study_measured(
        tmp_path: Path) -> None:
    sweep = _study(tmp_path)
    loaded = load(sweep)
    judged = verdicts(loaded.frame, split_table(loaded.frame), loaded.sweeps)
    tcp, efa = sorted(judged, key=lambda v: -v.lost)
    assert tcp.lost == pytest.approx(75.0) and efa.lost == pytest.approx(20.0)
    assert tcp.part == "exposed_reduce_scatter" and tcp.part_points == 75 and tcp.modelled
    predictor, _ = study_model(sweep)
    base, top = (RunSpec(model="llama2_7b", nodes=n, gpus_per_node=8, micro_batch=2, seq_len=4096,
                         efa_per_node=0, cluster="p5.48xlarge", launcher="slurm") for n in (1, 16))
    assert tcp.gain is not None and tcp.gain.change.name == "32 EFA adapters"
    expected = best_change(base, top, predictor.predict, tcp_options())[2]
    assert tcp.gain.points == pytest.approx(expected.points)
    assert tcp.measured_gain == pytest.approx(75.0 - 20.0)  # the study ran it: 1 - 1.0/1.25
    said = sentence(tcp)
    assert said.startswith("llama2_7b, FULL_SHARD bf16_mixed at 16 nodes loses 75 points of per-GPU "
                           "efficiency against 1 node (measured), 75 of them exposed reduce-scatter: 32 EFA "
                           f"adapters is predicted to win back {tcp.gain.points:.0f} points (")
    assert said.endswith("measured: 55)")
    best = pd.DataFrame([{"model": "llama2_7b", "configuration": "FULL_SHARD bf16_mixed"}])
    assert change_sentences(best, judged) == [said]  # one per model: the answer's, the most lost of a label


def test_a_results_dir_moved_elsewhere_is_still_read_with_its_model(tmp_path: Path) -> None:
    """The runs' recorded dirs are where the sweep wrote them; a report of the study moved (or read from
    another working directory) finds each run under the sweep it reads, so its model still judges."""
    moved = tmp_path / "archive" / "p5"
    moved.parent.mkdir()
    _study(tmp_path).rename(moved)
    loaded = load(moved)
    assert all(Path(d).parent == moved / rundir.RUNS_DIR for d in loaded.frame["run_dir"])
    judged = verdicts(loaded.frame, split_table(loaded.frame), loaded.sweeps)
    assert all(v.modelled for v in judged) and any(v.gain is not None for v in judged)


def tcp_options():  # what the report's model allows a changed run: the cluster's 32 adapters, the H100
    from bench.core.hardware import GPUS
    from bench.predict.split import Options
    return Options(32, GPUS["H100-SXM"], lambda spec: True)


def test_a_figure_on_the_page_is_never_in_exponent_notation() -> None:
    assert number(11510.3) == "11,510" and number(2017.04) == "2017" and number(412.93) == "412.9"
    assert number(1.23456) == "1.235" and number(123456.0) == "123,456"
