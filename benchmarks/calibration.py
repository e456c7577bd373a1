"""A staged study on this machine, as a user sizes one: the one-node half of the smoke sweep first, then
`--dry-run` of the whole sweep on the same results dir (the two-node runs predicted from the one-node
ones, with intervals), then the whole sweep. Prints each two-node run's prediction (made when it started,
with the calibration the study had then) beside what it measured, and the median |error| against the
same runs' prediction with the published constants. Then the fit's cost for 100 runs.

    python benchmarks/calibration.py            # the smoke sweep (about 5 minutes on 2 cores)
    python benchmarks/calibration.py --quick    # two strategies, bf16 only (about 2 minutes)
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.core import rundir  # noqa: E402
from bench.core.hardware import GPUS  # noqa: E402
from bench.core.load_config import from_dict  # noqa: E402
from bench.core.models import get_arch  # noqa: E402
from bench.core.schema import RunSpec  # noqa: E402
from bench.launchers import launcher_sections, placement_of  # noqa: E402
from bench.predict.calibrate import Observation, fit  # noqa: E402
from bench.predict.network import published, sweep_probes  # noqa: E402
from bench.predict.perf import CALIBRATION, Predictor, predict  # noqa: E402
from bench.sweep import compose  # noqa: E402

QUICK = ["axes.sharding=[FULL_SHARD,NO_SHARD]", "axes.precision=[bf16_mixed]", "axes.compile=[false]",
         "axes.activation_checkpointing=[none]", "nccl.gpus_per_node=[2]", "axes.global_batch=[null]"]
STAGE_ONE = ["axes.nodes=[1]", "nccl.nodes=[1]"]


def sweep(root: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"results_root={root}",
                           *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sweep {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def staged(root: Path, axes: list[str]) -> list[float]:
    """Run the two stages; print the two-node runs; return their calibrated |errors|."""
    started = time.perf_counter()
    sweep(root, *axes, *STAGE_ONE)
    done = len(rundir.read_summaries(root / "smoke"))
    print(f"stage 1 (one node) in {time.perf_counter() - started:.0f} s: {done} runs")
    dry = sweep(root, *axes, "--dry-run").splitlines()
    print(next(line for line in dry if line.startswith("predictions calibrated")))
    print("\n".join(line for line in dry if line.startswith("tiny_llama-n2")))  # the planned runs' lines
    whole = sweep(root, *axes).splitlines()
    print(next(line for line in whole if "skipped" in line))
    cfg = from_dict(compose(["+sweep=smoke", f"results_root={root}", *axes])[0], launcher_sections())
    published = Predictor(cfg.cluster, placement_of(cfg), sweep_probes(root / "smoke"))
    print(f"\n{'two-node run':<72} {'measured':>9} {'predicted':>10} {'error':>7}  "
          f"{'published':>9} {'error':>7}  predicted with")
    calibrated, uncalibrated = [], []
    for s in sorted(rundir.read_summaries(root / "smoke"), key=lambda s: s.spec.label):
        if s.spec.kind != "train" or s.spec.nodes < 2 or s.status != "ok":
            continue
        error = s.tokens_per_s_per_gpu / s.pred_tokens_per_s_per_gpu - 1
        base = published.predict(s.spec).tokens_per_s_per_gpu
        calibrated.append(abs(error))
        uncalibrated.append(abs(s.tokens_per_s_per_gpu / base - 1))
        print(f"{s.spec.label:<72} {s.tokens_per_s_per_gpu:>9,.0f} {s.pred_tokens_per_s_per_gpu:>10,.0f} "
              f"{error:>+7.1%}  {base:>9,.0f} {uncalibrated[-1]:>7.1%}  {s.pred_source}")
    print(f"\ntwo-node runs: median |error| {statistics.median(calibrated):.1%} calibrated on the study's "
          f"runs, {statistics.median(uncalibrated):.1%} with the published constants "
          f"({len(calibrated)} runs); whole staged study {time.perf_counter() - started:.0f} s")
    return calibrated


def fit_cost(runs: int = 100, repeats: int = 5) -> float:
    """Median seconds to fit `runs` H100 runs of several models, shardings and node counts."""
    gpu, net = GPUS["H100-SXM"], published("p5.48xlarge")
    truth = replace(CALIBRATION, matmul_efficiency={"H100": 0.6}, elementwise_bytes=300.0)
    observations = []
    for i in range(runs):
        spec = RunSpec(model=("llama3_2_1b", "llama3_1_8b", "llama2_13b")[i % 3], nodes=1 << (i % 5),
                       gpus_per_node=8, sharding=("FULL_SHARD", "HYBRID_SHARD")[i % 2],
                       activation_checkpointing=("none", "full")[(i // 2) % 2], micro_batch=1 + i % 4,
                       seq_len=4096, repeat=i)
        tokens = predict(spec, gpu, net, cal=truth).tokens_per_s_per_gpu * (1 + 0.03 * ((i % 7) - 3) / 3)
        observations.append(Observation(spec.run_id, spec, gpu, net, get_arch(spec.model), tokens))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fit(observations)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two strategies, bf16 only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        errors = staged(Path(tmp), QUICK if args.quick else [])
    runs = 20 if args.quick else 100
    print(f"fit of {runs} runs: {fit_cost(runs):.3f} s (median of 5)")
    if not args.quick and statistics.median(errors) > 0.15:  # quick: 3 one-node runs, the pipeline only
        sys.exit(f"staged calibration missed by a median {statistics.median(errors):.0%} (> 15%)")


if __name__ == "__main__":
    main()
