"""Expand a sweep into frozen RunSpecs: cartesian product of the axes, minus exclusions, plus probes.

Every training run gets a per-GPU memory estimate; runs that cannot fit the cluster's GPUs are planned
as infeasible (recorded, never launched).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from bench.config import AUTO, AXES, ConfigError, SweepConfig
from bench.core.flops import estimate_memory
from bench.core.models import get_arch
from bench.core.schema import RunSpec

FEASIBLE_FRACTION = 0.95  # leave allocator fragmentation headroom
HOST_FRACTION = 0.8  # offload=cpu: host memory also holds the OS, the workers and pinned staging buffers


@dataclass(frozen=True)
class PlannedRun:
    spec: RunSpec
    est_mem_gib: float | None
    feasible: bool
    reason: str | None = None  # why infeasible
    micro_batch_start: int | None = None  # micro_batch auto: where the search starts

    @property
    def first_spec(self) -> RunSpec:
        """What launches first: the spec itself, or an auto run's first micro batch to try."""
        return replace(self.spec, micro_batch=self.micro_batch_start) if self.micro_batch_start else self.spec

    def row(self) -> dict[str, Any]:
        return {"run_id": self.spec.run_id, "label": self.spec.label, **self.spec.to_dict(),
                "est_mem_gib": self.est_mem_gib, "feasible": self.feasible, "reason": self.reason,
                "micro_batch_start": self.micro_batch_start}


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


def _spec(cfg: SweepConfig, point: dict[str, Any], repeat: int, **override: Any) -> RunSpec:
    efa, gpus = point.get("efa_per_node"), point.get("gpus_per_node")
    values = {**point, "micro_batch": 0 if point.get("micro_batch") == AUTO else point.get("micro_batch", 1),
              "efa_per_node": cfg.cluster.efa_per_node if efa is None else efa,
              "gpus_per_node": cfg.cluster.gpus_per_node if gpus is None else gpus, "steps": cfg.steps,
              "warmup_steps": cfg.warmup_steps, "seed": cfg.seed, "cluster": cfg.cluster.name,
              # launcher=dryrun previews the local launcher: its run ids are the ones a launch will use
              "launcher": "local" if cfg.launcher.name == "dryrun" else cfg.launcher.name, "repeat": repeat,
              "nccl_min_bytes": cfg.nccl.min_bytes, "nccl_max_bytes": cfg.nccl.max_bytes,
              "nccl_iters": cfg.nccl.iters, **override}
    try:
        return RunSpec(**values)
    except ValueError as e:
        raise ConfigError(f"run {point}: {e}") from None


def feasibility(cfg: SweepConfig, spec: RunSpec) -> tuple[float, bool, str | None]:
    """Memory estimate per GPU (GiB), whether it fits the cluster's GPUs, and why not."""
    est = estimate_memory(get_arch(spec.model), sharding=spec.sharding, precision=spec.precision,
                          ac=spec.activation_checkpointing, wrap_policy=spec.wrap_policy,
                          nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                          micro_batch=spec.micro_batch, seq_len=spec.seq_len, offload=spec.offload,
                          overhead_gib=0.0 if cfg.cluster.gpu_memory_gib is None else 2.0)
    host, host_limit = est.host * spec.gpus_per_node / 2**30, cfg.cluster.host_memory_gib
    if host_limit is not None and host > HOST_FRACTION * host_limit:
        return est.total_gib, False, (f"offload: estimated {host:.0f} GiB of host memory per node > "
                                      f"{HOST_FRACTION:.0%} of {host_limit:g} GiB")
    limit = cfg.cluster.gpu_memory_gib
    if limit is not None and est.total_gib > FEASIBLE_FRACTION * limit:
        return est.total_gib, False, (f"estimated {est.total_gib:.1f} GiB/GPU > {FEASIBLE_FRACTION:.0%} of "
                                      f"{limit:g} GiB (states {est.states / 2**30:.1f}, activations "
                                      f"{est.activations / 2**30:.1f})")
    return est.total_gib, True, None


def auto_start(cfg: SweepConfig, spec: RunSpec) -> tuple[int, float, bool, str | None]:
    """micro_batch auto: the largest power of two up to micro_batch_search.max whose estimate fits.

    Returns (start, estimate at start, feasible, reason): infeasible when not even 1 fits.
    """
    m = 1 << (cfg.micro_batch_search.max.bit_length() - 1)
    while True:
        est, ok, reason = feasibility(cfg, replace(spec, micro_batch=m))
        if ok or m == 1:
            return m, est, ok, reason
        m //= 2


def _probe_specs(cfg: SweepConfig) -> list[RunSpec]:
    if not cfg.nccl.enabled:
        return []
    nodes = cfg.nccl.nodes or cfg.axes.nodes
    efas = cfg.nccl.efa_per_node or (cfg.cluster.efa_per_node,)
    gpus = cfg.nccl.gpus_per_node or (None,)
    return [_spec(cfg, {"nodes": n, "gpus_per_node": g, "efa_per_node": e}, r, kind="nccl", model="none",
                  steps=1, warmup_steps=0)
            for n in nodes for g in gpus for e in efas for r in range(cfg.repeats)]


def expand(cfg: SweepConfig) -> list[PlannedRun]:
    """The plan: training runs (with estimates) then all-reduce probes; duplicates removed."""
    plan: list[PlannedRun] = []
    seen: set[str] = set()
    for point in _train_points(cfg):
        for repeat in range(cfg.repeats):
            spec = _spec(cfg, point, repeat)
            if spec.run_id in seen:
                continue
            seen.add(spec.run_id)
            if spec.auto_micro_batch:
                start, est, ok, reason = auto_start(cfg, spec)
                plan.append(PlannedRun(spec, est, ok, reason, micro_batch_start=start))
            else:
                est, ok, reason = feasibility(cfg, spec)
                plan.append(PlannedRun(spec, est, ok, reason))
    for spec in _probe_specs(cfg):
        if spec.run_id not in seen:
            seen.add(spec.run_id)
            plan.append(PlannedRun(spec, None, True))
    if not plan:
        raise ConfigError("the sweep plans no runs: check axes and exclude rules")
    return plan
