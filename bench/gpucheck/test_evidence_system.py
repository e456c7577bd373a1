"""The GPU check's energy and system-record lines (bench/gpucheck/judge.py) on known figures: a run's
energy per token must be above 0 and within NVML's power limit x its GPUs x its timed window; a GPU run's
system record must hold the GPU's facts and name the run's GPU."""
from __future__ import annotations

import pytest

from bench.core.schema import RunSpec, RunSummary
from bench.gpucheck import judge

H100 = "NVIDIA H100 80GB HBM3"
SPEC = RunSpec(model="llama3_2_1b", seq_len=2048, micro_batch=4)  # 8192 tokens a step on one GPU
NOT_MOVED = "not measured: the counter did not move"
FACTS = {"gpu_model": H100, "gpu_count": 8, "gpu_driver": "550.54.15", "cuda_driver": "12.4",
         "cuda_runtime": "12.8", "nccl": "2.27.5", "gpu_power_limit_w": 700.0}


def _run(energy: float | None, window: float = 2.0, steps: int = 10, **extra) -> RunSummary:
    per_rank = [{"nvml_power_limit_w": 700.0, "nvml_energy_window_s": window}]
    return RunSummary(run_id=SPEC.run_id, sweep="gpucheck_mfu", spec=SPEC, status="ok", device_name=H100,
                      steps_timed=steps, energy_j_per_token=energy,
                      energy_source="NVML energy counter" if energy else NOT_MOVED,
                      extra={"per_rank": per_rank, "system": [{"node": "n0", "facts": FACTS}], **extra})


def test_energy_per_token_within_the_power_limit_over_the_window_passes() -> None:
    # 700 W x 2 s over 10 steps of 8192 tokens: at most 0.0171 J/token
    limit = 700.0 * 2.0 / 81920
    check = judge.check_energy([_run(0.9 * limit)])
    assert check.passed is True and "up to 90% of the power limit" in check.measured


@pytest.mark.parametrize("energy", [0.0, 1.06 * 700.0 * 2.0 / 81920])
def test_no_energy_or_more_than_the_gpu_can_draw_fails(energy: float) -> None:
    check = judge.check_energy([_run(energy or -1.0)])
    assert check.passed is False and check.failures[0].startswith(SPEC.label)


def test_a_window_too_short_for_the_counter_is_not_judged_a_long_one_is() -> None:
    short = judge.check_energy([_run(None, window=0.2)])
    assert short.passed is False and short.failures == ["no GPU run's timed window was long enough to judge"]
    long = judge.check_energy([_run(None, window=3.0), _run(0.01)])
    assert long.passed is False and f"no energy figure ({NOT_MOVED})" in long.failures[0]


def test_the_system_record_must_hold_the_gpus_facts_and_name_its_gpu() -> None:
    assert judge.check_system([_run(0.01)]).passed is True
    lost = _run(0.01, system=[{"node": "n0", "facts": {**FACTS, "gpu_driver": {"missing": "NVML: boom"}}}])
    assert judge.check_system([lost]).failures == [f"{SPEC.label}: missing gpu_driver (NVML: boom)"]
    other = _run(0.01, system=[{"node": "n0", "facts": {**FACTS, "gpu_model": "NVIDIA H200"}}])
    [failure] = judge.check_system([other]).failures
    assert "record names NVIDIA H200, the run NVIDIA H100 80GB HBM3" in failure
    unreadable = _run(0.01, system=[{"node": None, "unreadable": "cut short or garbled: {..."}])
    assert judge.check_system([unreadable]).failures == [f"{SPEC.label}: cut short or garbled: {{..."]
