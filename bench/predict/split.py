"""Where a step goes, by part: one set of names for the model's prediction (perf.Prediction.parts) and the
trace's measurement (trainer/trace.py -> analysis/step_split.py); the points of per-GPU efficiency lost from a
configuration's smallest node count to a larger one in those parts, one formula for the plan and the
report; and the change the model predicts wins the most of a configuration's loss back.

Points lost. Per-GPU efficiency between node counts is (W_n / t_n) / (W_0 / t_0), W the tokens a GPU trains
per step (equal in weak scaling, fewer in strong); so 1 - efficiency, in points, is the sum over parts of
(p_n - (W_n / W_0) p_0) / t_n: the parts of the lost points add up to it exactly.

What the model tells apart: compute (with the contention the overlapped communication costs it), each
kind of exposed communication, the optimizer, on a CPU the waiting of ranks that take turns on the
machine, and `other` (a GPU's host beyond the device's work; a CPU rank's own host work: Python, FSDP2's
hooks and its copies around collectives). FSDP's copies are not a part of their own in the model: the
measured `collective_copies` are compared with its `other` (`comparable`). A GPU's waiting for a peer is a
straggler's, no property of a configuration: not modelled.

The change that wins the points back. For a configuration at its largest node count, each change the
project has an axis for (`changes`: the sharding strategy, HYBRID_SHARD across nodes and reshard after
forward among them; the micro batch doubled or halved; the AC mode; compile; Float8 on a GPU with FP8
units; EFA adapters up to the cluster's) is predicted at that node count and at the smallest, and the one
that wins back the most points of its own scaling loss without training fewer tokens per second per GPU
at that node count is named (`best_change`): a change that wins points by slowing the smallest node
count (activation checkpointing on a run that fits without it) is no answer.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from bench.core.hardware import GpuSpec
from bench.core.models import float8_linear_params
from bench.core.schema import AC_MODES, SHARDINGS, RunSpec
from bench.predict.comm import EXPOSED_PARTS
from bench.predict.memory import MemoryFigure, configuration, state_fits, states_gib
from bench.predict.perf import Prediction

# the trace's parts (trainer/trace.py PARTS), in its order
PARTS = ("compute", *EXPOSED_PARTS, "waiting", "collective_copies", "optimizer", "other")
LABELS = {"compute": "compute", "exposed_all_gather_fwd": "exposed all-gather (forward)",
          "exposed_all_gather_bwd": "exposed all-gather (backward)",
          "exposed_reduce_scatter": "exposed reduce-scatter", "exposed_all_reduce": "exposed all-reduce",
          "waiting": "waiting for a peer", "collective_copies": "FSDP's copies around collectives",
          "optimizer": "optimizer", "other": "other (host, data, idle)"}
SHORT = {"compute": "compute", "exposed_all_gather_fwd": "all-gather fwd",
         "exposed_all_gather_bwd": "all-gather bwd", "exposed_reduce_scatter": "reduce-scatter",
         "exposed_all_reduce": "all-reduce", "waiting": "waiting", "collective_copies": "FSDP copies",
         "optimizer": "optimizer", "other": "other"}
# what the model predicts of a measured split, part by part (FSDP's copies with the host's other work)
MODELLED = ("compute", *EXPOSED_PARTS, "waiting", "optimizer", "other")
T = TypeVar("T")
MIN_POINTS = 1.0  # a change predicted to win back less than a point of efficiency is not named


@dataclass(frozen=True)
class Split:
    """One run's step by part, in seconds per step, and the tokens a GPU trains in it."""

    parts: Mapping[str, float]
    step_s: float
    tokens: float  # per GPU per step


def comparable(measured: Mapping[str, float]) -> dict[str, float]:
    """A measured split in the model's parts: FSDP's copies counted with `other` (MODELLED)."""
    out = {k: float(measured.get(k, 0.0)) for k in MODELLED}
    out["other"] += float(measured.get("collective_copies", 0.0))
    return out


def same_work(spec: RunSpec) -> RunSpec:
    """What a run's step does, its repeat and seed aside and, where a step is one micro-batch, whether a
    global batch made it so: runs of equal keys train the same tokens per rank the same way (a
    configuration's repeats; a strong-scaling run of one micro-batch a step and its weak twin), so their
    traces differ by the measurement's own noise alone."""
    alike = replace(spec, repeat=0, seed=0)
    return replace(alike, global_batch=0, accumulation="sync_each") if spec.grad_accum == 1 else alike


def same_work_pairs(runs: Iterable[tuple[RunSpec, T]]) -> list[tuple[T, T]]:
    """Every pair of runs (each given with its spec) that do the same work (same_work)."""
    alike: dict[RunSpec, list[T]] = {}
    for spec, run in runs:
        alike.setdefault(same_work(spec), []).append(run)
    return [pair for group in alike.values() for pair in itertools.combinations(group, 2)]


def noise(pairs: Iterable[tuple[Mapping[str, float], Mapping[str, float]]]) -> dict[str, list[float]]:
    """Per part, each run of a pair of the same work taken as the other's prediction (a / b - 1, both
    ways, where both measured some): what a model that predicted one run exactly would miss its twin by."""
    out: dict[str, list[float]] = {}
    for a, b in pairs:
        for k in a.keys() & b.keys():
            if a[k] > 0 and b[k] > 0:
                out.setdefault(k, []).extend([a[k] / b[k] - 1, b[k] / a[k] - 1])
    return out


def tokens_per_gpu_step(spec: RunSpec) -> float:
    """What one GPU trains in an optimizer step: its micro-batches' tokens."""
    return float(spec.micro_batch * spec.seq_len * spec.grad_accum)


def predicted(spec: RunSpec, prediction: Prediction) -> Split:
    return Split(prediction.parts, prediction.step_time_s, tokens_per_gpu_step(spec))


def lost_points(base: Split, top: Split) -> tuple[float, dict[str, float]]:
    """1 - efficiency from base to top in points, and per part (module docstring); they add up."""
    work = top.tokens / base.tokens
    keys = [k for k in PARTS if k in base.parts or k in top.parts]
    parts = {k: 100 * (top.parts.get(k, 0.0) - work * base.parts.get(k, 0.0)) / top.step_s for k in keys}
    return 100 * (1 - work * base.step_s / top.step_s), parts


def rounded(points: Mapping[str, float], total: int) -> dict[str, int]:
    """Whole points per part that add up to the rounded total (largest remainders)."""
    floors = {k: int(v // 1) for k, v in points.items()}
    left = total - sum(floors.values())
    order = sorted(points, key=lambda k: points[k] - floors[k], reverse=left > 0)
    for k in order[:abs(left)]:
        floors[k] += 1 if left > 0 else -1
    return floors


def largest(parts: Mapping[str, float]) -> str:
    """The part that lost the most points."""
    return max(parts, key=lambda k: parts[k])


# --- the change that wins the points back -------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    """What a study's cluster allows beyond the spec: the adapters a node has, the GPU (Float8 needs FP8
    units; None: the CPU), and whether a changed run fits the GPU's memory (None: not known)."""

    efa_max: int = 0
    gpu: GpuSpec | None = None
    fits: Callable[[RunSpec], bool | None] = lambda spec: None


@dataclass(frozen=True)
class Change:
    """One change of a configuration, applied to its runs at every node count."""

    name: str  # as a sentence names it: "HYBRID_SHARD", "micro batch 4", "full AC", "compile on"
    apply: Callable[[RunSpec], RunSpec]


def _sharding(to: str) -> Change:
    names = {"SHARD_GRAD_OP": "SHARD_GRAD_OP (no reshard after forward)",
             "FULL_SHARD": "FULL_SHARD (reshard after forward)"}
    return Change(names.get(to, to), lambda s: replace(s, sharding=to))


def _micro_batch(factor: float) -> Change:
    def apply(s: RunSpec) -> RunSpec:
        micro = int(s.micro_batch * factor)
        if micro < 1 or micro * 1.0 != s.micro_batch * factor:
            raise ValueError("no such micro batch")
        return replace(s, micro_batch=micro)
    return Change("micro batch x2" if factor > 1 else "micro batch /2", apply)


def _ac(mode: str) -> Change:
    return Change("no AC" if mode == "none" else f"{mode} AC",
                  lambda s: replace(s, activation_checkpointing=mode))


def changes(spec: RunSpec, options: Options) -> list[Change]:
    """The changes the project has an axis for that differ from the spec (module docstring)."""
    out = [_sharding(s) for s in SHARDINGS if s != spec.sharding and (s != "HYBRID_SHARD" or spec.nodes > 1)]
    out += [_micro_batch(2), _micro_batch(0.5)]
    out += [_ac(ac) for ac in AC_MODES if ac != spec.activation_checkpointing]
    out.append(Change("compile off" if spec.compile else "compile on",
                      lambda s: replace(s, compile=not s.compile)))
    fp8 = options.gpu is not None and "fp8" in options.gpu.peak_tflops
    if fp8 and spec.precision == "bf16_mixed" and float8_linear_params(spec.arch):
        out.append(Change("Float8 (fp8_tensorwise)", lambda s: replace(s, precision="fp8_tensorwise")))
    if spec.nodes > 1 and spec.efa_per_node < options.efa_max:
        out.append(Change(f"{options.efa_max} EFA adapters",
                          lambda s: replace(s, efa_per_node=options.efa_max)))
    return out


@dataclass(frozen=True)
class Gain:
    """A change's predicted effect at the top node count: the points of scaling efficiency it wins back
    (its own loss against the configuration's), its loss by part, and whether it fits memory."""

    change: Change
    base: RunSpec
    top: RunSpec
    points: float  # lost points before less after
    lost: float  # the changed configuration's points lost
    parts: dict[str, float]  # its points lost by part
    speedup: float  # its tokens/s/GPU at the top node count over the configuration's
    fits: bool | None


def gain(change: Change, base: RunSpec, top: RunSpec, lost: float,
         predict: Callable[[RunSpec], Prediction | None], options: Options) -> Gain | None:
    """The change predicted at both node counts; None where it is no run (RunSpec refuses it), the model has
    no prediction of it, or it does not fit the GPU."""
    try:
        changed = change.apply(base), change.apply(top)
    except ValueError:
        return None
    fits = [options.fits(s) for s in changed]
    if False in fits:
        return None
    low, high, now = predict(changed[0]), predict(changed[1]), predict(top)
    if low is None or high is None or now is None:
        return None
    new, parts = lost_points(predicted(changed[0], low), predicted(changed[1], high))
    return Gain(change, *changed, lost - new, new, parts,
                high.tokens_per_s_per_gpu / now.tokens_per_s_per_gpu,
                None if None in fits else True)


def best_change(base: RunSpec, top: RunSpec, predict: Callable[[RunSpec], Prediction | None],
                options: Options) -> tuple[float, dict[str, float], Gain | None] | None:
    """The configuration's predicted loss from base to top (points, by part), and the change predicted to
    win back the most of it without lowering the top node count's tokens/s/GPU (None: none wins a point);
    None where the model predicts neither run."""
    low, high = predict(base), predict(top)
    if low is None or high is None:
        return None
    lost, parts = lost_points(predicted(base, low), predicted(top, high))
    found = [g for c in changes(top, options) if (g := gain(c, base, top, lost, predict, options))]
    useful = [g for g in found if g.points >= MIN_POINTS and g.speedup >= 1.0]
    return lost, parts, max(useful, key=lambda g: g.points, default=None)


@dataclass(frozen=True)
class Known:
    """A planned run's memory as the plan judged it: its peak per GPU (measured, else the state's lower
    bound) and whether it fits."""

    spec: RunSpec
    peak_gib: float
    feasible: bool
    measured: bool = True  # False: the state's lower bound, which says nothing of the activations


def memory_check(limit: float | None, known: Mapping[str, Known]) -> Callable[[RunSpec], bool | None]:
    """Whether a changed run fits the GPU's `limit` (GiB; None: no GPU memory to exceed): the plan's own
    judgement where it planned that run, or one alike in all that memory depends on (memory.configuration:
    EFA adapters are not); where it measured the same run at another micro batch, that peak drawn in a
    line through the state (the plan's own affine estimate, bench/study/plan.py _estimate); False where
    the state alone cannot fit; else None (not known)."""
    def fits(spec: RunSpec) -> bool | None:
        if limit is None:
            return True
        if spec.run_id in known:
            return known[spec.run_id].feasible
        if not state_fits(spec, limit):
            return False
        for k in known.values():
            if configuration(k.spec) == configuration(spec):  # what memory depends on, alike
                return k.feasible
            if k.measured and same_but_micro_batch(k.spec, spec):
                activations = (k.peak_gib - states_gib(k.spec)) * spec.micro_batch / k.spec.micro_batch
                return MemoryFigure(states_gib(spec) + activations, 0.0, "estimate").need_gib(spec) <= limit
        return None
    return fits


def same_but_micro_batch(known: RunSpec, spec: RunSpec) -> bool:
    """Whether `spec` is `known` at another micro batch (one `known`'s ranks cannot divide is not)."""
    try:
        return replace(known, micro_batch=spec.micro_batch) == spec
    except ValueError:
        return False


def words(points: Mapping[str, float], peer: str | None = None) -> list[str]:
    """Whole points per part, largest first, the zero ones left out: "9 exposed reduce-scatter"; waiting
    named after the peer waited for where one is named."""
    whole = rounded(points, round(sum(points.values())))
    named = [(k, v) for k, v in sorted(whole.items(), key=lambda kv: -abs(kv[1])) if v]
    return [f"{v} {f'waiting for {peer}' if k == 'waiting' and peer else LABELS[k]}" for k, v in named]


def win_back(g: Gain, before: Mapping[str, float], measured: float | None = None) -> str:
    """"HYBRID_SHARD is predicted to win back 7 points (its points predicted lost: exposed reduce-scatter
    9 -> 1, exposed all-reduce 0 -> 1; measured: 6)": a change's predicted gain, the two parts it moves
    most (`before`: the configuration's points lost by part, as predicted), and the gain a study measured
    where it ran both."""
    moved = sorted(before, key=lambda k: -abs(before[k] - g.parts.get(k, 0.0)))[:2]
    how = ", ".join(f"{LABELS[k]} {before[k]:.0f} -> {g.parts.get(k, 0.0):.0f}" for k in moved
                    if round(before[k]) != round(g.parts.get(k, 0.0)))
    how = f"its points predicted lost: {how}" if how else ""
    memory = "its memory not measured" if g.fits is None else ""
    ran = "" if measured is None else f"measured: {measured:.0f}"
    unit = "point" if round(g.points) == 1 else "points"
    detail = "; ".join(x for x in (how, memory, ran) if x)
    said = f"{g.change.name} is predicted to win back {g.points:.0f} {unit}"
    return said + (f" ({detail})" if detail else "")
