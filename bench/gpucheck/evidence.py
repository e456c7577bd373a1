"""The GPU evidence files: what bench.gpucheck's checks (bench/gpucheck/judge.py) found, kept as
`<gpu>_torch-<version>_<date>.{md,json}` in benchmarks/evidence/ (the checks, the steps' times, and the
runs' throughput, memory, prediction and NVML tables), and the results table of such a folder read back as
the specs its runs ran (`table_runs`: what the benchmarks and the memory tests measure again).
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import re
import statistics
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary
from bench.gpucheck.judge import (
    Check,
    StepResult,
    all_checks,
    load_runs,
    load_steps,
    mfu_rows,
    on_gpu,
    rank_max,
    train_runs,
)
from bench.launchers.base import PROJECT_ROOT

EVIDENCE_DIR = PROJECT_ROOT / "benchmarks" / "evidence"
EXIT_OK, EXIT_FAILED = 0, 1
SHOWN_FAILURES = 5  # per check on the terminal; the evidence file lists every one


def table_runs(results_csv: Path) -> list[tuple[RunSpec, dict[str, str]]]:
    """The training runs that ended ok in a results table (a sweep's results.csv, or its copy in an evidence
    folder): each as the spec it ran (its run_id the table's) and its row, as text. A field added after the
    table was written takes its default (ADDED_DEFAULTS: left out of the run id there too)."""
    typed = {"int": int, "bool": lambda text: text == "True"}
    with open(results_csv) as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok" and r["kind"] == "train"]
    return [(RunSpec(**{f.name: typed.get(f.type, str)(r[f.name]) for f in fields(RunSpec) if f.name in r}),
             r) for r in rows]


def _f(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _options(s: RunSummary) -> str:
    spec = s.spec
    parts = [spec.precision, f"AC {spec.activation_checkpointing}", f"seq {spec.seq_len}",
             f"mb {spec.micro_batch}"]
    parts += ["compile"] if spec.compile else []
    parts += [f"offload {spec.offload}"] if spec.offload != "none" else []
    return ", ".join(parts)


def _error(pred: float | None, measured: float | None) -> str:
    return f"{measured / pred - 1:+.1%}" if pred and measured else "-"


def render_markdown(meta: dict[str, Any], checks: list[Check], runs: list[RunSummary],
                    steps: list[StepResult]) -> str:
    lines = [f"# GPU evidence: {meta['gpu']}, torch {meta['torch']}, {meta['date']}", "",
             f"Made by `{meta['command']}` (bench/gpucheck/check.py) at git {meta['git_rev'] or '?'}; "
             "runs under "
             f"`{meta['results_root']}`. Verdict: **{meta['verdict']}**.", "", "## Checks", ""]
    lines += _table(["check", "threshold", "measured", "verdict"],
                    [[c.name, c.threshold, c.measured, c.verdict] for c in checks])
    for c in checks:
        lines += [f"- {c.name}: {line}" for line in c.failures]
    lines += ["", "## Steps", ""]
    lines += _table(["step", "elapsed s", "budget s", "sweep exit"],
                    [[r.name, f"{r.elapsed_s:.0f}", f"{r.budget_s:.0f}",
                      "stopped at budget" if r.returncode is None else str(r.returncode)] for r in steps])
    lines += ["## Throughput: llama3_2_1b on one GPU (MFU against the dense BF16 peak)", ""]
    lines += _table(["options", "micro batch", "tokens/s/GPU", "TFLOPS/GPU", "MFU", "compile s", "status"],
                    [[_options(s), str(s.spec.micro_batch), _f(s.tokens_per_s_per_gpu, ",.0f"),
                      _f(s.tflops_per_gpu, ".1f"), _f(s.mfu, ".3f"), _f(s.compile_s, ".1f"), s.status]
                     for s in mfu_rows(runs)])
    lines += ["## Memory: the plan's fake-tensor peak beside torch.cuda.max_memory_allocated", ""]
    lines += _table(["run", "options", "predicted GiB", "measured GiB", "error", "reserved/alloc",
                     "NVML - reserved GiB"],
                    [[s.sweep, _options(s), _f(s.pred_mem_gib, ".2f"), _f(s.mem_peak_alloc_gib, ".2f"),
                      _error(s.mem_peak_alloc_gib, s.pred_mem_gib),
                      _f(s.mem_peak_reserved_gib / s.mem_peak_alloc_gib, ".3f"),
                      _f((s.nvml_mem_used_gib or 0) - s.mem_peak_reserved_gib, ".2f")
                      if s.nvml_mem_used_gib and s.mem_peak_reserved_gib else "-"]
                     for s in train_runs(runs) if s.mem_peak_alloc_gib])
    lines += ["## Performance model (bench/predict/perf.py): predicted before launch beside measured", "",
              prediction_sentence(runs), ""]
    lines += _table(["run", "model", "options", "pred tokens/s/GPU", "tokens/s/GPU", "error", "pred MFU",
                     "MFU", "bound"],
                    [[s.sweep, s.spec.model, _options(s), _f(s.pred_tokens_per_s_per_gpu, ",.0f"),
                      _f(s.tokens_per_s_per_gpu, ",.0f"),
                      _error(s.pred_tokens_per_s_per_gpu, s.tokens_per_s_per_gpu), _f(s.pred_mfu, ".3f"),
                      _f(s.mfu, ".3f"), s.pred_bound or "-"] for s in train_runs(runs)])
    lines += ["## NVML during each run (means over the run's samples; memory: the maximum; energy over the "
              "timed steps)", ""]
    lines += _table(["run", "model", "options", "power W", "power limit W", "util %", "used GiB",
                     "total GiB", "J/token"],
                    [[s.sweep, s.spec.model, _options(s), _f(s.nvml_power_w, ".0f"),
                      _f(rank_max(s, "nvml_power_limit_w"), ".0f"), _f(s.nvml_util_pct, ".0f"),
                      _f(s.nvml_mem_used_gib, ".1f"), _f(rank_max(s, "nvml_mem_total_gib"), ".1f"),
                      _f(s.energy_j_per_token, ".4g")]
                     for s in train_runs(runs)])
    return "\n".join(lines)


def prediction_sentence(runs: list[RunSummary]) -> str:
    """How far the model's tokens/s/GPU was from the GPU runs (no threshold: the model's first check on a
    GPU of ours, its constants fitted to published rows)."""
    errors = [s.tokens_per_s_per_gpu / s.pred_tokens_per_s_per_gpu - 1 for s in train_runs(runs)
              if on_gpu(s) and s.tokens_per_s_per_gpu and s.pred_tokens_per_s_per_gpu]
    if not errors:
        return "No GPU run has both a prediction and a measurement."
    return (f"Measured tokens/s/GPU against the prediction: median {statistics.median(errors):+.1%}, "
            f"median |error| {statistics.median(abs(e) for e in errors):.1%}, over {len(errors)} GPU runs.")


RUN_COLUMNS = ("sweep", "status", "error", "device_name", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
               "compile_s", "pred_tokens_per_s_per_gpu", "pred_mfu", "pred_bound", "pred_mem_gib",
               "pred_mem_source", "mem_peak_alloc_gib", "mem_peak_reserved_gib", "nvml_mem_used_gib",
               "nvml_util_pct", "nvml_power_w", "energy_j_per_token", "energy_source", "torch_version")


def evidence_json(meta: dict[str, Any], checks: list[Check], runs: list[RunSummary],
                  steps: list[StepResult]) -> dict[str, Any]:
    return {**meta, "checks": [asdict(c) for c in checks], "steps": [asdict(r) for r in steps],
            "runs": [{"label": s.spec.label, "spec": s.spec.to_dict(),
                      **{k: getattr(s, k) for k in RUN_COLUMNS},
                      "nvml_power_limit_w": rank_max(s, "nvml_power_limit_w"),
                      "backend": s.extra.get("backend")} for s in runs]}


def evidence_name(gpu: str, torch: str, date: str) -> str:
    """A file name the device tool brings back (letters, digits, '.', '_', '-')."""
    def slug(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")
    return f"{slug(gpu)}_torch-{slug(torch)}_{date}"


def free_name(out_dir: Path, name: str, results_root: str) -> str:
    """name, or name-2, -3 ...: a second run on one GPU on one day does not overwrite the first's evidence;
    rendering the same results root again (--from) rewrites its own file."""
    n, candidate = 1, name
    while (out_dir / f"{candidate}.json").exists():
        try:
            if json.loads((out_dir / f"{candidate}.json").read_text()).get("results_root") == results_root:
                break
        except ValueError:
            pass  # unreadable: not ours to overwrite
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def write_evidence(root: Path, out_dir: Path, command: str) -> tuple[int, list[Path]]:
    """Check the runs under root and write the evidence; (exit status, files written)."""
    runs, steps = load_runs(root), load_steps(root)
    if not runs:
        raise ValueError(f"no runs under {root}")
    checks = all_checks(runs, steps)
    gpu_run = next((s for s in runs if on_gpu(s)), runs[0])
    started = sorted(s.started_at for s in runs if s.started_at)
    failed = [c for c in checks if c.passed is False]
    meta = {"gpu": gpu_run.device_name or "unknown", "torch": gpu_run.torch_version or "unknown",
            "date": (started[-1][:10] if started else dt.date.today().isoformat()),
            "git_rev": gpu_run.git_rev, "results_root": str(root), "command": command,
            "verdict": "every check holds" if not failed else f"{len(failed)} check(s) failed"}
    out_dir.mkdir(parents=True, exist_ok=True)
    name = free_name(out_dir, evidence_name(meta["gpu"], meta["torch"], meta["date"]), str(root))
    md, js = out_dir / f"{name}.md", out_dir / f"{name}.json"
    rundir.atomic_write_text(md, render_markdown(meta, checks, runs, steps) + "\n")
    rundir.write_json(js, evidence_json(meta, checks, runs, steps))
    for c in checks:
        print(f"{c.verdict:>10}  {c.name}: {c.measured}  [{c.threshold}]")
        for line in c.failures[:SHOWN_FAILURES]:
            print(f"{'':>10}  FAILED {c.name}: {line}")
        if len(c.failures) > SHOWN_FAILURES:
            print(f"{'':>10}  ... and {len(c.failures) - SHOWN_FAILURES} more (every one in {md.name})")
    print(f"evidence: {md} and {js.name}")
    return (EXIT_FAILED if failed else EXIT_OK), [md, js]
