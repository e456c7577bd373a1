"""The checks bench.gpucheck holds a GPU's runs to, each with its threshold, and what they read: the run
summaries under a results root and the steps' record (`gpucheck_steps.json`).

Everything here reads run summaries and the steps' record only, never a GPU: `python -m bench.gpucheck
--from RESULTS_ROOT` judges runs made elsewhere, and the tests judge known figures and a real smoke sweep.
The thresholds are the planner's own constants (bench/predict/memory.py's headroom) or a published figure
(MFU). The files that keep what the checks found are bench/gpucheck/evidence.py's.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.core import rundir
from bench.core.hardware import gpu_spec
from bench.core.schema import RunSummary
from bench.predict.memory import CUDA_CONTEXT_GIB, FRAGMENTATION, NCCL_GIB_PER_COMMUNICATOR, communicators

STEPS_JSON = "gpucheck_steps.json"  # in the results root: each step's time, budget and exit status

MFU_MIN = 0.35  # the best llama3_2_1b bf16 row on an H100/H200 (torchtitan's Llama 3 8B: 0.38-0.43 MFU)
MFU_GPUS = ("H100-SXM", "H100-PCIe", "H100-NVL", "H200")  # where MFU_MIN is a claim
MEMORY_TOLERANCE = 0.05  # |fake-tensor peak / torch.cuda.max_memory_allocated - 1|
TRACE_TOLERANCE = 0.05  # |a traced step's parts / its perf_counter time - 1| (trainer/trace_split.py)
POWER_MARGIN = 1.05  # energy against the power limit x the window: a mean can brush the cap (test_gpu.py)
ENERGY_MIN_WINDOW_S = 1.0  # a shorter timed window may see NVML's energy counter not move: not judged
# NVML's utilisation is the whole percent of a sample period in which a kernel ran. A run's MFU is a lower
# bound on that share (no kernel computes above the peak), so at an MFU of 1% or more a kernel ran for at
# least 1% of the run and utilisation reads above 0; below it (a host-bound run of a tiny model, whose
# kernels fill a few percent of its step) every sample may read 0: not judged
UTIL_VISIBLE_MFU = 0.01
# what a GPU run's system record must hold (bench/core/system.py), read through the sampler's NVML path
SYSTEM_FACTS = ("gpu_model", "gpu_count", "gpu_driver", "cuda_driver", "cuda_runtime", "nccl",
                "gpu_power_limit_w")
TOTAL_BUDGET_S = 540  # within 10 minutes a command, with a minute left for installing and the evidence


@dataclass
class StepResult:
    name: str
    budget_s: float
    elapsed_s: float
    returncode: int | None  # None: stopped at its budget
    log: str


@dataclass
class Check:
    name: str
    threshold: str
    measured: str
    passed: bool | None  # None: not judged here (e.g. a threshold set for another GPU)
    failures: list[str] = field(default_factory=list)  # the lines that failed it, each naming its run

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "FAIL", None: "not judged"}[self.passed]


# ---------------------------------------------------------------------------------------------- reading

def load_runs(root: Path) -> list[RunSummary]:
    """Every run summary under the results root (each step's sweep dir)."""
    return [s for sweep_dir in sorted(p for p in root.iterdir() if p.is_dir())
            for s in rundir.read_summaries(sweep_dir)]


def load_steps(root: Path) -> list[StepResult]:
    try:
        return [StepResult(**s) for s in json.loads((root / STEPS_JSON).read_text())]
    except (OSError, ValueError, TypeError):
        return []


def on_gpu(s: RunSummary) -> bool:
    return bool(s.device_name) and s.device_name != "cpu"


def train_runs(runs: list[RunSummary]) -> list[RunSummary]:
    """The training runs (not the probes)."""
    return [s for s in runs if s.spec.kind == "train"]


def rank_max(s: RunSummary, key: str) -> float | None:
    """The largest of a per-rank figure (extra["per_rank"]); None where no rank has it."""
    values = [r[key] for r in s.extra.get("per_rank", []) if isinstance(r, dict) and r.get(key) is not None]
    return max(values) if values else None


# ---------------------------------------------------------------------------------------------- checks

def _first_line(text: str | None) -> str:
    return text.splitlines()[0][:160] if text else ""


def check_runs_ok(runs: list[RunSummary], steps: list[StepResult]) -> Check:
    bad = [f"{s.sweep} {s.spec.label}: {s.status} ({_first_line(s.error)})" for s in runs if s.status != "ok"]
    bad += [f"step {r.name}: sweep exited {r.returncode}" for r in steps if r.returncode not in (0, 1)]
    ok = sum(s.status == "ok" for s in runs)
    return Check("every run ends ok", "every run ok, none failed, cancelled or out of memory",
                 f"{ok} of {len(runs)} ok", bool(runs) and not bad, bad)


def _ran(runs: list[RunSummary]) -> list[RunSummary]:
    """Runs that ended ok: a cancelled or failed one is the first check's failure, not every check's."""
    return [s for s in runs if s.status == "ok"]


def check_gpu_nccl(runs: list[RunSummary]) -> Check:
    """The smoke sweep's one-rank runs (those a one-GPU machine runs on its GPU; wider ones go to CPU)."""
    smoke = [s for s in _ran(runs) if s.sweep == "smoke" and s.spec.world_size == 1]
    bad = [f"{s.spec.label}: on {s.device_name or 'unknown device'}, backend {s.extra.get('backend', '?')}"
           for s in smoke if not (on_gpu(s) and s.extra.get("backend") == "nccl")]
    return Check("smoke one-rank runs on the GPU with NCCL",
                 "every one-rank smoke run on a CUDA device, NCCL backend",
                 f"{len(smoke) - len(bad)} of {len(smoke)} on the GPU with NCCL", bool(smoke) and not bad,
                 bad or ([] if smoke else ["no one-rank smoke run recorded"]))


def mfu_rows(runs: list[RunSummary]) -> list[RunSummary]:
    return [s for s in train_runs(runs) if s.spec.model == "llama3_2_1b" and s.sweep == "gpucheck_mfu"]


def check_mfu(runs: list[RunSummary]) -> Check:
    bf16 = [s for s in mfu_rows(runs) if s.spec.precision == "bf16_mixed" and s.mfu is not None]
    threshold = f"best llama3_2_1b bf16_mixed row >= {MFU_MIN} on {', '.join(MFU_GPUS)}"
    if not bf16:
        return Check("MFU", threshold, "no llama3_2_1b bf16_mixed run measured MFU", False,
                     ["no llama3_2_1b bf16_mixed run with an MFU"])
    best = max(bf16, key=lambda s: s.mfu or 0.0)
    spec = gpu_spec(best.device_name or "")
    measured = f"{best.mfu:.3f} ({best.spec.label} on {best.device_name})"
    if spec is None or spec.name not in MFU_GPUS:
        return Check("MFU", threshold, measured, None)
    passed = best.mfu >= MFU_MIN
    return Check("MFU", threshold, measured, passed, [] if passed else [f"{measured} < {MFU_MIN}"])


def memory_rows(runs: list[RunSummary]) -> list[RunSummary]:
    """GPU training runs with both the plan's fake-tensor peak and the device's allocator peak."""
    return [s for s in train_runs(runs) if on_gpu(s) and s.pred_mem_source == "measured"
            and s.pred_mem_gib and s.mem_peak_alloc_gib]


def _peak_error(s: RunSummary) -> float:
    """The plan's peak against the device's, as a fraction. A compiled run is planned at its eager peak
    (fake tensors trace eager ops; inductor's fusion frees intermediates sooner), a bound from above: only
    its shortfall counts (a compiled run's peak against its plan: benchmarks/evidence/README.md)."""
    error = s.pred_mem_gib / s.mem_peak_alloc_gib - 1
    return min(error, 0.0) if s.spec.compile else error


def check_fake_peak(runs: list[RunSummary]) -> Check:
    rows = memory_rows(runs)
    threshold = (f"fake-tensor peak within {MEMORY_TOLERANCE:.0%} of torch.cuda.max_memory_allocated, "
                 "every run (compiled: at or above it, the eager peak being their bound)")
    if not rows:
        return Check("memory: fake-tensor peak", threshold, "no GPU run with both figures", False,
                     ["no GPU run measured device memory beside a fake-tensor prediction"])
    errors = {s.spec.label: s.pred_mem_gib / s.mem_peak_alloc_gib - 1 for s in rows}
    bad = [f"{s.spec.label}: predicted {errors[s.spec.label]:+.1%}" for s in rows
           if abs(_peak_error(s)) > MEMORY_TOLERANCE]
    eager = [errors[s.spec.label] for s in rows if not s.spec.compile] or list(errors.values())
    worst = max(errors, key=lambda k: abs(errors[k]))
    return Check("memory: fake-tensor peak", threshold,
                 f"{len(rows)} runs, median |error| {statistics.median(abs(e) for e in eager):.1%} (eager), "
                 f"worst {errors[worst]:+.1%} ({worst})", not bad and len(rows) >= 6,
                 bad or ([] if len(rows) >= 6 else [f"only {len(rows)} configurations (at least 6)"]))


def _headroom_check(name: str, threshold: str, rows: list[tuple[str, float, float]], unit: str,
                    none: str = "no GPU run measured it") -> Check:
    """rows: (label, measured, allowed)."""
    if not rows:
        return Check(name, threshold, none, False, [none])
    bad = [f"{label}: {value:.2f}{unit} > {allowed:.2f}{unit}" for label, value, allowed in rows
           if value > allowed]
    label, value, allowed = max(rows, key=lambda r: r[1] - r[2])
    measured = f"up to {value:.2f}{unit} ({label}; allowed {allowed:.2f}{unit})"
    return Check(name, threshold, measured, not bad, bad)


def _fills_half(s: RunSummary) -> bool:
    """An allocated peak of half the GPU or more: where the allocator's overhead decides a fit."""
    total = rank_max(s, "nvml_mem_total_gib")
    return bool(total and s.mem_peak_alloc_gib and s.mem_peak_alloc_gib >= total / 2)


def _planned_peak(s: RunSummary) -> float:
    """The peak the plan multiplies by 1 + FRAGMENTATION (MemoryFigure.need_gib): the device's allocated
    peak for an eager run (the fake-tensor check holds the plan to it); for a compiled run the plan's own,
    its eager peak, a bound from above (_peak_error): inductor's fusion frees sooner and reserves more
    against what it allocates (benchmarks/evidence/README.md, "Headroom")."""
    return s.pred_mem_gib if s.spec.compile and s.pred_mem_gib else s.mem_peak_alloc_gib


def check_fragmentation(runs: list[RunSummary]) -> Check:
    rows = [(s.spec.label, s.mem_peak_reserved_gib / _planned_peak(s), 1 + FRAGMENTATION)
            for s in train_runs(runs) if on_gpu(s) and s.mem_peak_reserved_gib and _fills_half(s)]
    return _headroom_check("headroom: allocator", f"reserved / allocated <= {1 + FRAGMENTATION:.2f} "
                           "(bench/predict/memory.py FRAGMENTATION) where the allocated peak is half "
                           "the GPU or more (compiled: reserved / the plan's peak, their bound)", rows, "x",
                           "no GPU run allocated half its GPU")


def check_outside_allocator(runs: list[RunSummary]) -> Check:
    rows = [(s.spec.label, s.nvml_mem_used_gib - s.mem_peak_reserved_gib,
             CUDA_CONTEXT_GIB + NCCL_GIB_PER_COMMUNICATOR * communicators(s.spec))
            for s in train_runs(runs) if on_gpu(s) and s.nvml_mem_used_gib and s.mem_peak_reserved_gib]
    return _headroom_check("headroom: outside the allocator",
                           f"NVML used - reserved <= {CUDA_CONTEXT_GIB:g} GiB context + "
                           f"{NCCL_GIB_PER_COMMUNICATOR:g} GiB per NCCL communicator", rows, " GiB")


def _util_visible(s: RunSummary) -> bool:
    """Whether the run kept a kernel running long enough for NVML's utilisation to read above 0."""
    return s.mfu is None or s.mfu >= UTIL_VISIBLE_MFU


def check_nvml(runs: list[RunSummary]) -> Check:
    threshold = ("power, utilisation, memory used > 0 and below the GPU's limits (NVML's power limit, "
                 f"memory); utilisation 0 allowed below MFU {UTIL_VISIBLE_MFU:.0%}")
    rows = [s for s in train_runs(_ran(runs)) if on_gpu(s)]
    bad = []
    for s in rows:
        power, util, used = s.nvml_power_w, s.nvml_util_pct, s.nvml_mem_used_gib
        cap, total = rank_max(s, "nvml_power_limit_w"), rank_max(s, "nvml_mem_total_gib")
        if util == 0 and not _util_visible(s):
            util = None if util is None else 1.0  # idle in every sample is what such a run reads
        if not (power and util and used):
            bad.append(f"{s.spec.label}: power {power}, util {util}, used {used} "
                       f"({s.extra.get('nvml_reason') or 'no reading'})")
        elif (cap and power > cap) or util > 100 or (total and used > total):
            bad.append(f"{s.spec.label}: power {power:.0f} W (limit {cap}), util {util:.0f}%, used "
                       f"{used:.1f} GiB (of {total})")
    if not rows:
        return Check("NVML readings during a run", threshold, "no GPU run", False, ["no GPU run"])
    powers = [s.nvml_power_w for s in rows if s.nvml_power_w]
    idle = sum(1 for s in rows if s.nvml_util_pct == 0 and not _util_visible(s))
    measured = (f"{len(rows) - len(bad)} of {len(rows)} runs; mean power up to {max(powers):.0f} W"
                + (f"; {idle} run(s) below MFU {UTIL_VISIBLE_MFU:.0%} read 0% utilisation" if idle else "")
                if powers else f"0 of {len(rows)} runs read")
    return Check("NVML readings during a run", threshold, measured, not bad, bad)


def check_budget(steps: list[StepResult]) -> Check:
    threshold = f"each step within its budget (with what earlier steps left), all within {TOTAL_BUDGET_S} s"
    if not steps:
        return Check("time", threshold, "steps not recorded (rendered from a results dir)", None)
    total = sum(r.elapsed_s for r in steps)
    bad = [f"step {r.name}: stopped at its budget of {r.budget_s:.0f} s"
           for r in steps if r.returncode is None]
    bad += [f"all steps: {total:.0f} s > {TOTAL_BUDGET_S} s"] if total > TOTAL_BUDGET_S else []
    return Check("time", threshold, ", ".join(f"{r.name} {r.elapsed_s:.0f} s" for r in steps)
                 + f"; total {total:.0f} s", not bad, bad)


def _trace_error(s: RunSummary) -> float | None:
    """Rank 0's traced step split against the same steps timed by perf_counter: sum of parts / time - 1."""
    ranks = s.extra.get("trace_per_rank") or []
    rank = next((r for r in ranks if isinstance(r, dict) and r.get("parts") and r.get("step_times_s")), None)
    if rank is None:
        return None
    return sum(rank["parts"].values()) / statistics.mean(rank["step_times_s"]) - 1


def check_trace(runs: list[RunSummary]) -> Check:
    """Every one-GPU run's profiler trace splits its step into parts that add up to it (the CUDA kernels'
    path of trainer/trace.py, which the CPU tests check only on a synthetic trace)."""
    gpu = [s for s in _ran(runs) if on_gpu(s) and s.spec.kind == "train" and s.spec.world_size == 1]
    one = [s for s in gpu if s.extra.get("trace_per_rank")]  # the runs that traced (the smoke's)
    threshold = f"one-GPU runs: traced parts within {TRACE_TOLERANCE:.0%} of the traced steps' time"
    if not gpu:
        return Check("trace: parts add up to the step", threshold, "no one-GPU training run", None)
    if not one:
        return Check("trace: parts add up to the step", threshold, "no one-GPU run recorded a trace", False,
                     ["no one-GPU run recorded a trace (the smoke sweep's runs trace a step each)"])
    errors = {s.spec.label: _trace_error(s) for s in one}
    bad = [f"{label}: no split ({next(s.trace_note for s in one if s.spec.label == label)})"
           for label, e in errors.items() if e is None]
    bad += [f"{label}: parts {e:+.1%} off the traced step" for label, e in errors.items()
            if e is not None and abs(e) > TRACE_TOLERANCE]
    judged = [abs(e) for e in errors.values() if e is not None]
    measured = (f"{len(one) - len(bad)} of {len(one)} within; largest {max(judged):.1%}" if judged
                else f"0 of {len(one)} with a split")
    return Check("trace: parts add up to the step", threshold, measured, not bad, bad)


def _window(s: RunSummary) -> tuple[float, float] | None:
    """(joules the power limit allows over the timed window, summed over the ranks; the longest rank's
    window in seconds) from the per-rank NVML figures; None where a rank lacks one."""
    ranks = [r for r in s.extra.get("per_rank", []) if isinstance(r, dict)]
    pairs = [(r.get("nvml_power_limit_w"), r.get("nvml_energy_window_s")) for r in ranks]
    if not pairs or any(w is None or lim is None for lim, w in pairs):
        return None
    return sum(lim * w for lim, w in pairs), max(w for _, w in pairs)


def check_energy(runs: list[RunSummary]) -> Check:
    """Every GPU training run's energy per token over its timed steps (trainer/nvml.py: NVML's energy
    counter, else its power samples integrated): above 0, and at most what the GPUs' power limit allows in
    that time (limit x window, over the tokens trained in it)."""
    threshold = (f"GPU runs timed for {ENERGY_MIN_WINDOW_S:g} s or more: energy per token > 0 and <= NVML's "
                 f"power limit x GPUs x the timed window / tokens (x{POWER_MARGIN})")
    rows = [s for s in train_runs(_ran(runs)) if on_gpu(s)]
    bad, judged, ratios = [], 0, []
    for s in rows:
        window = _window(s)
        tokens = s.spec.sequences_per_step * s.spec.seq_len * (s.steps_timed or 0)
        if s.energy_j_per_token is None:
            if window is not None and window[1] < ENERGY_MIN_WINDOW_S:
                continue  # too short for the counter: its energy_source says so
            bad.append(f"{s.spec.label}: no energy figure ({s.energy_source or 'no reason recorded'})")
            continue
        judged += 1
        allowed = window[0] / tokens if window and tokens else None
        if s.energy_j_per_token <= 0 or allowed is None or s.energy_j_per_token > allowed * POWER_MARGIN:
            bad.append(f"{s.spec.label}: {s.energy_j_per_token:.4g} J/token, the power limit allows "
                       f"{allowed if allowed is None else format(allowed, '.4g')} ({s.energy_source})")
        else:
            ratios.append(s.energy_j_per_token / allowed)
    if not rows:
        return Check("energy per token", threshold, "no GPU run", False, ["no GPU run"])
    measured = (f"{judged} runs judged, {len(bad)} failed; up to {max(ratios):.0%} of the power limit"
                if ratios else f"{judged} runs judged, {len(bad)} failed")
    return Check("energy per token", threshold, measured, judged > 0 and not bad,
                 bad or ([] if judged else ["no GPU run's timed window was long enough to judge"]))


def check_system(runs: list[RunSummary]) -> Check:
    """Every GPU run's system record holds the GPU's facts (model, count, driver, CUDA, NCCL, power limit),
    read through the same NVML path as the sampler, and names the GPU the run reports."""
    threshold = f"every GPU run's system record has {', '.join(SYSTEM_FACTS)}; its GPU is the run's device"
    rows = [s for s in _ran(runs) if on_gpu(s)]
    bad = []
    for s in rows:
        entries = [e for e in s.extra.get("system") or [] if isinstance(e, dict)]
        facts = next((e["facts"] for e in entries if isinstance(e.get("facts"), dict)), None)
        if facts is None:
            why = next((e.get("unreadable") for e in entries if e.get("unreadable")), "no system record")
            bad.append(f"{s.spec.label}: {why}")
            continue
        lost = [f"{k} ({facts[k]['missing']})" if isinstance(facts.get(k), dict) else f"{k} (absent)"
                for k in SYSTEM_FACTS if isinstance(facts.get(k), dict) or k not in facts]
        if lost:
            bad.append(f"{s.spec.label}: missing {', '.join(lost)}")
        elif facts["gpu_model"] != s.device_name:
            bad.append(f"{s.spec.label}: record names {facts['gpu_model']}, the run {s.device_name}")
    if not rows:
        return Check("system record", threshold, "no GPU run", False, ["no GPU run"])
    return Check("system record", threshold, f"{len(rows) - len(bad)} of {len(rows)} GPU runs complete",
                 not bad, bad)


CHECKS: tuple[Callable[[list[RunSummary]], Check], ...] = (
    check_gpu_nccl, check_mfu, check_fake_peak, check_fragmentation, check_outside_allocator, check_nvml,
    check_trace, check_energy, check_system)


def all_checks(runs: list[RunSummary], steps: list[StepResult]) -> list[Check]:
    return [check_runs_ok(runs, steps), *(c(runs) for c in CHECKS), check_budget(steps)]
