"""The report's "What bounds each collective, predicted" (analysis/bounds.py): a planned GPU study's rows are
the study's own model's, NCCL's pick and bound per part, the lines the plan prints."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from analysis.bounds import bounds_table
from analysis.load import load_plan
from analysis.winback import study_model
from bench.core.schema import RunSpec

ROOT = Path(__file__).resolve().parents[1]


def test_a_planned_gpu_study_reports_each_collectives_pick_and_bound(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=p5_scaling", "axes.model=[llama2_7b]",
                    "axes.sharding=[FULL_SHARD]", "axes.nodes=[1,16]", "nccl.enabled=false",
                    "memory.measure=false", f"results_root={tmp_path}", "--dry-run"],
                   cwd=ROOT, check=True, capture_output=True)
    sweep = tmp_path / "p5_scaling"
    plan = load_plan([sweep], [])
    table = bounds_table(plan, [sweep])
    assert sorted(set(table["nodes"])) == [1, 16]
    assert set(table["part"]) == {"all_gather_fwd", "all_gather_bwd", "reduce_scatter"}
    predictor = study_model(sweep)[0]
    row = plan[plan["nodes"] == 16].iloc[0]
    pred = predictor.predict(RunSpec.from_dict(row.to_dict()))
    rs = next(b for b in pred.bounds if b.part == "exposed_reduce_scatter")
    mine = table[(table["nodes"] == 16) & (table["part"] == "reduce_scatter")].iloc[0]
    assert (mine["algorithm"], mine["protocol"], mine["bound"]) == (rs.algorithm, rs.protocol, rs.bound)
    assert mine["total_s"] == rs.total_s and mine["exposed_s"] == rs.exposed_s
    one = table[(table["nodes"] == 1) & (table["part"] == "reduce_scatter")].iloc[0]
    assert one["bound"] == "intra-node bandwidth" and mine["bound"] != "intra-node bandwidth"


def test_a_cpu_study_has_no_row(tmp_path: Path) -> None:
    """The smoke's collectives are gloo's on this machine's cores: nothing of NCCL's to report."""
    subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", "memory.measure=false",
                    f"results_root={tmp_path}", "--dry-run"], cwd=ROOT, check=True, capture_output=True)
    sweep = tmp_path / "smoke"
    assert bounds_table(load_plan([sweep], []), [sweep]).empty
