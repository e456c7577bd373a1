"""bench.gpucheck, bench.gpucheck.judge and bench.gpucheck.evidence where no GPU is: the no-GPU path, the
checks on known figures, the evidence rendered from a real smoke sweep, and the steps driven end to end
behind a stand-in nvidia-smi (the one boundary a CPU machine cannot cross: its output is the one a real
H100 printed, see bench/core/test_gpus.py), workers on CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench.core import rundir
from bench.core.schema import FAULTS_ENV, RunSpec, RunSummary
from bench.gpucheck import check as gpucheck, evidence, judge
from bench.gpucheck.check import Step
from conftest import ROOT

H100 = "NVIDIA H100 80GB HBM3"
CHECK_NAMES = ("every run ends ok", "smoke one-rank runs on the GPU with NCCL", "MFU",
               "memory: fake-tensor peak", "headroom: allocator", "headroom: outside the allocator",
               "NVML readings during a run", "trace: parts add up to the step", "time")


def _run(spec: RunSpec, sweep: str = "gpucheck_memory", **metrics) -> RunSummary:
    defaults = dict(device_name=H100, torch_version="2.11.0+cu130", pred_mem_source="measured",
                    pred_mem_gib=10.0, mem_peak_alloc_gib=10.0, mem_peak_reserved_gib=10.5,
                    nvml_mem_used_gib=11.2, nvml_util_pct=95.0, nvml_power_w=600.0)
    extra = {"backend": "nccl", "per_rank": [{"nvml_power_limit_w": 700.0, "nvml_mem_total_gib": 79.6}]}
    return RunSummary(run_id=spec.run_id, sweep=sweep, spec=spec, extra=extra,
                      **{"status": "ok", **defaults, **metrics})


def _specs(n: int) -> list[RunSpec]:
    return [RunSpec(model="llama3_2_1b", seq_len=2048, micro_batch=m) for m in range(1, n + 1)]


def _by_name(runs: list[RunSummary]) -> dict[str, judge.Check]:
    return {c.name: c for c in judge.all_checks(runs, [])}


def test_mfu_is_judged_on_the_best_bf16_row_of_an_h100_only() -> None:
    rows = [_run(s, "gpucheck_mfu", mfu=m) for s, m in zip(_specs(2), (0.34, 0.36))]
    fp8 = _run(replace(_specs(3)[2], precision="fp8_tensorwise"), "gpucheck_mfu", mfu=0.50)
    assert judge.check_mfu(rows + [fp8]).passed is True  # 0.36 counts; Float8's 0.50 is not a bf16 row
    low = judge.check_mfu(rows[:1] + [fp8])
    assert low.passed is False and "0.340" in low.failures[0] and "< 0.35" in low.failures[0]
    a100 = judge.check_mfu([_run(_specs(1)[0], "gpucheck_mfu", mfu=0.2,
                                    device_name="NVIDIA A100-SXM4-80GB")])
    assert a100.passed is None and a100.verdict == "not judged"
    assert judge.check_mfu([]).passed is False  # nothing measured is no proof


def test_the_memory_check_holds_every_run_to_five_percent_and_wants_six() -> None:
    six = [_run(s, pred_mem_gib=10.49) for s in _specs(6)]  # +4.9%
    check = judge.check_fake_peak(six)
    assert check.passed is True and "+4.9%" in check.measured
    off = six[:5] + [_run(_specs(6)[5], pred_mem_gib=10.51)]
    failed = judge.check_fake_peak(off)
    assert failed.passed is False and failed.failures == [f"{_specs(6)[5].label}: predicted +5.1%"]
    assert judge.check_fake_peak(six[:5]).failures == ["only 5 configurations (at least 6)"]
    # a compiled run is planned at its eager peak, a bound from above: 16% over passes, 6% under fails
    compiled = [_run(replace(s, compile=True), pred_mem_gib=p) for s, p in zip(_specs(2), (11.6, 9.4))]
    mixed = judge.check_fake_peak(six[:4] + compiled)
    assert mixed.passed is False and mixed.failures == [f"{compiled[1].spec.label}: predicted -6.0%"]
    assert judge.check_fake_peak(six[:4] + compiled[:1] + six[4:5]).passed is True
    bound = [_run(s, pred_mem_source="lower bound", pred_mem_gib=3.0) for s in _specs(6)]
    assert judge.check_fake_peak(bound).passed is False  # a lower bound is not a prediction to check


def test_the_headroom_checks_use_the_plans_constants() -> None:
    spec = _specs(1)[0]
    # fragmentation, judged where the allocated peak is half the GPU (79.6 GiB) or more: 1.20x allowed
    full = dict(pred_mem_gib=50.0, mem_peak_alloc_gib=50.0)
    assert judge.check_fragmentation([_run(spec, **full, mem_peak_reserved_gib=59.5)]).passed is True
    frag = judge.check_fragmentation([_run(spec, **full, mem_peak_reserved_gib=60.5)])  # 1.21 > 1.20
    assert frag.passed is False and "1.21x > 1.20x" in frag.failures[0]
    # a compiled run is planned at its eager peak: what the plan holds for it is that peak times 1.20
    compiled = replace(spec, compile=True)
    bound = judge.check_fragmentation([_run(compiled, pred_mem_gib=57.0, mem_peak_alloc_gib=44.0,
                                               mem_peak_reserved_gib=53.7)])  # 1.22x of 44, 0.94x of 57
    assert bound.passed is True and "0.94x" in bound.measured
    over_plan = judge.check_fragmentation([_run(compiled, pred_mem_gib=44.0, mem_peak_alloc_gib=44.0,
                                                   mem_peak_reserved_gib=53.7)])
    assert over_plan.passed is False and "1.22x > 1.20x" in over_plan.failures[0]
    small = judge.check_fragmentation([_run(spec, mem_peak_reserved_gib=15.0)])  # 1.5x of 10 GiB
    assert small.passed is False and small.failures == ["no GPU run allocated half its GPU"]
    # outside the allocator: 1.5 GiB context + 0.5 per communicator; FULL_SHARD holds 1, HYBRID_SHARD 3
    over = judge.check_outside_allocator([_run(spec, nvml_mem_used_gib=12.7)])  # 2.2 > 2.0
    assert over.passed is False and "2.20 GiB > 2.00 GiB" in over.failures[0]
    hybrid = replace(spec, sharding="HYBRID_SHARD", nodes=2, gpus_per_node=2)
    assert judge.check_outside_allocator([_run(hybrid, nvml_mem_used_gib=12.7)]).passed is True


def test_runs_that_did_not_end_ok_fail_only_the_first_check() -> None:
    """A run the step's budget cancelled has no device or NVML reading: that is the first check's failure
    (every run ends ok), not also the GPU and NVML checks' (the H200's first evidence counted it thrice)."""
    spec = _specs(1)[0]
    cancelled = _run(replace(spec, micro_batch=9), "smoke", status="cancelled", device_name=None,
                     nvml_power_w=None)
    ok = _run(spec, "smoke")
    checks = {c.name: c for c in judge.all_checks([ok, cancelled], [])}
    assert checks["every run ends ok"].passed is False
    assert checks["smoke one-rank runs on the GPU with NCCL"].passed is True
    assert checks["NVML readings during a run"].passed is True


def test_nvml_readings_must_be_nonzero_and_within_the_gpus_limits() -> None:
    spec = _specs(1)[0]
    assert judge.check_nvml([_run(spec)]).passed is True
    for bad in ({"nvml_power_w": None}, {"nvml_power_w": 720.0}, {"nvml_mem_used_gib": 80.0},
                {"nvml_util_pct": 0.0}, {"nvml_util_pct": 0.0, "mfu": 0.3}):
        check = judge.check_nvml([_run(spec, **bad)])
        assert check.passed is False and check.failures[0].startswith(spec.label), bad


def test_a_host_bound_runs_zero_utilisation_is_what_nvml_reads_not_a_fault() -> None:
    """The H200's gpucheck of 2026-11-28: two one-rank tiny_llama smoke runs (MFU 4e-5: kernels in a few
    percent of a host-bound step) read 0% utilisation in every NVML sample, beside power and memory. Below
    MFU 1% that is what NVML's whole-percent utilisation shows; at MFU 0.3 it would be a fault."""
    rows = json.loads((evidence.EVIDENCE_DIR / "NVIDIA-H200_torch-2.11.0-cu130_2026-11-28.json").read_text())
    idle = [r for r in rows["runs"] if r["nvml_util_pct"] == 0.0]
    assert len(idle) == 2 and all(r["mfu"] < judge.UTIL_VISIBLE_MFU for r in idle)
    spec = _specs(1)[0]
    runs = [_run(spec, nvml_util_pct=0.0, mfu=r["mfu"], nvml_power_w=r["nvml_power_w"],
                 nvml_mem_used_gib=r["nvml_mem_used_gib"]) for r in idle]
    check = judge.check_nvml(runs)
    assert check.passed is True and "2 run(s) below MFU 1% read 0% utilisation" in check.measured
    assert judge.check_nvml([_run(spec, nvml_util_pct=0.0, mfu=0.3)]).passed is False


def test_without_a_gpu_it_says_so_and_measures_nothing(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.gpucheck", "--results-root", str(tmp_path / "r"),
                           "--out", str(tmp_path / "ev")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "gpucheck: no CUDA GPU on this machine (CUDA_VISIBLE_DEVICES / nvidia-smi -L list none): "
        "nothing measured"]
    assert list(tmp_path.iterdir()) == []


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for source in (tmp_path / "absent", tmp_path):  # no such dir; a dir without runs
        proc = subprocess.run([sys.executable, "-m", "bench.gpucheck", "--from", str(source), "--out",
                               str(tmp_path / "ev")], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "ev").exists()


@pytest.mark.slow  # a real sweep or a whole deep model: minutes on 2 cores (CI runs it)
def test_evidence_from_a_smoke_sweep_names_every_check_and_threshold(smoke_results: Path,
                                                                    tmp_path: Path) -> None:
    """The smoke sweep ran on CPU: the evidence must say so, check by check, and fail."""
    proc = subprocess.run([sys.executable, "-m", "bench.gpucheck", "--from", str(smoke_results), "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summaries = [rundir.read_summary(d) for d in rundir.iter_run_dirs(smoke_results / "smoke_full")]
    torch_version, date = summaries[0].torch_version, max(s.started_at for s in summaries)[:10]
    name = f"cpu_torch-{torch_version.replace('+', '-')}_{date}"  # e.g. cpu_torch-2.13.0-cpu_2026-11-25
    md, js = tmp_path / f"{name}.md", tmp_path / f"{name}.json"
    assert sorted(tmp_path.iterdir()) == [js, md]
    text, evidence = md.read_text(), json.loads(js.read_text())
    for name in CHECK_NAMES:
        assert f"| {name} |" in text
    for threshold in ("0.35", "within 5% of torch.cuda.max_memory_allocated", "<= 1.20",
                      "1.5 GiB context + 0.5 GiB per NCCL communicator",
                      "within 540 s"):
        assert threshold in text
    checks = {c["name"]: c for c in evidence["checks"]}
    assert len(evidence["runs"]) == len(summaries) > 0
    assert checks["every run ends ok"]["measured"] == f"{len(summaries)} of {len(summaries)} ok"
    # that smoke sweep ran two ranks per node (conftest.SMOKE_SHAPE): no one-rank run, so nothing proven
    gpu = checks["smoke one-rank runs on the GPU with NCCL"]
    assert gpu["passed"] is False and gpu["failures"] == ["no one-rank smoke run recorded"]
    assert "FAILED MFU: no llama3_2_1b bf16_mixed run with an MFU" in proc.stdout
    for row in text.split("## Checks")[1].split("\n\n")[1].splitlines()[2:]:  # a cell with a | breaks the row
        assert row.count("|") == 5, row
    assert checks["time"]["passed"] is None  # rendered, not run: no step times


@pytest.fixture
def stand_in_gpu(tmp_path: Path, monkeypatch) -> None:
    """nvidia-smi answering as the device tool's H100 did (-L; --query-gpu=memory.total in MiB)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$1" in\n  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 '
                   '(UUID: GPU-5f3e2a61-7c1b-4d2e-9f80-1a2b3c4d5e6f)";;\n  *) echo 81559;;\nesac\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


ONE_RUN = (*gpucheck.SMOKE_ONE_RANK, "axes.precision=[bf16_mixed]", "axes.activation_checkpointing=[none]",
           "axes.compile=[false]", "nccl.enabled=false", "steps=3", "warmup_steps=1")


@pytest.mark.slow  # two real sweeps, one stopped at its budget: half a minute of the default suite's five
def test_steps_run_under_their_budgets_and_an_overrun_is_stopped_and_named(stand_in_gpu, tmp_path: Path,
                                                                            capsys, monkeypatch) -> None:
    # the tiny run's step takes about 9 s here (warm cache): a 45 s budget is five times that, and leaves
    # the second step 12 s and the rest it did not use
    steps = (Step("smoke", "smoke", "one tiny run", ONE_RUN, 45),
             Step("slow", "slow", "a run that sleeps past its step's budget",
                  (*ONE_RUN, "sweep_name=slow", "axes.seq_len=[64]"), 12))
    # the test hook's rule, in the steps' sweeps' environment: the slow step's run alone (its seq_len) sleeps
    monkeypatch.setenv(FAULTS_ENV, "[{match: {seq_len: 64}, fault: sleep, seconds: 300}]")
    root = tmp_path / "results"
    assert gpucheck.measure(root, steps) == gpucheck.EXIT_OK
    out = capsys.readouterr().out
    assert "gpucheck: NVIDIA H100 80GB HBM3 (H100-SXM)" in out and "[smoke] " in out  # the sweep's own lines
    recorded = judge.load_steps(root)
    assert [r.name for r in recorded] == ["smoke", "slow"]
    assert recorded[0].returncode == 0 and recorded[1].returncode is None
    assert recorded[0].budget_s == 45  # the second step has its own 12 s and what the first left unused
    assert recorded[1].budget_s == pytest.approx(12 + 45 - recorded[0].elapsed_s, abs=0.5)
    budget = recorded[1].budget_s
    # SIGINT at the budget, the sweep's own shutdown after
    assert budget <= recorded[1].elapsed_s < budget + 60
    slow = rundir.read_summary(next(rundir.iter_run_dirs(root / "slow")))
    assert slow.status == "cancelled"  # the stopped sweep wrote its run down, and left nothing running
    leftover = subprocess.run(["pgrep", "-f", slow.run_id], capture_output=True, text=True)
    assert leftover.stdout == ""
    code, files = evidence.write_evidence(root, tmp_path / "ev", "python -m bench.gpucheck")
    checks = {c["name"]: c for c in json.loads(files[1].read_text())["checks"]}
    assert code == evidence.EXIT_FAILED
    assert checks["time"]["failures"] == [f"step slow: stopped at its budget of {budget:.0f} s"]
    # planned against the H100 the stand-in names (its 81559 MiB), but the worker ran on this CPU
    smoke = rundir.read_summary(next(rundir.iter_run_dirs(root / "smoke")))
    assert smoke.status == "ok" and smoke.pred_mem_source == "measured" and smoke.pred_mfu is not None
    assert checks["smoke one-rank runs on the GPU with NCCL"]["failures"] == [
        f"{smoke.spec.label}: on cpu, backend gloo"]
    assert (root / "smoke.log").read_text().count("sweep smoke: 1 runs planned") == 1
    # the later step's plan ran on the CPU while the first step ran: its sweep measured nothing itself
    assert "memory: 0 measured, 1 from the cache" in (root / "slow.log").read_text()


def test_the_steps_fit_the_total_and_the_prewarm_leaves_the_gpu_step_its_cores() -> None:
    assert sum(step.budget_s for step in gpucheck.STEPS) <= judge.TOTAL_BUDGET_S
    assert gpucheck.prewarm_workers(2, cores=16) == 6  # 12 of 16 cores planning, 4 beside the GPU's run
    assert gpucheck.prewarm_workers(2, cores=4) == 1 and gpucheck.prewarm_workers(1, cores=2) == 1


def test_a_second_run_on_the_same_day_keeps_the_first_runs_evidence(tmp_path: Path) -> None:
    name = "NVIDIA-H200_torch-2.11.0-cu130_2026-11-27"
    assert evidence.free_name(tmp_path, name, "results/a") == name
    (tmp_path / f"{name}.json").write_text(json.dumps({"results_root": "results/a"}))
    assert evidence.free_name(tmp_path, name, "results/a") == name  # --from the same root: rewritten
    assert evidence.free_name(tmp_path, name, "results/b") == f"{name}-2"
    (tmp_path / f"{name}-2.json").write_text("{not json")
    assert evidence.free_name(tmp_path, name, "results/c") == f"{name}-3"


def test_a_one_gpu_runs_trace_parts_must_add_up_to_its_traced_step() -> None:
    """Rank 0's parts against the perf_counter time of the same traced steps (5%); a run whose trace has no
    split fails and says why; runs that traced nothing are not judged, unless none traced; multi-rank and
    CPU runs are not this check's."""
    spec = _specs(1)[0]

    def traced(parts_s: float, note: str | None = None, **kw) -> RunSummary:
        run = _run(spec, "smoke", trace_note=note, **kw)
        if parts_s:
            run.extra["trace_per_rank"] = [{"rank": 0, "parts": {"compute": parts_s - 0.1, "other": 0.1},
                                            "step_times_s": [0.99, 1.01]}]
        return run
    assert judge.check_trace([traced(1.04)]).passed is True
    failed = judge.check_trace([traced(1.07)])
    assert failed.passed is False and failed.failures == [f"{spec.label}: parts +7.0% off the traced step"]
    unsplit = traced(0, "rank 0: unreadable trace rank0.pt.trace.json.gz (EOFError: ...)")
    unsplit.extra["trace_per_rank"] = [{"rank": 0, "parts": None, "step_times_s": [1.0]}]
    missing = judge.check_trace([unsplit])
    assert missing.passed is False and "unreadable trace" in missing.failures[0]
    # the memory and MFU steps' runs trace nothing (trace.enabled=false): judged by the runs that traced
    assert judge.check_trace([traced(1.04), traced(0, "no trace recorded")]).passed is True
    none = judge.check_trace([traced(0, "no trace recorded")])
    assert none.passed is False and "no one-GPU run recorded a trace" in none.failures[0]
    assert judge.check_trace([traced(1.5, device_name="cpu")]).passed is None
