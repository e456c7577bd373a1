"""`python -m bench.sweep +sweep=NAME [overrides] [--dry-run] [--rerun-failed] [--force] [--cfg]`

Composes sweeps/ with Hydra, validates everything, takes the sweep dir's lock, writes the plan, then
launches (or, with --dry-run, renders every submission and stops).

Exit status: 0 every planned run ended ok or infeasible; 1 some run did not (the table and everything
finished are still written); 130 interrupted; 2 bad configuration or a sweep dir in use (one line on
stderr, nothing launched); 3 the preflight named a node (bench/preflight.py; nothing launched); 4 the
results directory's filesystem is full (one line naming it and the space a write needed; runs in flight
cancelled, every finished run kept, the sweep dir's lock released: free space and run it again).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from bench import preflight
from bench.core import config_doc, faults, rundir
from bench.core.config import EXIT_CONFIG, ConfigError, SweepConfig
from bench.core.load_config import from_dict
from bench.launchers import BUILT_IN, launcher_sections
from bench.launchers.base import Launcher, Placement
from bench.predict.calibration_file import study_predictor
from bench.predict.cost import plan_cost
from bench.predict.memory import (
    CUDA_CONTEXT_GIB,
    FRAGMENTATION,
    MEASURE_OFF,
    NCCL_GIB_PER_COMMUNICATOR,
    MemoryPlanner,
)
from bench.predict.perf import Predictor
from bench.run import schedule
from bench.run.runner import RunOptions, execute
from bench.study.answer import format_answer, predicted_split
from bench.study.compose import available_sweeps, compose, make_launcher
from bench.study.plan import PlannedRun, expand

FLAGS = {"--dry-run": "dry_run=true", "--rerun-failed": "rerun_failed=true", "--force": "force=true"}
EXIT_OK, EXIT_RUN_FAILED, EXIT_INTERRUPTED = 0, 1, 130  # and EXIT_CONFIG (2), bench.core.config's
EXIT_NO_SPACE = 4  # the results directory's filesystem is full (bench.core.rundir.NoSpace)
GOOD_STATUSES = ("ok", "infeasible")


PLAN_MEMORY = (f"memory per GPU in GiB: the peak measured on fake tensors (>= where not measured: the lower "
               f"bound of parameters, gradients and AdamW state), and what the run needs (peak x "
               f"{1 + FRAGMENTATION:g} allocator, + {CUDA_CONTEXT_GIB:g} CUDA context, + "
               f"{NCCL_GIB_PER_COMMUNICATOR:g} per NCCL communicator); host: offloaded state per GPU")


def _gib(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


PLAN_PERF = ("predicted (bench/predict/perf.py): tokens/s per GPU with a ~90% interval (the study's own "
             "runs' where they calibrate it, else how far published rows on as many nodes lie from the "
             "model: perf.PUBLISHED_SPREAD), MFU, scaling efficiency against the smallest planned node "
             "count of the same configuration, and what bounds the step")


def _perf_cells(p: PlannedRun) -> list[str]:
    perf = p.perf
    if perf is None or not p.feasible:
        return ["-"] * 4
    at_most = "<=" if perf.unmodeled else ""  # the step a floor (perf.unmodeled): these are ceilings
    tokens = f"{at_most}{perf.tokens_per_s_per_gpu:,.0f}"
    if perf.interval:  # its ~90% interval (perf.Prediction.interval)
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
    rundir.atomic_write_text(sweep_dir / rundir.PLAN_CSV,
                             pd.DataFrame([p.row() for p in plan]).to_csv(index=False))


def render_all(launcher: Launcher, plan: list[PlannedRun], sweep_dir: Path, admit: bool) -> None:
    """Render every run once before anything is measured, written or launched (rendering is pure and
    cheap), and let the scheduler judge it where it can without running it (Kubernetes server-side dry
    run): a value only a launcher can judge (a path outside the container's mounts, a manifest the CRD or a
    webhook refuses) is one ConfigError now, not after minutes of memory measurement or as a launch_error
    per run later. Infeasible runs are judged too: a bigger cluster or GPU may fit them."""
    for p in plan:
        submission = launcher.render(p.spec, rundir.run_dir(sweep_dir, p.spec))
        if admit:
            launcher.admit(submission)


def dry_run(launcher: Launcher, placement: Placement, plan: list[PlannedRun], sweep_dir: Path) -> None:
    """Render every feasible run's submission where its next attempt would write it; launch nothing."""
    for p in plan:
        if not p.feasible:
            continue
        run_dir = rundir.run_dir(sweep_dir, p.spec)
        rundir.write_spec(run_dir, p.spec)
        attempt_dir = rundir.attempt_dir(run_dir, len(rundir.read_ledger(run_dir)) + 1)
        seconds = schedule.job_of(p, placement).seconds
        rundir.write_submission(attempt_dir, launcher.render(p.first_spec, attempt_dir, seconds))


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
    if any(a in ("-h", "--help") for a in args):  # the usage, the sweeps, every configuration key
        keys = config_doc.text(launcher_sections())
        print(__doc__.strip() + "\n\nsweeps: " + ", ".join(available_sweeps()) + "\n\n" + keys)
        return 0
    if "--help-config" in args:  # the keys alone (every launcher's); --markdown: docs/study.md's reference
        print(config_doc.markdown(launcher_sections(list(BUILT_IN))) if "--markdown" in args
              else config_doc.text(launcher_sections()) + "\n", end="")
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
        cfg = from_dict(raw, launcher_sections())
        faults.rules()  # the test hook's, if any: a bad rule is one line before anything is written
        started = time.perf_counter()
        launcher = make_launcher(cfg)
        placement = launcher.placement(cfg)  # where and how the runs run: decided here, once
        sweep_dir = Path(cfg.results_root) / cfg.sweep_name
        launching = placement.launches and not cfg.dry_run
        listed = None
        if launching:
            launcher.preflight()
            listed = preflight.nodes_to_check(cfg, placement, launcher)
        # every value judged before measuring
        render_all(launcher, expand(cfg, placement=placement), sweep_dir, admit=launching)
        _make_sweep_dir(sweep_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        with rundir.locked(sweep_dir):
            memory = MemoryPlanner(cfg)
            predictor, calibration = study_predictor(cfg.cluster, placement, cfg.axes.model, sweep_dir)
            try:
                plan = expand(cfg, memory, predictor, placement)
            finally:
                memory.close()  # its measuring processes: nothing measures after the plan
            print(f"planned in {time.perf_counter() - started:.1f} s; {memory.summary()}")
            if calibration:
                print(calibration)
            return _plan_and_launch(cfg, placement, plan, predictor, launcher, sweep_dir, yaml_text, listed)
    except rundir.SweepDirBusy as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except rundir.NoSpace as e:  # the lock is released: `locked` has closed its file
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NO_SPACE
    except KeyboardInterrupt:  # while measuring memory (the runs' own Ctrl-C is handled by the runner)
        print("interrupted while measuring memory: nothing was launched; measured configurations are cached",
              file=sys.stderr)
        return EXIT_INTERRUPTED


def run_options(cfg: SweepConfig, placement: Placement) -> RunOptions:
    """What the runner reads of this sweep: its options, its launcher's settings and placement, and what
    its predictor is refitted for (the cluster, the models)."""
    return RunOptions(sweep_name=cfg.sweep_name or "", launcher=cfg.launcher, placement=placement,
                      cluster=cfg.cluster, models=tuple(cfg.axes.model), search=cfg.micro_batch_search,
                      tolerance=cfg.preflight.tolerance, force=cfg.force, rerun_failed=cfg.rerun_failed,
                      progress=cfg.progress)


def _plan_and_launch(cfg: SweepConfig, placement: Placement, plan: list[PlannedRun], predictor: Predictor,
                     launcher: Launcher, sweep_dir: Path, yaml_text: str,
                     listed: preflight.Listed | None = None) -> int:
    """Write the plan and say what it holds, then launch it: the preflight first where the placement asks
    (on the nodes `listed` before anything was written), then the runner. Each layer is handed what it
    reads, from the top layer down."""
    write_plan(sweep_dir, plan, yaml_text)
    options, mode = run_options(cfg, placement), preflight.mode_of(cfg.preflight.mode, placement)
    nodes = preflight.nodes_of(cfg, placement) if mode != "off" else None
    feasible = [p for p in plan if p.feasible]
    held = schedule.makespan_line(cfg.cluster.name, placement, plan, cfg.launcher.probes_alone)
    dry = cfg.dry_run or not placement.launches
    split = predicted_split(cfg.cluster, plan, predictor) if dry else ""
    answer_text = format_answer(cfg.study, cfg.cluster.name, cfg.cluster.price_per_hour, plan)
    cost = plan_cost(feasible, cfg.cluster, cfg.launcher.timeout_s, placement)
    note = launcher.plan_note([p.first_spec for p in feasible])
    print(f"sweep {cfg.sweep_name}: {len(plan)} runs planned ({len(plan) - len(feasible)} infeasible) on "
          f"{cfg.cluster.name} with launcher {launcher.name} -> {sweep_dir}")
    print("\n".join(line for line in (cost.line(cfg.cluster.name), held, answer_text, note) if line))
    if dry:
        print("\n".join(line for line in (format_plan(plan), split) if line))
        dry_run(launcher, placement, plan, sweep_dir)
        print(f"dry run: submissions written under {sweep_dir / rundir.RUNS_DIR}/*/"
              f"{rundir.ATTEMPT_PREFIX}*/{rundir.SUBMISSION_DIR}/")
        return EXIT_OK
    if nodes is not None:
        verdict = preflight.check(nodes, launcher, sweep_dir, out=sys.stdout, listed=listed)
        print(preflight.format_verdict(verdict))
        if preflight.problems(verdict) and mode == "on":
            print(preflight.refusal(verdict, launcher), file=sys.stderr)
            return preflight.EXIT_REFUSED
    counts = execute(options, plan, launcher, sweep_dir)
    interrupted = counts.pop("interrupted")
    print("done: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
          f"; table: {sweep_dir / rundir.RESULTS_CSV}; report: python -m analysis.report {sweep_dir}")
    if interrupted:
        print("interrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _exit_status(sweep_dir, plan)

if __name__ == "__main__":
    sys.exit(main())
