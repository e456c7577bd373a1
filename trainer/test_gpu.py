"""The worker on a real CUDA GPU: device mapping, NCCL on one rank, memory predicted vs measured, Float8,
NVML, the node's system record and the energy per token. `python -m pytest -m gpu` on a machine with one;
skipped, with the reason, everywhere else."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from bench.core.hardware import gpu_spec
from bench.core.models import get_arch
from bench.core.records import parse_records
from bench.core.schema import RunSpec
from bench.predict.memory import CUBLAS_WORKSPACE_GIB
from conftest import ROOT, run_torchrun
from trainer.test_axes import _expected_float8_linears

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="no CUDA device (these run with pytest -m gpu)")]
SPEC = RunSpec(model="small_llama", micro_batch=4, seq_len=512, steps=6, warmup_steps=2)


def _train(spec: RunSpec, env: dict[str, str] | None = None):
    run = run_torchrun(["trainer", *spec.to_argv()], nproc=1, timeout=600, env=env)
    assert run.returncode == 0, run.output[-3000:]
    return run


def test_a_rank_trains_on_the_gpu_it_was_given_with_nccl() -> None:
    """The local launcher gives each simulated node its own devices through CUDA_VISIBLE_DEVICES: the
    worker's cuda:0 must then be that GPU (the last one here, so a wrong mapping shows on a multi-GPU box)."""
    last = str(torch.cuda.device_count() - 1)
    run = _train(RunSpec(model="tiny_llama", micro_batch=2, seq_len=128, steps=4, warmup_steps=1),
                 env={"CUDA_VISIBLE_DEVICES": last})
    meta, summary = run.of_kind("meta")[0], run.summary
    assert meta["device"] == "cuda:0" and meta["cuda_visible_devices"] == last
    assert meta["backend"] == summary["backend"] == "nccl"
    assert summary["status"] == "ok" and summary["device_name"] == torch.cuda.get_device_name(int(last))
    assert 0 < summary["mem_peak_alloc_gib"] <= summary["mem_peak_reserved_gib"]
    if gpu_spec(summary["device_name"]):
        assert 0 < summary["mfu"] < 1


def test_the_fake_tensor_peak_matches_the_device_peak() -> None:
    """What the planner measures on fake tensors (trainer.memory) against torch.cuda.max_memory_allocated
    of the same configuration's steady steps, within the 5% bench.gpucheck holds the plan to."""
    fake = subprocess.run([sys.executable, "-m", "trainer.memory", "--cuda"], cwd=ROOT, capture_output=True,
                          text=True, input=json.dumps(SPEC.to_dict()) + "\n", timeout=600,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    record = next(r for r in parse_records(fake.stdout.splitlines()) if r["kind"] == "memory")
    predicted = record["peak_gib"] + CUBLAS_WORKSPACE_GIB  # what the planner's figure holds on a GPU
    measured = _train(SPEC).summary["mem_peak_alloc_gib"]
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


def test_float8_converts_the_block_linears_on_cuda() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip(f"{torch.cuda.get_device_name()} has no FP8 tensor cores (needs sm_89 or later)")
    run = _train(RunSpec(model="small_llama", precision="fp8_tensorwise", micro_batch=4, seq_len=512, steps=4,
                         warmup_steps=1))
    meta = run.of_kind("meta")[0]
    assert meta["float8_linears"] == _expected_float8_linears(get_arch("small_llama")) == 7 * 8
    assert run.summary["status"] == "ok" and run.summary["backend"] == "nccl"


def test_nvml_reads_the_gpu_within_its_limits() -> None:
    from trainer.nvml import NvmlSampler
    sampler = NvmlSampler(0, 0.05, lambda s: None)
    assert sampler.available, sampler.reason
    x = torch.randn(8192, 8192, device="cuda")
    sampler.start()
    for _ in range(50):
        x = x @ x / 8192
    torch.cuda.synchronize()
    agg = sampler.stop()
    assert 0 < agg["nvml_power_w"] <= agg["nvml_power_limit_w"] * 1.05  # a mean can brush the cap
    assert 0 < agg["nvml_mem_used_gib"] <= agg["nvml_mem_total_gib"]
    assert 0 <= agg["nvml_util_pct"] <= 100


def test_the_system_record_and_the_energy_per_token_of_a_gpu_run() -> None:
    """The node's system record read through the sampler's NVML path (bench/core/system.py open_gpu): the
    GPU the run names, its driver, torch's CUDA and NCCL, the power limit the sampler reads; and the energy
    over the timed steps from NVML's counter: > 0 and within the power limit x the timed window
    (bench.gpucheck check_energy). 60 steps, for a timed window of a second or more, which the counter
    resolves (one-GPU tiny_llama steps took 35-50 ms on the H100 and H200 of benchmarks/evidence/)."""
    spec = RunSpec(model="small_llama", micro_batch=4, seq_len=512, steps=60, warmup_steps=2)
    run = _train(spec)
    (record,) = run.of_kind("system")
    facts, summary = record["facts"], run.summary
    rank = summary["per_rank"][0]
    assert facts["gpu_model"] == summary["device_name"] == torch.cuda.get_device_name(0)
    assert facts["nccl"] == ".".join(map(str, torch.cuda.nccl.version()))
    assert facts["cuda_runtime"] == torch.version.cuda and re.match(r"^\d+\.\d+$", facts["cuda_driver"])
    assert re.match(r"^\d+\.\d+", facts["gpu_driver"]) and facts["gpu_count"] >= 1
    assert facts["gpu_power_limit_w"] == rank["nvml_power_limit_w"]
    assert isinstance(facts["gpu_topology"], str) or "nvidia-smi" in facts["gpu_topology"]["missing"]
    tokens = spec.sequences_per_step * spec.seq_len * summary["steps_timed"]
    assert summary["energy_source"] == "NVML energy counter", summary["energy_source"]
    assert rank["nvml_energy_window_s"] >= 1.0, rank
    allowed = rank["nvml_power_limit_w"] * rank["nvml_energy_window_s"] / tokens
    assert 0 < summary["energy_j_per_token"] <= allowed * 1.05, (summary["energy_j_per_token"], allowed)


def test_the_compute_clock_reads_cuda_events_in_seconds_within_the_step() -> None:
    """trainer/clock.py on a GPU (CUDA events on the compute stream, read after the last step): on one
    rank nothing waits: a step's compute is much of it (the optimizer and loss are not timed) and never more
    (milliseconds read as seconds would be 1000x)."""
    spec = RunSpec(model="small_llama", micro_batch=4, seq_len=512, steps=6, warmup_steps=2)
    run = run_torchrun(["trainer.test_clock", *spec.to_argv()], nproc=1, timeout=600)
    record = next(r for r in run.records if r["kind"] == "summary")
    assert run.returncode == 0 and record["device"].startswith("cuda"), run.output[-3000:]
    compute = record["per_rank"][0]["compute_s"]
    assert 0.3 * record["step_time_s"] < compute < record["step_time_s"], (compute, record["step_time_s"])


def test_a_one_gpu_runs_trace_parts_add_up_to_its_step(tmp_path) -> None:
    """trainer/trace.py's CUDA path on real kernels: the parts of the traced steps add up to their
    perf_counter time within 5% (bench.gpucheck's threshold), each profiled step counted once (a CUDA trace
    holds the step's range twice: the host's, and its kernels' span), compute and the optimizer's kernels
    found, every NCCL kernel has a kind, and the trace is a gzip Chrome trace. How much of the step is
    compute is not asserted: a model this small is host-bound (on an H100, about 5 ms of kernels in a
    100 ms profiled step)."""
    import gzip
    argv = ["trainer", *SPEC.to_argv(), "--trace-steps", "2", "--run-dir", str(tmp_path)]
    run = run_torchrun(argv, nproc=1, timeout=600)
    assert run.returncode == 0, run.output[-3000:]
    record = run.of_kind("trace")[0]
    split = record["split"]
    assert record["error"] is None and split["device"] == "gpu", record
    timed = sum(record["step_times_s"]) / len(record["step_times_s"])
    assert abs(sum(split["parts"].values()) / timed - 1) <= 0.05, (split["parts"], timed)
    assert split["steps"] == len(record["step_times_s"]) == 2
    assert split["parts"]["compute"] > 0 and split["parts"]["optimizer"] > 0 and split["unclassified"] == 0
    with gzip.open(record["file"], "rt") as f:
        assert any(e.get("cat") == "kernel" for e in json.load(f)["traceEvents"])
