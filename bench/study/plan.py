"""Expand a sweep into frozen RunSpecs: cartesian product of the axes, minus exclusions, plus probes.

Every training run gets a per-GPU memory figure (bench/predict/memory.py: measured on fake tensors where the
sweep measures, else the exact lower bound of its state); runs that cannot fit the cluster's GPUs are planned
as infeasible (recorded, never launched).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Protocol

from bench.core.config import AUTO, AXES, ConfigError, SweepConfig
from bench.core.models import float8_linear_params, model_source
from bench.core.schema import COLLECTIVES, RunSpec
from bench.launchers import placement_of
from bench.launchers.base import Placement
from bench.predict import census
from bench.predict.budget import Point
from bench.predict.comm import unit_messages
from bench.predict.memory import MemoryFigure, lower_bound, state_fits, states_gib
from bench.predict.perf import Prediction, Predictor

HOST_FRACTION = 0.8  # offload=cpu: host memory also holds the OS, the workers and pinned staging buffers


class MemorySource(Protocol):
    """Where the plan's memory figures come from (bench.predict.memory.MemoryPlanner measures them)."""

    def prefetch(self, specs: list[RunSpec]) -> None: ...

    def figure(self, spec: RunSpec) -> MemoryFigure: ...


@dataclass(frozen=True)
class PlannedRun:
    spec: RunSpec
    memory: MemoryFigure | None  # training runs: for the first micro batch that launches
    feasible: bool
    reason: str | None = None  # why infeasible
    micro_batch_start: int | None = None  # micro_batch auto: where the search starts
    perf: Prediction | None = None  # bench/predict/perf.py: step time, tokens/s/GPU, MFU (of first_spec)
    pred_efficiency: float | None = None  # against the smallest feasible planned node count of its config
    pred_base: float | None = None  # that node count's tokens/s/GPU in the same prediction

    @property
    def first_spec(self) -> RunSpec:
        """What launches first: the spec itself, or an auto run's first micro batch to try."""
        return replace(self.spec, micro_batch=self.micro_batch_start) if self.micro_batch_start else self.spec

    def predicted(self) -> dict[str, Any]:
        """What the plan said before the run: the results table's pred_ columns."""
        m, perf = self.memory, self.perf
        out: dict[str, Any] = {}
        if m:
            out |= {"pred_mem_gib": m.gpu_gib, "pred_mem_source": m.source}
        if perf:
            out |= {**perf.fields(), "pred_scaling_efficiency": self.pred_efficiency,
                    "pred_base_tokens_per_s_per_gpu": self.pred_base}
        return out

    def row(self) -> dict[str, Any]:
        m = self.memory
        return {"run_id": self.spec.run_id, "label": self.spec.label, **self.spec.to_dict(),
                **self.predicted(), "pred_host_gib": m.host_gib if m else None,
                "need_mem_gib": m.need_gib(self.first_spec) if m else None, "mem_note": m.note if m else None,
                "feasible": self.feasible, "reason": self.reason, "micro_batch_start": self.micro_batch_start}


def _matches(point: dict[str, Any], rule: dict[str, Any]) -> bool:
    for key, want in rule.items():
        options = want if isinstance(want, (list, tuple)) else [want]
        if point.get(key) not in options:
            return False
    return True


def _train_points(cfg: SweepConfig) -> list[dict[str, Any]]:
    if not cfg.axes.model:
        return []
    points = [dict(zip(AXES, combo)) for combo in itertools.product(*(getattr(cfg.axes, a) for a in AXES))]
    return [p for p in points if not any(_matches(p, rule) for rule in cfg.exclude)]


def _spec(cfg: SweepConfig, point: dict[str, Any], repeat: int, launcher: str, **override: Any) -> RunSpec:
    efa, gpus = point.get("efa_per_node"), point.get("gpus_per_node")
    model, config = model_source(point["model"]) if "model" in point else ("none", "")
    census.ensure(model, config, cfg.memory.cache_dir)  # a family with no formula: counted from the model
    values = {**point, "model": model, "model_config": config,
              "micro_batch": 0 if point.get("micro_batch") == AUTO else point.get("micro_batch", 1),
              "global_batch": point.get("global_batch") or 0,
              "efa_per_node": cfg.cluster.efa_per_node if efa is None else efa,
              "gpus_per_node": cfg.cluster.gpus_per_node if gpus is None else gpus, "steps": cfg.steps,
              "warmup_steps": cfg.warmup_steps, "seed": cfg.seed, "cluster": cfg.cluster.name,
              "launcher": launcher, "repeat": repeat,
              "nccl_min_bytes": cfg.nccl.min_bytes, "nccl_max_bytes": cfg.nccl.max_bytes,
              "nccl_iters": cfg.nccl.iters, **override}
    try:
        spec = RunSpec(**values)
    except ValueError as e:
        raise ConfigError(f"run {point}: {e}") from None
    if spec.kind == "train" and spec.seq_len > spec.arch.max_seq_len:  # the worker would refuse it
        raise ConfigError(f"axes.seq_len: {spec.seq_len} exceeds model {point['model']!r}'s "
                          f"max_position_embeddings={spec.arch.max_seq_len}")
    if spec.kind == "train" and spec.precision == "fp8_tensorwise" and not float8_linear_params(spec.arch):
        raise ConfigError(f"axes.precision: fp8_tensorwise converts no linear of model {point['model']!r} "
                          "(none in its blocks is an nn.Linear with dimensions that are multiples of 16)")
    return spec


def feasibility(cfg: SweepConfig, spec: RunSpec, memory: MemorySource | None = None
                ) -> tuple[MemoryFigure, bool, str | None]:
    """The run's memory figure, whether it fits the cluster's GPUs (and host, under offload), and why not."""
    figure = memory.figure(spec) if memory else lower_bound(spec, "not measured")
    host, host_limit = figure.host_gib * spec.gpus_per_node, cfg.cluster.host_memory_gib
    if host_limit is not None and host > HOST_FRACTION * host_limit:
        return figure, False, (f"offload: {figure.source} {host:.0f} GiB of host memory per node > "
                               f"{HOST_FRACTION:.0%} of {host_limit:g} GiB")
    limit, need = cfg.cluster.gpu_memory_gib, figure.need_gib(spec)
    if limit is not None and need > limit:
        measured = f"{figure.source} {figure.gpu_gib:.1f} GiB"
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(figure.categories.items(), key=lambda kv: -kv[1]))
        detail = f": {parts}" if parts else ""
        note = f"; {figure.note}" if figure.note else ""
        return figure, False, f"needs {need:.1f} GiB/GPU > {limit:g} ({measured}{detail}; + headroom){note}"
    return figure, True, None


def micro_batch_sizes(spec: RunSpec, largest: int) -> list[int]:
    """The micro batches micro_batch auto may try, ascending: powers of two up to `largest`; with a global
    batch, the sizes up to `largest` that divide each rank's share of it (micro batch x accumulation steps
    x ranks = the global batch, exactly)."""
    if spec.per_rank:
        return [m for m in range(1, min(largest, spec.per_rank) + 1) if spec.per_rank % m == 0]
    return [1 << e for e in range(largest.bit_length())]


def _estimate(spec: RunSpec, sizes: list[int], limit: float | None, points: dict[int, float]) -> int:
    """The index of the largest size predicted to fit the GPU: the peak is affine in the micro batch
    (activations grow with it, the states do not), drawn through the two points nearest the limit (the
    largest that fits and the smallest that does not, where there are both: a bracket that closes on any
    monotone shape), or through the one point and the states' exact lower bound."""
    if limit is None:
        return len(sizes) - 1
    fit = sorted((m, g) for m, g in points.items()
                 if MemoryFigure(g, 0.0, "estimate").need_gib(spec) <= limit)
    over = sorted((m, g) for m, g in points.items() if (m, g) not in fit)
    # the two points nearest the limit
    (m0, g0), *rest = fit[-1:] + over[:1] if fit and over else fit[-2:] or over[:2]
    m1, g1 = rest[-1] if rest else (0, states_gib(spec))
    slope = (g1 - g0) / (m1 - m0) if m1 != m0 else 0.0
    fits = [i for i, m in enumerate(sizes)
            if MemoryFigure(g0 + slope * (m - m0), 0.0, "estimate").need_gib(spec) <= limit]
    return max(fits, default=-1)


def _group(spec: RunSpec) -> tuple[Any, ...]:
    """Specs that differ only in their node count (and micro batch): their peaks less their states are one
    curve of the micro batch, a rank's activations and buffers not depending on how many ranks share the
    states (measured on p5_strong: the same to the MiB at 1 to 16 nodes)."""
    return tuple(v for k, v in spec.to_dict().items() if k not in ("nodes", "micro_batch"))


def auto_starts(cfg: SweepConfig, specs: list[RunSpec], memory: MemorySource | None = None,
                with_first: list[RunSpec] | None = None
                ) -> dict[str, tuple[int, MemoryFigure, bool, str | None]]:
    """micro_batch auto: for each spec, the largest of its micro_batch_sizes (up to micro_batch_search.max)
    that fits. The first round measures, of each group of specs that differ only in nodes (`_group`), the
    one with the most sizes: its middle size and its largest. Each later round measures per spec the size
    the measured points predict to be the largest that fits and the next one up (`_estimate`): its own
    points where it has some, else its group's, moved by the difference in states (`states_gib`). An
    affine peak, as it is, is settled in two rounds; any other answer narrows the bracket and the next
    round predicts again within it. The specs search in lockstep, each round's candidates measured
    together (in parallel): a round costs its measurements divided among the workers.

    Returns, by run id, (start, its figure, feasible, reason): infeasible when not even 1 fits. `with_first`:
    other specs measured in the first round's batch (the plan's fixed micro batches).
    """
    limit = cfg.cluster.gpu_memory_gib
    sizes = {s.run_id: micro_batch_sizes(s, cfg.micro_batch_search.max) for s in specs}
    # per spec: low = the largest index known to fit (-1: none yet), high = the largest not known to fail
    bracket = {s.run_id: (-1, len(sizes[s.run_id]) - 1) for s in specs}
    seen: dict[str, dict[int, tuple[MemoryFigure, bool, str | None]]] = {s.run_id: {} for s in specs}
    by_id = {s.run_id: s for s in specs}
    group = {s.run_id: _group(s) for s in specs}
    members: dict[tuple[Any, ...], list[str]] = {}
    for run_id, g in group.items():
        members.setdefault(g, []).append(run_id)
    # per group, the spec the first round measures: one that is measured at all, with the most sizes
    first = {g: min(ids, key=lambda r: (not state_fits(by_id[r], limit), -len(sizes[r])))
             for g, ids in members.items()}

    def points(run_id: str) -> dict[int, float]:
        """GiB by micro batch: the spec's measured figures, and its group's moved to its states."""
        spec, at = by_id[run_id], {}
        for other in (r for r in members[group[run_id]] if r != run_id):
            for i, (figure, _, _) in seen[other].items():
                if figure.source != "measured":
                    continue  # a lower bound says nothing of the activations
                m = sizes[other][i]
                moved = states_gib(spec, accumulating=(spec.per_rank or 0) > m)
                at[m] = figure.gpu_gib - states_gib(replace(by_id[other], micro_batch=m)) + moved
        return at | {sizes[run_id][i]: figure.gpu_gib for i, (figure, _, _) in seen[run_id].items()}

    def candidates(run_id: str) -> list[int]:
        low, high = bracket[run_id]
        known = points(run_id)
        if not known:  # two points draw a line: the middle size, and the largest (which may fit)
            waits = run_id != first[group[run_id]] and not seen[first[group[run_id]]]
            return [] if waits else sorted({high // 2, high})  # others wait for their group's first
        guess = min(max(_estimate(by_id[run_id], sizes[run_id], limit, known), low), high)
        return [i for i in (guess, guess + 1) if low < i <= high] or [low + 1]

    while pending := [r for r, (low, high) in bracket.items() if low < high]:
        tries = [(r, i, replace(by_id[r], micro_batch=sizes[r][i])) for r in pending for i in candidates(r)]
        if memory:
            memory.prefetch([spec for _, _, spec in tries] + (with_first or []))
            with_first = None
        for run_id, index, spec in tries:
            _, ok, _ = seen[run_id][index] = feasibility(cfg, spec, memory)
            low, high = bracket[run_id]
            bracket[run_id] = (max(low, index), high) if ok else (low, min(high, index - 1))
    out = {}
    for run_id, (low, _) in bracket.items():
        index = max(low, 0)
        figure, ok, reason = seen[run_id].get(index) or feasibility(
            cfg, replace(by_id[run_id], micro_batch=sizes[run_id][index]), memory)
        out[run_id] = (sizes[run_id][index], figure, ok, reason)
    return out


def study_sizes(train: list[RunSpec]) -> dict[str, str]:
    """Per collective, the message sizes the study's training runs send (one FSDP unit's, comm.unit_messages),
    as RunSpec.nccl_sizes: what its all-gather and reduce-scatter probes measure beside their sweep. The
    all-reduce probe keeps its doubling sweep alone (its run ids predate the other collectives)."""
    sizes: dict[str, set[int]] = {}
    for spec in train:
        for kind, size in unit_messages(spec, spec.arch).items():
            sizes.setdefault(kind, set()).add(size)
    return {kind: ",".join(map(str, sorted(values))) for kind, values in sizes.items()}


def _probe_specs(cfg: SweepConfig, train: list[RunSpec], launcher: str) -> list[RunSpec]:
    """One probe per collective, node count, GPUs per node, EFA count and repeat; all-reduce first."""
    if not cfg.nccl.enabled:
        return []
    nodes = cfg.nccl.nodes or cfg.axes.nodes
    efas = cfg.nccl.efa_per_node or (cfg.cluster.efa_per_node,)
    gpus = cfg.nccl.gpus_per_node or (None,)
    collectives = sorted(cfg.nccl.collectives, key=COLLECTIVES.index)
    own = study_sizes(train)
    return [_spec(cfg, {"nodes": n, "gpus_per_node": g, "efa_per_node": e}, r, launcher, kind="nccl",
                  model="none", steps=1, warmup_steps=0, collective=c, nccl_sizes=own.get(c, ""))
            for c in collectives for n in nodes for g in gpus for e in efas for r in range(cfg.repeats)]


def expand(cfg: SweepConfig, memory: MemorySource | None = None, predictor: Predictor | None = None,
           placement: Placement | None = None) -> list[PlannedRun]:
    """The plan: training runs (each with its memory figure and performance prediction) then all-reduce
    probes; duplicates removed. Without a memory source every figure is the lower bound (instant);
    with one, every distinct configuration is measured (in parallel, cached) before the runs are judged.
    Predictions use the cluster's published network figures unless the predictor holds the study's probes.
    Where the runs run is the placement's (by default the one launcher.name's launcher answers)."""
    placement = placement or placement_of(cfg)
    specs: list[RunSpec] = []
    seen: set[str] = set()
    for point in _train_points(cfg):
        for repeat in range(cfg.repeats):
            spec = _spec(cfg, point, repeat, placement.run_launcher)
            if spec.run_id not in seen:
                seen.add(spec.run_id)
                specs.append(spec)
    auto = [s for s in specs if s.auto_micro_batch]
    fixed = [s for s in specs if not s.auto_micro_batch]
    if memory and not auto:
        memory.prefetch(fixed)
    starts = auto_starts(cfg, auto, memory, with_first=fixed)  # one batch of workers measures both
    plan: list[PlannedRun] = []
    for spec in specs:
        if spec.auto_micro_batch:
            start, figure, ok, reason = starts[spec.run_id]
            plan.append(PlannedRun(spec, figure, ok, reason, micro_batch_start=start))
        else:
            figure, ok, reason = feasibility(cfg, spec, memory)
            plan.append(PlannedRun(spec, figure, ok, reason))
    plan = with_predictions(plan, predictor or Predictor(cfg.cluster, placement))
    for spec in _probe_specs(cfg, specs, placement.run_launcher):
        if spec.run_id not in seen:
            seen.add(spec.run_id)
            plan.append(PlannedRun(spec, None, True))
    if not plan:
        raise ConfigError("the sweep plans no runs: check axes and exclude rules")
    return plan


def _config(spec: RunSpec) -> tuple[Any, ...]:
    """What scaling efficiency compares across node counts (analysis/scaling.py's CONFIG): at one global
    batch, the micro batch is each node count's own choice."""
    varies = ("nodes", "repeat", "steps", "warmup_steps") + (("micro_batch",) if spec.global_batch else ())
    return tuple(v for k, v in spec.to_dict().items() if k not in varies)


def with_predictions(plan: list[PlannedRun], predictor: Predictor) -> list[PlannedRun]:
    """Each feasible run's predicted step, and its efficiency against the smallest feasible planned node
    count of the same configuration (infeasible runs are never measured, so never a base)."""
    perf = {p.spec.run_id: predictor.predict(p.first_spec) for p in plan}
    base: dict[tuple[Any, ...], tuple[int, float]] = {}
    for p in plan:
        if p.feasible and (pred := perf[p.spec.run_id]):
            key = _config(p.first_spec)
            if key not in base or p.spec.nodes < base[key][0]:
                base[key] = (p.spec.nodes, pred.tokens_per_s_per_gpu)
    out = []
    for p in plan:
        pred = perf[p.spec.run_id]
        anchor = base.get(_config(p.first_spec)) if pred else None
        if pred and anchor and pred.tokens_per_s_per_gpu > anchor[1]:
            pred = at_most(pred, anchor[1])
        efficiency = pred.tokens_per_s_per_gpu / anchor[1] if pred and anchor else None
        out.append(replace(p, perf=pred, pred_efficiency=efficiency,
                           pred_base=anchor[1] if pred and anchor else None))
    return out


def at_most(pred: Prediction, tokens_per_s_per_gpu: float) -> Prediction:
    """A prediction held to linear scaling: more nodes never make a GPU faster than at the base node count
    (the model's per-GPU optimizer work shrinks with the shard, which real steps do not show as a speed-up
    beyond the noise; no published FSDP row scales above 100%)."""
    factor = pred.tokens_per_s_per_gpu / tokens_per_s_per_gpu
    return replace(pred, tokens_per_s_per_gpu=tokens_per_s_per_gpu, step_time_s=pred.step_time_s * factor,
                   mfu=pred.mfu / factor if pred.mfu is not None else None)


def tokens_per_step(spec: RunSpec) -> int:
    """What one optimizer step trains, in tokens: the global batch, else (weak scaling) a micro batch per
    rank."""
    return (spec.global_batch or spec.micro_batch * spec.world_size) * spec.seq_len


def answer_points(plan: list[PlannedRun]) -> list[tuple[RunSpec, list[Point]]]:
    """Per training configuration (`_config`; a weak-scaling auto micro batch is one configuration), one
    point per node count: the predicted step of what launches first, or why there is none."""
    groups: dict[tuple[Any, ...], tuple[RunSpec, dict[int, Point]]] = {}
    for p in plan:
        if p.spec.kind != "train":
            continue
        spec, points = groups.setdefault(_config(p.spec), (p.spec, {}))
        if p.spec.nodes in points:  # a repeat: the same prediction
            continue
        step = p.perf.step_time_s if p.perf and p.feasible else None
        floor = "; a floor" if p.perf and p.perf.unmodeled else ""  # perf.unmodeled: days at least these
        source = f"predicted ({p.perf.source}{floor})" if step is not None and p.perf else (
            "infeasible" if not p.feasible else "no prediction")
        spread = p.perf.spread if p.perf and step is not None else None
        points[p.spec.nodes] = Point(p.spec.nodes, tokens_per_step(p.first_spec), step, source, spread)
    return [(spec, sorted(points.values(), key=lambda q: q.nodes)) for spec, points in groups.values()]
