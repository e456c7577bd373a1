"""The change that wins the points back: for each configuration traced at two node counts or more, where
its largest node count lost the most against its smallest (the measured split, analysis/step_split.py), the
change the performance model predicts wins back the most (bench/predict/split.py best_change: the code
the plan prints its prediction with), and where the study ran that change at both node counts, the gain
it measured beside. The model is the study's own: its probes and its calibration on its finished runs
(bench/predict/calibrate.py), read from the sweep dir, which the report does not write to.

Where the largest loss is a named straggler's (the peers' waiting, and the results table's `straggler`
column names the node), the answer is the node left out: the model predicts no straggler, so the points
are the measured waiting, an upper bound.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from analysis.scaling import CONFIG, configuration_label, node_count
from analysis.step_split import ends, measured, peer
from bench.core import rundir
from bench.core.config import ClusterConfig, ConfigError
from bench.core.load_config import from_dict, upgraded
from bench.core.schema import RunSpec
from bench.launchers import launcher_sections, placement_of
from bench.predict.calibration_file import study_predictor
from bench.predict.perf import Predictor
from bench.predict.split import (
    LABELS,
    Gain,
    Known,
    Options,
    best_change,
    largest,
    lost_points,
    memory_check,
    rounded,
    win_back,
)

NO_CHANGE = ("no change of sharding, micro batch, AC, compile, Float8 or EFA adapters is predicted to win "
             "back a point")


@dataclass(frozen=True)
class Verdict:
    """One configuration's measured loss at its largest node count and the change that wins it back."""

    model: str
    configuration: str  # analysis.scaling.configuration_label
    base_nodes: int
    nodes: int
    lost: float  # measured points of per-GPU efficiency
    part: str  # the part that lost the most
    part_points: int  # its whole points (split.words: they add up to the rounded loss)
    peer: str | None  # the node its ranks waited for, where named
    straggler: str | None  # the results table's straggler at the largest node count
    gain: Gain | None = None  # the model's best change (None: none wins a point, or no model)
    predicted_parts: dict[str, float] | None = None  # the model's points lost by part, unchanged
    measured_gain: float | None = None  # where the study ran the change at both node counts
    modelled: bool = False  # whether the study's model predicted the configuration at all


def study_model(sweep: Path) -> tuple[Predictor, ClusterConfig] | None:
    """The sweep's predictor and its cluster, from its resolved config (sweep.yaml); None where it has
    none or it is not one this version reads."""
    try:
        saved = upgraded(yaml.safe_load((sweep / rundir.SWEEP_CONFIG).read_text()))  # keys since moved too
        cfg = from_dict(saved, launcher_sections())
        placement = placement_of(cfg)
    except (OSError, yaml.YAMLError, ConfigError, AttributeError, TypeError):
        return None
    predictor = study_predictor(cfg.cluster, placement, cfg.axes.model, sweep, write=False)[0]
    return predictor, cfg.cluster


def _spec(row: pd.Series) -> RunSpec | None:
    try:
        return rundir.read_spec(Path(str(row["run_dir"])))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _memory(frame: pd.DataFrame, specs: list[RunSpec],
            limit: float | None) -> Callable[[RunSpec], bool | None]:
    """Whether a changed run fits, judged from the plan's peak of the runs it ran (pred_mem_gib)."""
    known = {}
    for spec in specs:
        row = frame[frame["run_id"] == spec.run_id]
        if len(row) and pd.notna(row["pred_mem_gib"].iloc[0]):
            measured = row["pred_mem_source"].iloc[0] == "measured"
            known[spec.run_id] = Known(spec, float(row["pred_mem_gib"].iloc[0]), True, measured)
    return memory_check(limit, known)


def measured_lost(frame: pd.DataFrame, base: RunSpec, top: RunSpec) -> float | None:
    """Points of per-GPU efficiency a configuration lost from base to top in the study's ok runs (median
    over repeats), where it ran both."""
    steps = []
    for spec in (base, top):
        runs = frame[(frame["run_id"] == spec.run_id) & (frame["status"] == "ok")]
        if runs.empty:
            return None
        steps.append(float(runs["step_time_s"].median()))
    work = (top.micro_batch * top.grad_accum) / (base.micro_batch * base.grad_accum)
    return 100 * (1 - work * steps[0] / steps[1])


def verdict(frame: pd.DataFrame, key: tuple, base: pd.Series, top: pd.Series,
            models: dict[str, tuple[Predictor, ClusterConfig] | None], sweep_of: dict[str, Path]) -> Verdict:
    """A configuration's loss, and what the study's model says wins it back."""
    lost, parts = lost_points(measured(base), measured(top))
    part = largest(parts)
    whole = rounded(parts, round(lost))
    config = dict(zip(CONFIG, key))
    straggler = top["straggler"] if isinstance(top.get("straggler"), str) and top["straggler"] else None
    out = Verdict(str(config["model"]), configuration_label(pd.Series(config)), int(base["nodes"]),
                  int(top["nodes"]), lost, part, whole[part], peer(top), straggler)
    sweep = sweep_of.get(str(config["sweep"]))
    model = models.setdefault(str(config["sweep"]), study_model(sweep) if sweep else None)
    specs = [_spec(base), _spec(top)]
    if model is None or None in specs:
        return out
    predictor, cluster = model
    low, high = specs
    assert low is not None and high is not None
    device = predictor.device(high)
    gpu = device if device is not None and device.family != "cpu" else None
    options = Options(cluster.efa_per_node, gpu,
                      _memory(frame, [low, high], cluster.gpu_memory_gib if gpu else None))
    found = best_change(low, high, predictor.predict, options)
    if found is None:
        return out
    _, predicted_parts, gain = found
    won = None
    if gain is not None and (after := measured_lost(frame, gain.base, gain.top)) is not None:
        before = measured_lost(frame, low, high)
        won = None if before is None else before - after
    return Verdict(**{**out.__dict__, "gain": gain, "predicted_parts": predicted_parts, "measured_gain": won,
                      "modelled": True})


def verdicts(frame: pd.DataFrame, table: pd.DataFrame, sweeps: list[Path]) -> list[Verdict]:
    """Per configuration of the split table traced at two node counts or more, its Verdict."""
    sweep_of = {s.name: s for s in sweeps}
    models: dict[str, tuple[Predictor, ClusterConfig] | None] = {}
    return [verdict(frame, key, base, top, models, sweep_of) for key, base, top in ends(table)]


def loss(v: Verdict) -> str:
    """"llama2_7b, FULL_SHARD bf16_mixed at 16 nodes loses 13 points of per-GPU efficiency against 1 node
    (measured), 9 of them exposed reduce-scatter"."""
    verb = "loses" if round(v.lost) >= 0 else "gains"
    text = (f"{v.model}, {v.configuration} at {node_count(v.nodes)} {verb} {abs(v.lost):.0f} points of "
            f"per-GPU efficiency against {node_count(v.base_nodes)} (measured)")
    if round(v.lost) < 1:
        return text
    what = f"waiting for {v.peer}" if v.part == "waiting" and v.peer else LABELS[v.part]
    return text + f", {v.part_points} of them {what}"


def change(v: Verdict) -> str:
    """What wins the loss back: the model's best change, with the gain the study measured where it ran it;
    a named straggler left out; or that nothing the model knows does."""
    if v.part == "waiting" and v.straggler:
        return (f"leaving {v.straggler} out would win back up to {v.part_points} (its peers' measured "
                "waiting; the model predicts no straggler)")
    if not v.modelled:
        return "no model of this study to predict a change with (its sweep.yaml is missing)"
    if v.gain is None:
        return NO_CHANGE
    assert v.predicted_parts is not None
    return win_back(v.gain, v.predicted_parts, v.measured_gain)


def sentence(v: Verdict) -> str:
    """The first screen's: loss, then change, where it lost a point or more."""
    return loss(v) + (f": {change(v)}" if round(v.lost) >= 1 else "")
