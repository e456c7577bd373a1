"""`python -m bench.gpucheck`: every GPU claim of the harness proven by one command on a one-GPU machine, in
under 10 minutes, with the evidence kept in `benchmarks/evidence/<gpu>_torch-<version>_<date>.{md,json}`.

Three sweeps run through the same launch path as any study (`python -m bench.sweep`, torchrun, the FSDP2
worker), each under a time budget (STEPS): the smoke sweep's one-rank runs on the GPU with NCCL; Llama 3.2 1B
at the largest micro batch that fits, then compiled in bf16 and in Float8 (`sweeps/sweep/gpucheck_mfu.yaml`);
six memory configurations (`gpucheck_memory.yaml`). The later sweeps plan on the CPU while the first has
the GPU. Then every run is checked (bench/gpucheck/judge.py: each check with its threshold) and the
evidence written (bench/gpucheck/evidence.py). Exit 0 when every check holds; 1 naming each failed line; 2
bad input (an unknown GPU, a results dir without runs); 130 interrupted. Without a CUDA GPU it says so in
one line and exits 0, measuring nothing.

`--from RESULTS_ROOT` renders the evidence of runs already made (a CI artifact, an earlier gpucheck), without
running anything: the same checks, the same files.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.core import rundir
from bench.core.gpus import local_gpu_memory_gib, local_gpu_name, local_gpus
from bench.core.hardware import GPUS, gpu_spec
from bench.gpucheck.evidence import EVIDENCE_DIR, EXIT_OK, write_evidence
from bench.gpucheck.judge import STEPS_JSON, StepResult, load_runs
from bench.launchers.base import PROJECT_ROOT

EXIT_INPUT, EXIT_INTERRUPTED = 2, 130


@dataclass(frozen=True)
class Step:
    name: str
    sweep: str  # the sweep name its runs are recorded under
    what: str
    overrides: tuple[str, ...]
    budget_s: float  # its own share; with what earlier steps left unused, past it the step is stopped (its
    # runs cancelled) and the check fails


# Budgets (they add up to TOTAL_BUDGET_S): each step's slowest time in the GPU evidence plus about 10%, an
# empirical figure (benchmarks/evidence/README.md, "Step budgets"). The later steps' plans run on the CPU
# while the smoke step has the GPU (prewarm), so their sweeps plan from the cache. The least predictable
# step goes last, so an overrun costs only its rows, and a step may also use what the steps before it left.
SMOKE_ONE_RANK = ("+sweep=smoke", "axes.nodes=[1]", "axes.gpus_per_node=[1]", "nccl.nodes=[1]",
                  "nccl.gpus_per_node=[1]")
STEPS = (
    Step("smoke", "smoke", "the smoke sweep's one-rank runs (four precisions with AC full; the all-reduce "
         "probe) on the GPU with NCCL", (*SMOKE_ONE_RANK, "axes.activation_checkpointing=[full]"), 150),
    Step("memory", "gpucheck_memory", "six configurations of llama3_2_1b (AC none/full/selective_op, "
         "bf16_mixed/fp32, CPU offload): device peak beside the plan's fake-tensor peak",
         ("+sweep=gpucheck_memory",), 185),
    Step("mfu", "gpucheck_mfu", "llama3_2_1b, one GPU, FULL_SHARD, bf16_mixed at seq 2048/4096 without AC "
         "and at 2048 with AC full, at the largest micro batch that fits; then compiled, bf16 and Float8",
         ("+sweep=gpucheck_mfu",), 205),
)


# ---------------------------------------------------------------------------------------------- running

def _echo_lines(stream: Any, log: Path, prefix: str) -> None:
    with open(log, "w") as f:
        for line in stream:
            f.write(line)
            f.flush()
            print(f"[{prefix}] {line}", end="", flush=True)


# Cores the prewarming plans leave to the GPU step running beside them (its launch, the worker's Python that
# feeds the GPU, NCCL's and the NVML sampler's threads), so that planning does not slow a host-bound step
# (benchmarks/evidence/README.md, "Step budgets").
GPU_STEP_CORES = 4


def prewarm_workers(steps: int, cores: int | None = None) -> int:
    """Fake-tensor workers of each of `steps` plans prewarmed side by side: the cores left beside the GPU
    step, shared evenly."""
    return max(1, ((cores or os.cpu_count() or 2) - GPU_STEP_CORES) // max(1, steps))


def prewarm(steps: tuple[Step, ...], plans: Path, common: list[str]) -> dict[str, subprocess.Popen]:
    """Each step's plan as a dry run on the CPU (fake-tensor memory, micro batch search), started now while
    the GPU runs an earlier step: the step's own sweep then plans from the memory cache in seconds."""
    plans.mkdir(parents=True, exist_ok=True)
    workers = f"memory.workers={prewarm_workers(len(steps))}"  # the last memory.workers override wins
    started = {}
    for step in steps:
        with open(plans / f"{step.name}.log", "w") as log:  # the child holds its own copy
            started[step.name] = subprocess.Popen(
                [sys.executable, "-m", "bench.sweep", *step.overrides, f"results_root={plans}", *common,
                 workers, "--dry-run"], cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT)
    return started


def run_step(step: Step, root: Path, common: list[str],
             planning: subprocess.Popen | None = None) -> StepResult:
    """One sweep as its own process (the launch path every study takes), its output echoed and kept in
    <root>/<step>.log; stopped with SIGINT at its budget, which cancels its runs as Ctrl-C would. Its time
    starts before the wait for its prewarmed plan (planning), which is the step's planning."""
    log = root / f"{step.name}.log"
    argv = [sys.executable, "-m", "bench.sweep", *step.overrides, f"results_root={root}", *common]
    print(f"gpucheck: {step.name}: {step.what} (budget {step.budget_s:.0f} s)", flush=True)
    start = time.monotonic()
    if planning is not None:
        try:
            planning.wait(timeout=step.budget_s / 2)
        except subprocess.TimeoutExpired:  # the sweep measures what the dry run has not cached yet
            planning.kill()
    proc = subprocess.Popen(argv, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    echo = threading.Thread(target=_echo_lines, args=(proc.stdout, log, step.name), daemon=True)
    echo.start()
    code: int | None
    try:
        code = proc.wait(timeout=step.budget_s)
    except subprocess.TimeoutExpired:
        code = None
        _stop(proc, interrupt=True)
    except KeyboardInterrupt:  # the sweep got the terminal's SIGINT too: let it cancel its runs
        _stop(proc, interrupt=False)
        raise
    finally:
        echo.join(timeout=10)
    elapsed = time.monotonic() - start
    print(f"gpucheck: {step.name}: {elapsed:.0f} s of its {step.budget_s:.0f} s budget"
          + ("" if code is not None else " (stopped at its budget)"), flush=True)
    return StepResult(step.name, step.budget_s, elapsed, code, str(log))


def _stop(proc: subprocess.Popen, interrupt: bool) -> None:
    """SIGINT (the sweep cancels its runs and writes its table), then SIGKILL if it does not end."""
    if interrupt and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def common_overrides(gpu_key: str, memory_gib: float | None) -> list[str]:
    """What every step tells the sweep about this machine: its GPU (peaks, FP8, memory pruning) and the
    cores that measure memory on fake tensors side by side."""
    workers = max(2, min(8, (os.cpu_count() or 2) // 2))
    out = [f"cluster.gpu={gpu_key}", f"memory.workers={workers}"]
    if memory_gib:
        out.append(f"cluster.gpu_memory_gib={memory_gib:.1f}")
    return out


# ---------------------------------------------------------------------------------------------- main

def measure(root: Path, steps: tuple[Step, ...] = STEPS) -> int | None:
    """Run every step on this machine's GPU; None when there is none (nothing measured)."""
    gpus, name = local_gpus(), local_gpu_name()
    if not gpus:
        print("gpucheck: no CUDA GPU on this machine (CUDA_VISIBLE_DEVICES / nvidia-smi -L list none): "
              "nothing measured")
        return None
    spec = gpu_spec(name or "")
    if spec is None:
        raise ValueError(f"GPU {name!r} is not in bench/core/hardware.py (known: {', '.join(GPUS)}): add "
                         "its datasheet row first, or there is no peak to check MFU against")
    root.mkdir(parents=True, exist_ok=True)
    common = common_overrides(spec.name, local_gpu_memory_gib())
    print(f"gpucheck: {name} ({spec.name}), {len(gpus)} GPU(s) visible; runs under {root}", flush=True)
    results: list[StepResult] = []
    with tempfile.TemporaryDirectory(prefix="gpucheck-plans-") as plans:
        planning = prewarm(steps[1:], Path(plans), common)
        spare = 0.0  # what the steps so far left of their budgets: the next step may use it
        try:
            for step in steps:  # recorded after each step: a command killed later keeps the earlier times
                allowed = replace(step, budget_s=step.budget_s + spare)
                results.append(run_step(allowed, root, common, planning.get(step.name)))
                spare = max(0.0, allowed.budget_s - results[-1].elapsed_s)
                rundir.write_json(root / STEPS_JSON, [asdict(r) for r in results])
        except KeyboardInterrupt:  # inside a step: what finished before it is recorded already
            return EXIT_INTERRUPTED
        finally:
            for proc in planning.values():
                proc.kill()
                proc.wait()
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpucheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path, metavar="RESULTS_ROOT",
                        help="render the evidence of runs already made there; run nothing")
    parser.add_argument("--results-root", type=Path, default=None,
                        help="where the steps' sweeps write (default results/gpucheck-<date-time>)")
    parser.add_argument("--out", type=Path, default=EVIDENCE_DIR,
                        help="evidence folder (default: %(default)s)")
    args = parser.parse_args(argv)
    command = "python -m bench.gpucheck" + (f" --from {args.source}" if args.source else "")
    root = args.source or args.results_root or (
        PROJECT_ROOT / "results" / f"gpucheck-{dt.datetime.now():%Y%m%d-%H%M%S}")
    try:
        if args.source is not None and not args.source.is_dir():
            raise ValueError(f"--from {args.source}: not a directory")
        code = measure(root) if args.source is None else EXIT_OK
        if code is None:  # no GPU: nothing measured, nothing to render
            return EXIT_OK
        if code == EXIT_INTERRUPTED and not load_runs(root):
            return code
        status, _ = write_evidence(root, args.out, command)
        return code if code == EXIT_INTERRUPTED else status
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT

