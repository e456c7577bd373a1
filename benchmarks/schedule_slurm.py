"""Makespan of a sweep on the real 4-node local Slurm cluster: one run at a time versus side by side.

The equal mix: 8 runs of 1 node, 4 of 2 nodes, 2 of 4 nodes, every worker in the sleep test mode
for SLEEP_S seconds (so the 2 cores do not decide how long a run takes). Each run's real duration is
Slurm's own (StartTime..EndTime in the job-completion log); the lower bound is
max(total node-seconds / 4, longest run) over those durations. Prints the figures and the two ratios it is
held to: concurrent <= 1.15 x bound, concurrent <= 0.5 x sequential. The mix pins every axis of the
smoke sweep it depends on, and the script stops before launching if it no longer plans those 14 runs.

The unequal mix: 24 real trainings of 1, 2 and 4 one-rank nodes (fp32/bf16, AC none/full, seq
128/256, 20 steps: 13-36 s each here), packed by their predicted durations (this machine's CPU, which
slurm_local's nodes are); target <= 1.10 x the lower bound of their real durations.

    scripts/slurm_cluster.sh restart && python benchmarks/schedule_slurm.py [--sleep-s 15]  # a clean cluster
    python benchmarks/schedule_slurm.py --unequal  # the 24-run mix of real trainings, concurrent
    python benchmarks/schedule_slurm.py --compare 3  # launcher.slurm.admission harness against slurm
                                                   # (every run submitted with --time from its prediction,
                                                   # Slurm's backfill packing), both mixes, 3 passes each
    python benchmarks/schedule_slurm.py --quick    # the concurrent pass under each admission, workers
                                                   # sleep 2 s; the unequal mix planned, not run
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core import faults, rundir  # noqa: E402
from bench.core.load_config import from_dict  # noqa: E402
from bench.launchers import launcher_sections  # noqa: E402
from bench.study.plan import expand  # noqa: E402
from bench.sweep import compose  # noqa: E402

SLURM_DIR = Path("/tmp/fsdpbench-slurm")
MIX = ["axes.global_batch=[null]",
       "axes.nodes=[1,2,4]", "axes.precision=[fp32,bf16_mixed]", "axes.seq_len=[32,64,96,128]",
       "axes.sharding=[FULL_SHARD]", "axes.activation_checkpointing=[none]", "axes.gpus_per_node=[2]",
       "axes.compile=[false]", "nccl.enabled=false",
       # 8 x 1 node (2 precisions x 4 lengths), 4 x 2 nodes (bf16 only), 2 x 4 nodes (bf16, 2 lengths)
       "exclude=[{nodes:[2,4],precision:fp32},{nodes:4,seq_len:[32,64]}]",
       "cluster=slurm_local", "launcher=slurm", "launcher.poll_s=0.5", "launcher.slurm.exclusive=true",
       "progress=false", "preflight.mode=off"]  # the schedule's own time, not the nodes' check
RUNS_BY_NODES = {1: 8, 2: 4, 4: 2}  # what the docstring and the lower bound are stated for
UNEQUAL = ["axes.global_batch=[null]", "axes.nodes=[1,2,4]", "axes.gpus_per_node=[1]",
           "axes.precision=[fp32,bf16_mixed]", "axes.activation_checkpointing=[none,full]",
           "axes.seq_len=[128,256]", "axes.sharding=[FULL_SHARD]", "axes.compile=[false]", "exclude=[]",
           "steps=20", "nccl.enabled=false", "cluster=slurm_local", "launcher=slurm", "launcher.poll_s=0.5",
           "launcher.slurm.exclusive=true", "progress=false", "preflight.mode=off"]


def planned_unequal() -> list[float | None]:
    """The unequal mix's estimated run times, as the plan orders and packs them (nothing launched)."""
    from bench.launchers import placement_of
    from bench.run.schedule import job_of
    cfg = from_dict(compose(["+sweep=smoke", *UNEQUAL, "memory.measure=false"])[0], launcher_sections())
    placement = placement_of(cfg)
    return [job_of(p, placement).seconds for p in expand(cfg, placement=placement)]


def sleeping(seconds: int) -> str:
    """Every run sleeps this long instead of training: the test hook's rule (bench/core/faults.py)."""
    return f"[{{match: {{}}, fault: sleep, seconds: {seconds}}}]"


def planned_mix() -> dict[int, int]:
    """Runs of the mix by node count, as the sweep plans them (nothing launched, nothing measured)."""
    cfg = from_dict(compose(["+sweep=smoke", *MIX, "memory.measure=false"])[0], launcher_sections())
    return dict(collections.Counter(p.spec.nodes for p in expand(cfg)))


def slurm_times(sweep_dir: Path) -> list[tuple[int, float, float]]:
    """(nodes, start, end) of every run's job, from the job-completion log."""
    log = (SLURM_DIR / "log" / "jobcomp.log").read_text().splitlines()
    out = []
    for d in rundir.iter_run_dirs(sweep_dir):
        job_id = rundir.read_ledger(d)[-1]["job"]["job_id"]
        line = next(ln for ln in log if f"JobId={job_id} " in ln)
        start, end = (dt.datetime.fromisoformat(re.search(rf"{k}=(\S+)", line).group(1)).timestamp()
                      for k in ("StartTime", "EndTime"))
        out.append((rundir.read_spec(d).nodes, start, end))
    return out


def submissions(sweep_dir: Path) -> tuple[float, list[str]]:
    """Over how many seconds the sweep submitted its jobs (its ledger), and each job's sbatch --time (its
    submission): the harness's admission submits as nodes free up, without one; Slurm's gets all at once."""
    when, limits = [], []
    for d in rundir.iter_run_dirs(sweep_dir):
        attempt = rundir.read_ledger(d)[-1]
        when.append(dt.datetime.fromisoformat(attempt["submitted_at"]).timestamp())
        described = json.loads((rundir.attempt_dir(d, attempt["attempt"]) / rundir.SUBMISSION_DIR
                                / "submission.json").read_text())
        limits += [a.split("=", 1)[1] for a in described["argvs"][0] if a.startswith("--time=")]
    return max(when) - min(when), limits


def run(results: Path, sleep_s: int, *extra: str, mix: list[str] | None = None,
        ) -> tuple[float, list[tuple[int, float, float]]]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={results}",
                           *(mix or MIX), *extra], cwd=ROOT, capture_output=True, text=True,
                          env=faults.environ("" if mix else sleeping(sleep_s)))
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1):  # sleep-mode runs have no summary: 1 is expected
        sys.exit(f"sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, slurm_times(results / "smoke")


def makespan(jobs: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Slurm's makespan of the jobs and its lower bound: max(node-seconds / 4 nodes, longest run)."""
    span = max(e for _, _, e in jobs) - min(s for _, s, _ in jobs)
    return span, max(sum(n * (e - s) for n, s, e in jobs) / 4, max(e - s for _, s, e in jobs))


ADMISSIONS = {"harness": [], "slurm": ["launcher.slurm.admission=slurm"]}  # launcher.slurm.admission


def ratio(results: Path, sleep_s: int, mix: list[str] | None, admission: str) -> tuple[float, float, float]:
    """One pass of a mix under one admission: (Slurm's makespan / lower bound, makespan, bound)."""
    _, jobs = run(results, sleep_s, *ADMISSIONS[admission], mix=mix)
    span, bound = makespan(jobs)
    return span / bound, span, bound


def compare(repeats: int, sleep_s: int, only: str | None = None) -> None:
    """Both admissions on the equal mix (every run sleeps alike) and the unequal one (real trainings), each
    `repeats` times, alternating, so that the machine's load falls on both alike; `only` one of the mixes."""
    mixes = {name: mix for name, mix in (("equal", None), ("unequal", UNEQUAL)) if only in (None, name)}
    got: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for mix_name, mix in mixes.items():
                for admission in ADMISSIONS:
                    r, span, bound = ratio(Path(tmp) / f"{mix_name}-{admission}-{i}", sleep_s, mix, admission)
                    got[(mix_name, admission)].append(r)
                    print(f"  {mix_name:>7} mix, admission={admission:<7} pass {i + 1}: makespan "
                          f"{span:6.1f} s, bound {bound:6.1f} s: {r:.2f}x", flush=True)
    print(f"makespan / lower bound, {repeats} passes each (median; target <= 1.10):")
    for (mix_name, admission), ratios in got.items():
        print(f"  {mix_name:>7} mix, admission={admission:<7}: median {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{r:.2f}' for r in ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep-s", type=int, default=15, help="how long each worker sleeps")
    parser.add_argument("--quick", action="store_true", help="the concurrent pass alone, workers sleep 2 s")
    parser.add_argument("--unequal", action="store_true", help="the 24 unequal real trainings instead")
    parser.add_argument("--compare", type=int, metavar="N", default=0,
                        help="both admissions (harness, slurm) on both mixes, N passes each")
    parser.add_argument("--mix", choices=("equal", "unequal"), help="--compare on this mix alone")
    args = parser.parse_args()
    sleep_s = 2 if args.quick else args.sleep_s
    estimates = planned_unequal()
    if len(estimates) != 24 or any(e is None for e in estimates):
        unknown = sum(e is None for e in estimates)
        sys.exit(f"the unequal mix plans {len(estimates)} runs, {unknown} without an estimate: it needs 24, "
                 "each with its predicted duration")
    print(f"unequal mix: 24 runs planned, estimated {min(estimates):.0f}-{max(estimates):.0f} s each")
    if (mix := planned_mix()) != RUNS_BY_NODES:
        sys.exit(f"the mix plans {mix} runs by node count, not {RUNS_BY_NODES}: pin the smoke sweep's "
                 "new axes")
    if args.compare:
        compare(args.compare, sleep_s, args.mix)
        return
    if args.unequal:
        with tempfile.TemporaryDirectory() as tmp:
            wall, jobs = run(Path(tmp) / "unequal", 0, mix=UNEQUAL)
        span, bound = makespan(jobs)
        durations = sorted(e - s for _, s, e in jobs)
        print(f"unequal: {len(jobs)} runs of {durations[0]:.0f}-{durations[-1]:.0f} s, sweep wall "
              f"{wall:.1f} s, Slurm makespan {span:.1f} s, lower bound {bound:.1f} s: {span / bound:.2f}x "
              "(target <= 1.10)")
        return
    passes = ([("concurrent", []), ("slurm-packed", ADMISSIONS["slurm"])] if args.quick
              else [("sequential", ["launcher.max_nodes=1"]), ("concurrent", []),
                    ("slurm-packed", ADMISSIONS["slurm"])])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        spreads = {}
        for name, extra in passes:
            results[name] = run(Path(tmp) / name, sleep_s, *extra)
            spreads[name] = submissions(Path(tmp) / name / "smoke")
    print(f"mix: {sum(mix.values())} runs (8 x 1 node, 4 x 2, 2 x 4), workers sleep {sleep_s} s, "
          "4-node Slurm")
    for name, (wall, jobs) in results.items():
        durations = sorted(e - s for _, s, e in jobs)
        span, bound = makespan(jobs)
        spread, limits = spreads[name]
        shown = ", ".join(sorted(set(limits))) or "-"
        print(f"{name:>12}: sweep wall {wall:6.1f} s, Slurm makespan {span:6.1f} s, "
              f"median run {durations[len(durations) // 2]:.0f} s, lower bound {bound:6.1f} s; jobs "
              f"submitted over {spread:.1f} s, {len(limits)} with --time ({shown} min)")
    packed = {name: makespan(results[name][1]) for name in ("concurrent", "slurm-packed")}
    line = "; ".join(f"{name} / lower bound = {span / bound:.2f}"
                     for name, (span, bound) in packed.items()) + " (target <= 1.15)"
    if "sequential" in results:
        line += ("; concurrent / sequential wall = "
                 f"{results['concurrent'][0] / results['sequential'][0]:.2f} (target <= 0.5)")
    print(line)


if __name__ == "__main__":
    main()
