"""Makespan of a sweep on the real 4-node local Slurm cluster: one run at a time versus side by side.

The mix of issue 17: 8 runs of 1 node, 4 of 2 nodes, 2 of 4 nodes, every worker in the sleep test mode
for SLEEP_S seconds (so the 2 cores do not decide how long a run takes). Each run's real duration is
Slurm's own (StartTime..EndTime in the job-completion log); the lower bound is
max(total node-seconds / 4, longest run) over those durations. Prints the figures and the two ratios the
issue sets: concurrent <= 1.15 x bound, concurrent <= 0.5 x sequential.

    scripts/slurm_cluster.sh start && python benchmarks/schedule_slurm.py [SLEEP_S]
"""
from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rundir  # noqa: E402

SLURM_DIR = Path("/tmp/fsdpbench-slurm")
SLEEP_S = int(sys.argv[1]) if len(sys.argv) > 1 else 15
MIX = ["axes.nodes=[1,2,4]", "axes.precision=[fp32,bf16_mixed]", "axes.seq_len=[32,64,96,128]",
       "axes.sharding=[FULL_SHARD]", "axes.activation_checkpointing=[none]", "nccl.enabled=false",
       # 8 x 1 node (2 precisions x 4 lengths), 4 x 2 nodes (bf16 only), 2 x 4 nodes (bf16, 2 lengths)
       "exclude=[{nodes:[2,4],precision:fp32},{nodes:4,seq_len:[32,64]}]",
       f"faults=[{{match:{{}},fault:sleep,seconds:{SLEEP_S}}}]", "cluster=slurm_local", "launcher=slurm",
       "launcher.poll_s=0.5", "cluster.slurm.exclusive=true", "progress=false"]


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


def run(results: Path, *extra: str) -> tuple[float, list[tuple[int, float, float]]]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={results}",
                           *MIX, *extra], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1):  # sleep-mode runs have no summary: 1 is expected
        sys.exit(f"sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, slurm_times(results / "smoke")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        seq_wall, seq_jobs = run(Path(tmp) / "seq", "launcher.max_nodes=1")
        con_wall, con_jobs = run(Path(tmp) / "con")
    print(f"mix: {len(con_jobs)} runs (8 x 1 node, 4 x 2, 2 x 4), workers sleep {SLEEP_S} s, 4-node Slurm")
    for name, wall, jobs in (("sequential", seq_wall, seq_jobs), ("concurrent", con_wall, con_jobs)):
        durations = [e - s for _, s, e in jobs]
        span = max(e for _, _, e in jobs) - min(s for _, s, _ in jobs)
        bound = max(sum(n * (e - s) for n, s, e in jobs) / 4, max(durations))
        print(f"{name:>10}: sweep wall {wall:6.1f} s, Slurm makespan {span:6.1f} s, "
              f"median run {sorted(durations)[len(durations) // 2]:.0f} s, lower bound {bound:6.1f} s")
    con_span = max(e for _, _, e in con_jobs) - min(s for _, s, _ in con_jobs)
    con_bound = max(sum(n * (e - s) for n, s, e in con_jobs) / 4, max(e - s for _, s, e in con_jobs))
    print(f"concurrent / lower bound = {con_span / con_bound:.2f} (target <= 1.15); "
          f"concurrent / sequential wall = {con_wall / seq_wall:.2f} (target <= 0.5)")


if __name__ == "__main__":
    main()
