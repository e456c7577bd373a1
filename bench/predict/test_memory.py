"""The planner's memory before launch (bench/predict/memory.py): what it measures, caches and falls back on,
and that its measuring processes never outlive the sweep."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import bench.predict.memory as memory
from bench.core.load_config import from_dict
from bench.core.models import count_params, get_arch
from bench.core.schema import RunSpec
from bench.launchers import launcher_sections
from bench.predict.memory import MemoryPlanner, fingerprint, memory_key
from bench.study.plan import expand, feasibility
from bench.sweep import _gib, compose, format_plan
from conftest import alive

ROOT = Path(__file__).resolve().parents[2]


def cfg_for(tmp_path: Path, *overrides: str):
    raw, _ = compose([*overrides, f"memory.cache_dir={tmp_path / 'cache'}"])
    return from_dict(raw, launcher_sections())


def test_each_configuration_is_measured_once_then_read_from_the_cache(tmp_path: Path, capsys) -> None:
    cfg = cfg_for(tmp_path, "+sweep=smoke_full", "axes.nodes=[1]", "axes.gpus_per_node=[2]",
                  "nccl.enabled=false", "axes.precision=[bf16_mixed]", "axes.compile=[false]",
                  "axes.sharding=[FULL_SHARD]", "axes.activation_checkpointing=[none,full]",
                  "axes.global_batch=[null]")
    first = MemoryPlanner(cfg)
    plan = expand(cfg, first)
    assert first.measured == 2 and first.cached == 0
    assert {p.memory.source for p in plan} == {"measured"}
    again = MemoryPlanner(cfg)
    replan = expand(cfg, again)
    assert again.measured == 0 and again.cached == 2
    assert [p.memory for p in replan] == [p.memory for p in plan]  # the cache holds what was measured
    full, none = sorted(plan, key=lambda p: p.spec.activation_checkpointing)
    assert full.memory.categories["activations"] < none.memory.categories["activations"]
    assert "memory: [2/2]" in capsys.readouterr().out  # progress, one line per configuration
    # a later round (the micro batch search's) is measured by the same processes, gone once closed
    processes = [w.proc for w in first._pool.live]
    first.prefetch([replace(full.spec, micro_batch=full.spec.micro_batch + 1)])
    assert first.measured == 3 and [w.proc for w in first._pool.live] == processes
    first.close()
    assert all(proc.poll() is not None for proc in processes)


def test_a_measurement_past_its_time_limit_is_planned_on_the_lower_bound(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, "+sweep=p5_scaling", "axes.model=[llama2_7b]", "axes.nodes=[2]",
                  "axes.sharding=[FULL_SHARD]", "nccl.enabled=false", "memory.timeout_s=1")
    started = time.monotonic()
    (run,) = expand(cfg, MemoryPlanner(cfg))
    assert run.memory.source == "lower bound" and "no answer within memory.timeout_s=1 s" in run.memory.note
    assert run.memory.gpu_gib == pytest.approx(6_738_415_616 * 16 / 16 / 2**30)  # 16 B/param over 16 GPUs
    assert run.feasible and time.monotonic() - started < 30  # given up, not waited for
    assert not list((tmp_path / "cache").glob("memory/*.json"))  # nothing half-measured is cached


def test_without_torch_where_the_sweep_plans_every_figure_is_a_lower_bound_and_says_why(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    monkeypatch.setattr(memory.importlib.util, "find_spec", lambda name: None)
    cfg = cfg_for(tmp_path, "+sweep=smoke_full", "nccl.enabled=false")
    plan = expand(cfg, MemoryPlanner(cfg))
    assert {p.memory.source for p in plan} == {"lower bound"}
    assert {p.memory.note for p in plan} == {"not measured: torch is not installed where the sweep plans "
                                             "(pip install torch to measure)"}
    text = format_plan(plan)
    assert all(f">={_gib(p.memory.gpu_gib)}  " in text for p in plan) and "not measured: torch" in text


def test_a_run_whose_state_alone_cannot_fit_is_infeasible_without_measuring(tmp_path: Path) -> None:
    """Llama 2 70B NO_SHARD on 8 GPUs: every GPU holds all 69B parameters' fp32 state (1 TB)."""
    cfg = cfg_for(tmp_path, "+sweep=p5_scaling", "axes.model=[llama2_70b]", "axes.nodes=[1]",
                  "axes.sharding=[NO_SHARD]", "nccl.enabled=false")
    planner = MemoryPlanner(cfg)
    (run,) = expand(cfg, planner)
    assert not run.feasible and planner.measured == 0
    assert run.memory.gpu_gib == pytest.approx(count_params(get_arch("llama2_70b")) * 16 / 2**30)  # 1027.8
    assert "(lower bound 1027.8 GiB" in run.reason and "AdamW state alone do not fit" in run.reason


def test_a_change_to_the_worker_measures_again(tmp_path: Path, monkeypatch) -> None:
    """The cache key holds a hash of the code that measures: edit trainer/parallel.py, get a new key."""
    copy = tmp_path / "project"
    for package in memory.WORKER_SOURCES:
        shutil.copytree(ROOT / package, copy / package)
    spec = RunSpec()
    before = memory_key(spec)
    monkeypatch.setattr(memory, "PROJECT_ROOT", copy)
    fingerprint.cache_clear()
    try:
        assert memory_key(spec) == before  # the same sources: the same key
        with open(copy / "trainer" / "parallel.py", "a") as f:
            f.write("\n# a change to the parallelization\n")
        fingerprint.cache_clear()
        assert memory_key(spec) != before
    finally:
        fingerprint.cache_clear()
    assert memory_key(replace(spec, micro_batch=2)) != memory_key(spec)  # a field that changes memory
    assert memory_key(replace(spec, steps=20)) == memory_key(spec)  # one that does not


def test_one_measurement_per_shard_group() -> None:
    """A rank holds its shard group's tensors (trainer/test_memory.py shows it): HYBRID_SHARD on 2 or 16
    nodes of 8 is one configuration, FULL_SHARD on 2 or 16 nodes two, FULL_SHARD on 2 nodes of 8 and on 4
    of 4 one."""
    hybrid = RunSpec(model="llama2_7b", sharding="HYBRID_SHARD", nodes=2, gpus_per_node=8)
    assert memory_key(replace(hybrid, nodes=16)) == memory_key(hybrid)
    full = replace(hybrid, sharding="FULL_SHARD")
    assert memory_key(replace(full, nodes=16)) != memory_key(full)
    assert memory_key(replace(full, nodes=4, gpus_per_node=4)) == memory_key(full)
    assert memory_key(full) != memory_key(hybrid)


def test_the_headroom_is_what_the_plan_needs_beyond_the_peak(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, "+sweep=p5_scaling", "axes.model=[llama2_13b]", "axes.nodes=[2]",
                  "nccl.enabled=false", "memory.measure=false")
    runs = {p.spec.sharding: p for p in expand(cfg)}
    full, hybrid = runs["FULL_SHARD"].memory, runs["HYBRID_SHARD"].memory
    # 20% fragmentation, 1.5 GiB of CUDA context, 0.5 GiB per NCCL communicator (the H200's evidence)
    assert full.need_gib(runs["FULL_SHARD"].spec) == pytest.approx(full.gpu_gib * 1.20 + 1.5 + 0.5)
    assert hybrid.need_gib(runs["HYBRID_SHARD"].spec) == pytest.approx(hybrid.gpu_gib * 1.20 + 1.5 + 3 * 0.5)
    tight = replace(cfg, cluster=replace(cfg.cluster, gpu_memory_gib=full.gpu_gib * 1.05))
    assert not feasibility(tight, runs["FULL_SHARD"].spec)[1]  # fits the peak, not the headroom


def test_killing_the_sweep_while_it_measures_leaves_no_measuring_process(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "bench.sweep", "+sweep=p5_scaling", "--dry-run",
                             f"results_root={tmp_path}", f"memory.cache_dir={tmp_path / 'cache'}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("memory: measuring"):
            break
    workers = lambda: subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "trainer.memory"],  # noqa: E731
                                     capture_output=True, text=True).stdout.split()
    deadline = time.monotonic() + 30
    while not workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    children = workers()
    assert children, "no measuring process started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(map(alive, children)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, children)), "a measuring process outlived the sweep"


def test_on_a_gpu_the_figure_holds_cublas_workspaces_beside_the_tensors(tmp_path: Path) -> None:
    """torch.cuda.max_memory_allocated counts cuBLAS's two 32 MiB workspaces, which no fake tensor holds
    (the H200's evidence: every run 64 MiB above its fake-tensor peak): a GPU cluster's figure adds them,
    the CPU's (cluster.gpu unset) does not. Each is measured as its device runs it (its own cache entry:
    the worker's --cuda), which for bf16 attention is the same peak."""
    overrides = ("+sweep=smoke_full", "axes.nodes=[1]", "axes.gpus_per_node=[1]",
                 "axes.precision=[bf16_mixed]", "axes.activation_checkpointing=[none]",
                 "axes.compile=[false]")
    cpu = MemoryPlanner(cfg_for(tmp_path, *overrides))
    spec = next(p.spec for p in expand(cpu.cfg) if p.spec.kind == "train")
    gpu = MemoryPlanner(cfg_for(tmp_path, *overrides, "cluster.gpu=H200"))
    on_cpu, on_gpu = cpu.figure(spec), gpu.figure(spec)
    assert cpu.measured == gpu.measured == 1 and on_cpu.source == on_gpu.source == "measured"
    assert on_gpu.gpu_gib - on_cpu.gpu_gib == pytest.approx(64 / 1024, abs=1e-12)
    assert on_gpu.categories["cublas workspace"] == 64 / 1024 and "cublas workspace" not in on_cpu.categories
