"""`python -m bench.sweep +sweep=NAME [overrides] [--dry-run] [--rerun-failed] [--force] [--cfg]`

Composes sweeps/ with Hydra, validates everything, takes the sweep dir's lock, writes the plan, then
launches (or, with --dry-run, renders every submission and stops).

Exit status: 0 every planned run ended ok or infeasible; 1 some run did not (the table and everything
finished are still written); 130 interrupted; 2 bad configuration or a sweep dir in use (one line on
stderr, nothing launched); 3 the preflight named a node (bench/preflight.py; nothing launched).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from bench import preflight, rundir, schedule
from bench.compose import available_sweeps, compose, make_launcher
from bench.config import EXIT_CONFIG, ConfigError, SweepConfig, from_dict
from bench.predict.cost import plan_cost, startup_of
from bench.predict.memory import (CUDA_CONTEXT_GIB, FRAGMENTATION, MEASURE_OFF, NCCL_GIB_PER_COMMUNICATOR,
                          MemoryPlanner)
from bench.predict.calibrate import study_predictor
from bench.plan import PlannedRun, expand

FLAGS = {"--dry-run": "dry_run=true", "--rerun-failed": "rerun_failed=true", "--force": "force=true"}
EXIT_OK, EXIT_RUN_FAILED, EXIT_INTERRUPTED = 0, 1, 130  # and EXIT_CONFIG (2), bench.config's
GOOD_STATUSES = ("ok", "infeasible")


PLAN_MEMORY = (f"memory per GPU in GiB: the peak measured on fake tensors (>= where not measured: the lower "
               f"bound of parameters, gradients and AdamW state), and what the run needs (peak x "
               f"{1 + FRAGMENTATION:g} allocator, + {CUDA_CONTEXT_GIB:g} CUDA context, + "
               f"{NCCL_GIB_PER_COMMUNICATOR:g} per NCCL communicator); host: offloaded state per GPU")


def _gib(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


PLAN_PERF = ("predicted (bench/predict/perf.py): tokens/s per GPU (with a ~90% interval where the study's own "
             "runs calibrate it), MFU, scaling efficiency against the smallest planned node count of the same "
             "configuration, and what bounds the step")


def _perf_cells(p: PlannedRun) -> list[str]:
    perf = p.perf
    if perf is None or not p.feasible:
        return ["-"] * 4
    at_most = "<=" if perf.unmodeled else ""  # the step a floor (perf.unmodeled): these are ceilings
    tokens = f"{at_most}{perf.tokens_per_s_per_gpu:,.0f}"
    if perf.interval:  # a calibrated prediction: its ~90% interval
        tokens += f" ({perf.interval[0]:,.0f}-{perf.interval[1]:,.0f})"
    return [tokens, f"{at_most}{perf.mfu:.2f}" if perf.mfu is not None else "-",
            f"{p.pred_efficiency:.0%}" if p.pred_efficiency is not None else "-", perf.bound.split("-")[0]]


def format_plan(plan: list[PlannedRun]) -> str:
    rows = [("run", "id", "peak", "need", "host", "tok/s/GPU", "MFU", "eff", "bound", "status")]
    for p in plan:
        m = p.memory
        status = "planned" if p.feasible else f"infeasible: {p.reason}"
        if p.micro_batch_start and p.feasible:
            status += f" (micro batch search from {p.micro_batch_start})"
        if m and m.note and p.feasible and MEASURE_OFF not in m.note:
            status += f" ({m.note})"
        bound = "" if m is None or m.source == "measured" else ">="
        cells = ([bound + _gib(m.gpu_gib), bound + _gib(m.need_gib(p.first_spec)),
                  bound + _gib(m.host_gib) if m.host_gib else "-"] if m else ["-"] * 3)
        rows.append((p.spec.label, p.spec.run_id, *cells, *_perf_cells(p), status))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]),
                        *(c.rjust(w) for c, w in zip(r[2:-1], widths[2:])), r[-1]]) for r in rows]
    networks = sorted({p.perf.network.described for p in plan if p.perf and p.feasible})
    off = [f"memory: not measured ({MEASURE_OFF}): only runs whose state alone cannot fit are pruned"] if any(
        p.memory and MEASURE_OFF in (p.memory.note or "") for p in plan) else []
    return "\n".join([PLAN_MEMORY, *off, PLAN_PERF, *(f"network: {n}" for n in networks), *lines])


def write_plan(sweep_dir: Path, plan: list[PlannedRun], yaml_text: str) -> None:
    import pandas as pd
    rundir.atomic_write_text(sweep_dir / rundir.SWEEP_CONFIG, yaml_text)
    rundir.atomic_write_text(sweep_dir / rundir.PLAN_CSV, pd.DataFrame([p.row() for p in plan]).to_csv(index=False))


def render_all(launcher: Any, plan: list[PlannedRun], sweep_dir: Path, admit: bool) -> None:
    """Render every run once before anything is measured, written or launched (rendering is pure and
    cheap), and let the scheduler judge it where it can without running it (Kubernetes server-side dry
    run): a value only a launcher can judge (a path outside the container's mounts, a manifest the CRD or a
    webhook refuses) is one ConfigError now, not after minutes of memory measurement or as a launch_error
    per run later. Infeasible runs are judged too: a bigger cluster or GPU may fit them."""
    check = getattr(launcher, "admit", None) if admit else None
    for p in plan:
        submission = launcher.render(p.spec, rundir.run_dir(sweep_dir, p.spec))
        if check:
            check(submission)


def dry_run(launcher: Any, plan: list[PlannedRun], sweep_dir: Path) -> None:
    """Render every feasible run's submission where its next attempt would write it; launch nothing."""
    for p in plan:
        if not p.feasible:
            continue
        rd = rundir.run_dir(sweep_dir, p.spec)
        rundir.write_spec(rd, p.spec)
        ad = rundir.attempt_dir(rd, len(rundir.read_ledger(rd)) + 1)
        rundir.write_submission(ad, launcher.render(p.first_spec, ad))


def schedule_line(cfg: SweepConfig, plan: list[PlannedRun]) -> str:
    """Estimated makespan and what the cluster is held for, beside what the runs use."""
    from bench.runner import as_job, node_budget
    jobs = [as_job(cfg, p) for p in plan if p.feasible]
    budget = node_budget(cfg)
    where = f"{budget} node{'' if budget == 1 else 's'} in flight" if budget is not None else "one run at a time"
    if not jobs or any(j.seconds is None for j in jobs):
        return (f"schedule: {where}; no run-time estimate for {cfg.cluster.name} (no prediction without a "
                "named GPU: set cluster.gpu)")
    span = schedule.makespan(jobs, budget, cfg.launcher.probes_alone)
    held = (budget or max(j.nodes for j in jobs)) * span / 3600
    used = sum(j.nodes * (j.seconds or 0) for j in jobs) / 3600
    one_by_one = sum(j.seconds or 0 for j in jobs) / 3600
    return (f"schedule: {where}, estimated makespan {span / 3600:.2f} h (one run at a time: {one_by_one:.2f} h); "
            f"cluster held {held:,.1f} node-hours for {used:,.1f} node-hours of runs ({used / held:.0%} busy)")


def _make_sweep_dir(sweep_dir: Path) -> None:
    """The first write, once everything is validated and before minutes of planning: an unwritable
    results_root is one line now."""
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the sweep dir {sweep_dir}: {e.strerror} (set results_root to a "
                          "writable directory)") from None


def _exit_status(sweep_dir: Path, plan: list[PlannedRun]) -> int:
    """1 if any planned run's current summary is not ok or infeasible (earlier invocations' included)."""
    for p in plan:
        summary = rundir.read_summary(rundir.run_dir(sweep_dir, p.spec))
        if summary is None or summary.status not in GOOD_STATUSES:
            return EXIT_RUN_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip() + "\n\nsweeps: " + ", ".join(available_sweeps()))
        return 0
    show_cfg = "--cfg" in args
    overrides = [FLAGS.get(a, a) for a in args if a != "--cfg"]
    unknown_flags = [a for a in overrides if a.startswith("--")]
    try:
        if unknown_flags:
            raise ConfigError(f"unknown option {unknown_flags[0]}; options: {', '.join(FLAGS)}, --cfg")
        raw, yaml_text = compose(overrides)
        if not raw.get("sweep_name"):
            raise ConfigError("choose a sweep with +sweep=NAME; available: " + ", ".join(available_sweeps()))
        if show_cfg:
            print(yaml_text)
            return 0
        cfg = from_dict(raw)
        started = time.perf_counter()
        launcher = make_launcher(cfg)
        sweep_dir = Path(cfg.results_root) / cfg.sweep_name
        launching = not (cfg.dry_run or cfg.launcher.name == "dryrun")
        if launching and (launcher_check := getattr(launcher, "preflight", None)):
            launcher_check()
        render_all(launcher, expand(cfg), sweep_dir, admit=launching)  # every value judged before measuring
        _make_sweep_dir(sweep_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        with rundir.locked(sweep_dir):
            memory = MemoryPlanner(cfg)
            predictor, calibration = study_predictor(cfg, sweep_dir)
            try:
                plan = expand(cfg, memory, predictor)
            finally:
                memory.close()  # its measuring processes: nothing measures after the plan
            print(f"planned in {time.perf_counter() - started:.1f} s; {memory.summary()}")
            if calibration:
                print(calibration)
            return _plan_and_launch(cfg, plan, launcher, sweep_dir, yaml_text)
    except rundir.SweepDirBusy as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # while measuring memory (the runs' own Ctrl-C is handled by the runner)
        print("interrupted while measuring memory: nothing was launched; measured configurations are cached",
              file=sys.stderr)
        return EXIT_INTERRUPTED


def _plan_and_launch(cfg: SweepConfig, plan: list[PlannedRun], launcher: Any, sweep_dir: Path,
                     yaml_text: str) -> int:
    write_plan(sweep_dir, plan, yaml_text)
    infeasible = sum(not p.feasible for p in plan)
    print(f"sweep {cfg.sweep_name}: {len(plan)} runs planned ({infeasible} infeasible) on {cfg.cluster.name} "
          f"with launcher {cfg.launcher.name} -> {sweep_dir}")
    cost = plan_cost([p for p in plan if p.feasible], cfg.cluster, cfg.launcher.timeout_s,
                     startup_of(cfg.cluster.instance_type, cfg.launcher.name))
    print(cost.line(cfg.cluster.name))
    print(schedule_line(cfg, plan))
    if note := getattr(launcher, "plan_note", None):
        print(note([p.first_spec for p in plan if p.feasible]))
    if cfg.dry_run or cfg.launcher.name == "dryrun":
        print(format_plan(plan))
        dry_run(launcher, plan, sweep_dir)
        print(f"dry run: submissions written under {sweep_dir / rundir.RUNS_DIR}/*/"
              f"{rundir.ATTEMPT_PREFIX}*/{rundir.SUBMISSION_DIR}/")
        return EXIT_OK
    if (mode := preflight.mode_of(cfg)) != "off":
        verdict = preflight.check(cfg, launcher, sweep_dir, out=sys.stdout)
        print(preflight.format_verdict(verdict))
        if (named := preflight.problems(verdict)) and mode == "on":
            more = f" (and {len(named) - 1} more)" if len(named) > 1 else ""
            print(f"error: preflight: {named[0]}{more}; nothing launched: leave the node out "
                  "(\"cluster.slurm.extra_sbatch=['--exclude=NODE']\") or accept it with preflight.mode=warn",
                  file=sys.stderr)
            return preflight.EXIT_REFUSED
    from bench.runner import execute
    counts = execute(cfg, plan, launcher, sweep_dir)
    interrupted = counts.pop("interrupted")
    print("done: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
          f"; table: {sweep_dir / rundir.RESULTS_CSV}; report: python -m analysis.report {sweep_dir}")
    if interrupted:
        print("interrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _exit_status(sweep_dir, plan)


if __name__ == "__main__":
    sys.exit(main())
