"""The plan's memory figure against a real GPU: every GPU training run of a gpucheck evidence folder
(benchmarks/evidence/<gpu>_torch-<version>_<date>/, the runs' results tables), measured again now on fake
tensors by the current worker, with what the planner adds on a GPU (cuBLAS's workspaces), beside
torch.cuda.max_memory_allocated of the run on the device, and the figure the run was planned with then.

The first H200 evidence (torch 2.11) planned at median |error| 44.8%: torch 2.11's memory tracker counted
DTensor's placement propagation at AdamW's step, fp32 attention over grouped KV heads runs CUDA's math
path (the T x T probabilities saved), and cuBLAS's 64 MiB are no tensor. With those three in the worker
and the planner, `--python` naming an interpreter with the torch that ran on the GPU measures what that
torch plans.

    python benchmarks/gpu_memory.py [--evidence DIR] [--python PYTHON]
    python benchmarks/gpu_memory.py --quick          # the smoke sweep's tiny runs alone
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core.records import parse_records  # noqa: E402
from bench.core.schema import RunSpec  # noqa: E402
from bench.gpucheck.evidence import EVIDENCE_DIR, table_runs  # noqa: E402
from bench.launchers.processes import command_env  # noqa: E402
from bench.predict.memory import CUBLAS_WORKSPACE_GIB  # noqa: E402

# The first GPU evidence, whose folder keeps the three sweeps' results tables (<sweep>.csv)
FIRST_H200 = EVIDENCE_DIR / "NVIDIA-H200_torch-2.11.0-cu130_2026-11-26"

SWEEPS = ("smoke", "gpucheck_memory", "gpucheck_mfu")


def gpu_runs(folder: Path, sweeps: tuple[str, ...]) -> list[tuple[str, RunSpec, float, float]]:
    """(sweep, spec, allocated peak GiB, figure planned then GiB) of each ok training run on the GPU."""
    return [(sweep, spec, float(row["mem_peak_alloc_gib"]), float(row["pred_mem_gib"] or "nan"))
            for sweep in sweeps for spec, row in table_runs(folder / f"{sweep}.csv")
            if row["mem_peak_alloc_gib"]]


def measure(specs: list[RunSpec], python: str) -> dict[str, dict]:
    """The worker command, as the planner runs it for a GPU cluster (--cuda), under the given interpreter."""
    proc = subprocess.run([python, "-m", "trainer.memory", "--cuda"], cwd=ROOT, env=command_env(), text=True,
                          input="".join(json.dumps(s.to_dict()) + "\n" for s in specs), capture_output=True,
                          timeout=1800)
    records = {r["run_id"]: r for r in parse_records(proc.stdout.splitlines())}
    if len(records) != len(specs):
        sys.exit(f"the worker answered {len(records)} of {len(specs)}: {proc.stderr[-2000:]}")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evidence", type=Path, default=FIRST_H200)
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the worker")
    parser.add_argument("--quick", action="store_true", help="the smoke sweep's runs alone")
    args = parser.parse_args()
    runs = gpu_runs(args.evidence, SWEEPS[:1] if args.quick else SWEEPS)
    records = measure([spec for _, spec, _, _ in runs], args.python)
    torch = {r.get("torch") for r in records.values()}
    print(f"{len(runs)} GPU runs of {args.evidence.name}, measured again with torch "
          f"{', '.join(sorted(torch))}")
    print(f"{'sweep':16} {'run':72} {'device GiB':>10} {'then':>9} {'now':>9} {'now error':>9}")
    then_errors, now_errors = [], []
    for sweep, spec, allocated, then in runs:
        now = records[spec.run_id]["peak_gib"] + CUBLAS_WORKSPACE_GIB
        then_errors.append(abs(then / allocated - 1))
        now_errors.append(abs(now / allocated - 1))
        print(f"{sweep:16} {spec.label[:72]:72} {allocated:10.4f} {then:9.4f} {now:9.4f} "
              f"{now / allocated - 1:+9.2%}")
    print(f"planned then: median |error| {statistics.median(then_errors):.1%}, worst {max(then_errors):.1%}; "
          f"now: median |error| {statistics.median(now_errors):.2%}, worst {max(now_errors):.2%}")


if __name__ == "__main__":
    main()
