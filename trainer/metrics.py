"""Steady-state throughput, TFLOPS, MFU and HFU from timed steps (pure functions, no torch)."""
from __future__ import annotations

import statistics
from typing import Any


def summarize_steps(step_times_s: list[float], *, warmup_steps: int, tokens_per_step: int,
                    samples_per_step: int, world_size: int, model_flops_per_token: float,
                    hw_flops_per_token: float, peak_tflops: float | None) -> dict[str, Any]:
    """Metrics over the steps after warm-up; throughput uses the median step time (robust to stalls).

    MFU = model FLOPs per second per GPU / dense peak; HFU counts activation-recompute FLOPs too.
    A CPU (peak None) gets TFLOPS but no MFU.
    """
    window = step_times_s[warmup_steps:]
    if not window:
        raise ValueError("no steps after warm-up to summarise")
    median = statistics.median(window)
    tokens_per_s = tokens_per_step / median
    tflops = model_flops_per_token * tokens_per_s / world_size / 1e12
    hw_tflops = hw_flops_per_token * tokens_per_s / world_size / 1e12
    return {
        "steps_timed": len(window),
        "step_time_s": median,
        "step_time_s_std": statistics.pstdev(window),
        "step_time_s_min": min(window),
        "step_time_s_max": max(window),
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / world_size,
        "samples_per_s": samples_per_step / median,
        "tflops_per_gpu": tflops,
        "hw_tflops_per_gpu": hw_tflops,
        "peak_tflops_per_gpu": peak_tflops,
        "mfu": tflops / peak_tflops if peak_tflops else None,
        "hfu": hw_tflops / peak_tflops if peak_tflops else None,
    }
