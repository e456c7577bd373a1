"""`python -m bench.ingest PATH... --nodes N --gpus-per-node G --efa E`: existing nccl-tests logs
(all_reduce_perf, all_gather_perf, reduce_scatter_perf) as runs of a results dir, so a folder of old
nccl-tests outputs gets the report's tables and charts.

Each collective a file holds becomes one probe run (repeats numbered per collective in the order given;
a table whose collective the file does not tell is an all-reduce), parsed and checked by the same code as
a probe the sweep ran (transport against the EFA count, NIC count). A file without a results table is
listed and skipped, never fatal. Then: `python -m analysis.report RESULTS/SWEEP`.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from bench.core import rundir
from bench.core.schema import RunSpec
from bench.launchers.base import Outcome
from bench.probes.parse import by_collective, parse
from bench.run.collect import summarize_run, write_results


def ingest(paths: list[Path], sweep_dir: Path, *, nodes: int, gpus_per_node: int, efa: int,
           cluster: str) -> tuple[list[str], list[str]]:
    """(run ids written, files skipped with the reason)."""
    written, skipped = [], []
    repeats: dict[str, int] = {}
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            skipped.append(f"{path}: {e.strerror}")
            continue
        if not parse(text).rows:
            skipped.append(f"{path}: no nccl-tests results table")
            continue
        for collective in by_collective(text) or ["all_reduce"]:
            written.append(_ingest_one(path, text, sweep_dir, collective, repeats.get(collective, 0),
                                       nodes=nodes, gpus_per_node=gpus_per_node, efa=efa, cluster=cluster))
            repeats[collective] = repeats.get(collective, 0) + 1
    if written:
        write_results(sweep_dir)
    return written, skipped


def _ingest_one(path: Path, text: str, sweep_dir: Path, collective: str, repeat: int, *, nodes: int,
                gpus_per_node: int, efa: int, cluster: str) -> str:
    """One collective of one file as a probe run; its run id."""
    spec = RunSpec(kind="nccl", model="none", nodes=nodes, gpus_per_node=gpus_per_node, efa_per_node=efa,
                   cluster=cluster, launcher="ingest", repeat=repeat, steps=1, warmup_steps=0,
                   collective=collective)
    run_dir = rundir.run_dir(sweep_dir, spec)
    rundir.write_spec(run_dir, spec)
    attempt = rundir.attempt_dir(run_dir, 1)
    rundir.record_attempt(run_dir, attempt=1, launcher="ingest", source=str(path))
    rundir.atomic_write_text(rundir.log_path(attempt, path.stem), text)
    summary = summarize_run(spec, sweep_dir.name, attempt, Outcome(returncodes=[0]), predicted={},
                            git_rev=None, started_at=dt.datetime.now(dt.timezone.utc).isoformat())
    summary.attempt = 1
    rundir.write_summary(run_dir, summary)
    return spec.run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="nccl-tests output files")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--efa", type=int, required=True, help="EFA adapters per node the runs used")
    parser.add_argument("--cluster", default="ingested", help="cluster name for the table (e.g. p5.48xlarge)")
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="results root (default results/)")
    parser.add_argument("--sweep", default="nccl_ingest", help="sweep dir name under the results root")
    args = parser.parse_args(argv)
    if min(args.nodes, args.gpus_per_node) < 1 or args.efa < 0:
        print("error: --nodes and --gpus-per-node must be >= 1, --efa >= 0", file=sys.stderr)
        return 2
    sweep_dir = args.results / args.sweep
    written, skipped = ingest(args.paths, sweep_dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                              efa=args.efa, cluster=args.cluster)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    if not written:
        print("error: no file had an nccl-tests results table", file=sys.stderr)
        return 2
    print(f"{len(written)} run(s) in {sweep_dir}; report: python -m analysis.report {sweep_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
