"""What a sweep will cost before it launches: instance-hours, GPU-hours and dollars from the price table.

A run's time is a fixed start-up (launch, rendezvous, model materialisation, which dominate short benchmark
runs: the launcher's Placement says how long where it runs them) plus its steps at the step time the
performance model predicts (bench/predict/perf.py). The timeout gives a hard upper bound that assumes
nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bench.core.config import ClusterConfig
from bench.core.schema import RunSpec
from bench.launchers.base import Placement
from bench.predict.perf import Prediction


class Costed(Protocol):
    """A planned run as cost sees it (bench.study.plan.PlannedRun): the plan imports prediction, not the
    reverse."""

    @property
    def first_spec(self) -> RunSpec: ...

    @property
    def perf(self) -> Prediction | None: ...


def estimated_seconds(planned: Costed, placement: Placement) -> float | None:
    """Wall time of one run; None where nothing predicts its steps (GPUs the cluster file does not name)."""
    if planned.first_spec.kind == "nccl":
        return placement.startup_s + placement.probe_s
    if planned.perf is None:
        return None
    return placement.startup_s + planned.first_spec.steps * planned.perf.step_time_s


@dataclass(frozen=True)
class PlanCost:
    runs: int
    instance_hours: float | None  # None where a run's time cannot be estimated
    gpu_hours: float | None
    usd: float | None  # None without a price
    usd_at_timeout: float | None  # every run reaching its timeout: the bound that assumes nothing
    price_per_hour: float | None
    overhead_s: float  # per run, beyond its steps

    def line(self, cluster: str) -> str:
        hours = (f"{self.gpu_hours:,.1f} GPU-hours ({self.instance_hours:,.2f} instance-hours)"
                 if self.gpu_hours is not None else "GPU-hours unknown (no GPU peak for this cluster)")
        if self.price_per_hour is None:
            return f"cost estimate: {hours}; no price_per_hour for {cluster} (set cluster.price_per_hour=USD)"
        usd = f"${self.usd:,.2f}" if self.usd is not None else "$?"
        return (f"cost estimate: {hours}, {usd} at ${self.price_per_hour:g}/h per {cluster} instance "
                f"(predicted step times + {self.overhead_s:.0f} s start-up per run); "
                f"at most ${self.usd_at_timeout:,.2f} if every run hit its timeout")


def _usd(instance_s: float | None, price: float | None) -> float | None:
    return None if instance_s is None or price is None else instance_s / 3600 * price


def plan_cost(planned: list[Costed], cluster: ClusterConfig, timeout_s: float,
              placement: Placement) -> PlanCost:
    """Cost of launching these runs (infeasible ones excluded by the caller) on this cluster, as its launcher
    places them; GPU-hours only for a cluster that names its GPU."""
    specs = [p.first_spec for p in planned]
    seconds = [estimated_seconds(p, placement) for p in planned]
    known = None not in seconds and cluster.gpu is not None
    instance_s = sum(s.nodes * t for s, t in zip(specs, seconds)) if known else None  # type: ignore[operator]
    gpu_s = sum(s.world_size * t for s, t in zip(specs, seconds)) if known else None  # type: ignore[operator]
    price = cluster.price_per_hour
    return PlanCost(runs=len(specs), instance_hours=None if instance_s is None else instance_s / 3600,
                    gpu_hours=None if gpu_s is None else gpu_s / 3600, usd=_usd(instance_s, price),
                    usd_at_timeout=_usd(sum(s.nodes for s in specs) * timeout_s, price), price_per_hour=price,
                    overhead_s=placement.startup_s)
