"""The plan's predicted split (bench/study/answer.py): per configuration and node count the step and its
parts as the model predicts them, the points lost in them, and the change it predicts wins the most back,
the same figures bench/predict/split.py computes (what the report's sentence uses)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.core.load_config import from_dict
from bench.launchers import launcher_sections, placement_of
from bench.predict.calibration_file import study_predictor
from bench.predict.split import Options, best_change, lost_points, rounded
from bench.study.answer import _split, options, predicted_split
from bench.study.plan import expand

# Llama 2 7B FULL_SHARD over TCP on 1 and 16 p5 nodes (32 EFA adapters each), every figure from the
# published constants (no run yet), memory not measured: the lower bound
P5 = {"sweep_name": "p5", "launcher": {"name": "slurm"}, "nccl": {"enabled": False},
      "axes": {"model": ["llama2_7b"], "nodes": [1, 16], "micro_batch": [2], "seq_len": [4096],
               "efa_per_node": [0]},
      "cluster": {"name": "p5", "instance_type": "p5.48xlarge", "gpu": "H100-SXM", "gpus_per_node": 8,
                  "efa_per_node": 32, "gpu_memory_gib": 80, "max_nodes": 16}}


def test_the_plan_prints_each_node_counts_split_and_the_change_predicted_to_win_the_most_back(
        tmp_path: Path) -> None:
    cfg = from_dict(P5, launcher_sections())
    plan = expand(cfg)
    predictor = study_predictor(cfg.cluster, placement_of(cfg), cfg.axes.model, tmp_path)[0]
    text = predicted_split(cfg.cluster, plan, predictor)
    one, sixteen = sorted((p for p in plan if p.spec.kind == "train"), key=lambda p: p.spec.nodes)
    lost, parts = lost_points(_split(one), _split(sixteen))
    scatter = rounded(parts, round(lost))["exposed_reduce_scatter"]
    table = text.split("\n")
    row = next(line for line in table if line.split()[:1] == ["16"])
    assert f"{round(lost)}: {scatter} exposed reduce-scatter" in row
    assert f"{sixteen.perf.step_time_s * 1e3:,.0f}" in row and "e+" not in text  # ms, never an exponent
    _, _, gain = best_change(one.spec, sixteen.spec, predictor.predict,
                             options(cfg.cluster, plan, predictor, sixteen.spec))
    assert gain is not None and gain.change.name == "32 EFA adapters"
    line = next(line for line in table if "is predicted to win back" in line)
    assert line.startswith(f"  at 16 nodes, {lost:.0f} points predicted lost, {scatter} of them "
                           "reduce-scatter: 32 EFA adapters is predicted to win back")
    assert int(re.search(r"win back (\d+) points", line).group(1)) == round(gain.points)
    assert "memory not measured" not in line  # adapters change no memory: the plan's own judgement
    assert gain.points == pytest.approx(lost - best_change(
        gain.base, gain.top, predictor.predict, Options(32, None))[0], abs=1e-9)


def test_the_plan_says_what_bounds_each_collective_and_from_which_node_count_it_shows(tmp_path: Path) -> None:
    """Per node count and part: NCCL's predicted pick and bound for one block's message and the step's
    exposed ms of its ms, all read off each run's prediction; over TCP at 16 nodes the reduce-scatter is
    exposed, and the sentence names the first node count where the step waits for a tenth of it."""
    cfg = from_dict(P5, launcher_sections())
    plan = expand(cfg)
    predictor = study_predictor(cfg.cluster, placement_of(cfg), cfg.axes.model, tmp_path)[0]
    text = predicted_split(cfg.cluster, plan, predictor).split("\n")
    sixteen = max((p for p in plan if p.spec.kind == "train"), key=lambda p: p.spec.nodes)
    rs = next(b for b in sixteen.perf.bounds if b.part == "exposed_reduce_scatter")
    assert rs.bound == "network bandwidth" and rs.exposed_s > 0.1 * rs.total_s
    head = text.index(next(line for line in text if line.startswith("  NCCL's predicted pick")))
    row = next(line for line in text[head:] if line.split()[:1] == ["16"])
    assert f"{rs.algorithm}/{rs.protocol} network bw, {rs.exposed_s * 1e3:,.0f} of {rs.total_s * 1e3:,.0f}" \
        in row
    said = next(line for line in text if "stops" not in line and " is network bandwidth-bound" in line)
    assert "from 16 nodes the reduce-scatter is network bandwidth-bound and exposed" in said
