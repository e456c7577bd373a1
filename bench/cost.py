"""What a sweep will cost before it launches: instance-hours, GPU-hours and dollars from the price table.

A run's time is estimated as a fixed start-up (launch, rendezvous, model materialisation, which dominate
short benchmark runs) plus its steps at an assumed MFU against the GPU's dense peak. Both assumptions
are printed with the figure, and the timeout gives a hard upper bound that assumes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

from bench.config import ClusterConfig
from bench.core.flops import hardware_flops_per_token
from bench.core.hardware import peak_tflops
from bench.core.models import get_arch
from bench.core.schema import RunSpec

ASSUMED_MFU = 0.40  # typical FSDP MFU on H100/A100 for 7B-70B Llama (the goal in the trainer issue is 0.45)
STARTUP_S = 120.0
PROBE_S = 60.0  # an all-reduce size sweep after start-up


def estimated_seconds(spec: RunSpec, gpu: str | None, *, mfu: float = ASSUMED_MFU,
                      startup_s: float = STARTUP_S) -> float | None:
    """Wall time of one run; None where no GPU peak is known (CPU clusters)."""
    if spec.kind == "nccl":
        return startup_s + PROBE_S
    peak = peak_tflops(gpu, spec.precision) if gpu else None
    if peak is None:
        return None
    tokens_per_step = spec.world_size * spec.micro_batch * spec.seq_len
    flops_per_step = hardware_flops_per_token(get_arch(spec.model), spec.seq_len, spec.activation_checkpointing) \
        * tokens_per_step
    step_s = flops_per_step / (spec.world_size * peak * 1e12 * mfu)
    return startup_s + spec.steps * step_s


@dataclass(frozen=True)
class PlanCost:
    runs: int
    instance_hours: float | None  # None where a run's time cannot be estimated
    gpu_hours: float | None
    usd: float | None  # None without a price
    usd_at_timeout: float | None  # every run reaching its timeout: the bound that assumes nothing
    price_per_hour: float | None

    def line(self, cluster: str) -> str:
        hours = (f"{self.gpu_hours:,.1f} GPU-hours ({self.instance_hours:,.2f} instance-hours)"
                 if self.gpu_hours is not None else "GPU-hours unknown (no GPU peak for this cluster)")
        if self.price_per_hour is None:
            return f"cost estimate: {hours}; no price_per_hour for {cluster} (set cluster.price_per_hour=USD)"
        usd = f"${self.usd:,.2f}" if self.usd is not None else "$?"
        return (f"cost estimate: {hours}, {usd} at ${self.price_per_hour:g}/h per {cluster} instance "
                f"(assumes {ASSUMED_MFU:.0%} MFU + {STARTUP_S:.0f} s start-up per run); "
                f"at most ${self.usd_at_timeout:,.2f} if every run hit its timeout")


def _usd(instance_s: float | None, price: float | None) -> float | None:
    return None if instance_s is None or price is None else instance_s / 3600 * price


def plan_cost(specs: list[RunSpec], cluster: ClusterConfig, timeout_s: float) -> PlanCost:
    """Cost of launching these runs (infeasible ones excluded by the caller) on this cluster."""
    seconds = [estimated_seconds(s, cluster.gpu) for s in specs]
    known = None not in seconds
    instance_s = sum(s.nodes * t for s, t in zip(specs, seconds)) if known else None  # type: ignore[operator]
    gpu_s = sum(s.world_size * t for s, t in zip(specs, seconds)) if known else None  # type: ignore[operator]
    price = cluster.price_per_hour
    return PlanCost(runs=len(specs), instance_hours=None if instance_s is None else instance_s / 3600,
                    gpu_hours=None if gpu_s is None else gpu_s / 3600, usd=_usd(instance_s, price),
                    usd_at_timeout=_usd(sum(s.nodes for s in specs) * timeout_s, price), price_per_hour=price)
