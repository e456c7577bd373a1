"""`analysis.compare` on two hand-made results trees with planted changes of known size."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis.compare import compare, main, side
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary


def run(sweep_dir: Path, tokens_per_s: float | None, status: str = "ok", repeat: int = 0, std: float = 0.0,
        mem: float = 10.0, **spec_kw) -> None:
    spec = RunSpec(**{"model": "llama2_7b", "gpus_per_node": 8, "cluster": "p5.48xlarge", "repeat": repeat,
                      **spec_kw})
    d = rundir.run_dir(sweep_dir, spec)
    step = None if tokens_per_s is None else 4096 * spec.nodes / tokens_per_s
    rundir.write_spec(d, spec)
    rundir.write_summary(d, RunSummary(
        run_id=spec.run_id, sweep=sweep_dir.name, status=status, spec=spec, run_dir=str(d),
        tokens_per_s=tokens_per_s, step_time_s=step, step_time_s_std=None if step is None else std * step,
        mem_peak_alloc_gib=mem if status == "ok" else None,
        mfu=None if tokens_per_s is None else tokens_per_s / 1e4,
        error=None if status == "ok" else f"{status}: boom"))


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a" / "before", tmp_path / "b" / "after"  # sweep names differ on purpose
    run(a, 1000.0, std=0.01, nodes=1)  # planted: -10% throughput, +10% memory
    run(b, 900.0, std=0.01, nodes=1, mem=11.0)
    run(a, 1900.0, std=0.01, nodes=2)  # +1%: inside the 3% threshold
    run(b, 1919.0, std=0.01, nodes=2)
    run(a, 1000.0, nodes=1, sharding="HYBRID_SHARD")  # ok -> oom
    run(b, None, status="oom", nodes=1, sharding="HYBRID_SHARD")
    run(a, 1000.0, nodes=1, precision="fp32")  # -10% but B's repeats spread 850..950: within its noise
    run(b, 850.0, nodes=1, precision="fp32", repeat=0)
    run(b, 950.0, nodes=1, precision="fp32", repeat=1)
    run(a, 1000.0, nodes=1, activation_checkpointing="full")  # +20%, quiet: an improvement
    run(b, 1200.0, nodes=1, activation_checkpointing="full")
    run(b, 500.0, nodes=4)  # only in B
    return a, b


def test_planted_changes_get_the_right_verdicts(trees) -> None:
    (a, _), (b, _) = side(trees[0]), side(trees[1])
    table = compare(a, b).set_index("config")
    base = "llama2_7b FULL_SHARD bf16_mixed no AC transformer_block mb1 s128"
    one = table[table["nodes"] == 1]
    assert one.loc[base, "tokens_delta_pct"] == pytest.approx(-10.0)
    assert one.loc[base, "mem_delta_pct"] == pytest.approx(10.0)
    assert one.loc[base, "verdict"] == "regression: throughput, memory"
    # noise: 1% step-time std on each side -> 2 * sqrt(2) * 1% = 2.83% < the 3% threshold
    assert one.loc[base, "noise_pct"] == pytest.approx(3.0)
    assert table[table["nodes"] == 2].loc[base, "verdict"] == "within noise"
    assert one.loc[base.replace("FULL_SHARD", "HYBRID_SHARD"), "verdict"] == "regression: now oom"
    fp32 = one.loc[base.replace("bf16_mixed", "fp32")]
    assert fp32["tokens_delta_pct"] == pytest.approx(-10.0)
    assert fp32["noise_pct"] == pytest.approx(100 * 2 * 50 / 900)  # half the range over the median, 2 sigmas
    assert fp32["verdict"] == "within noise"
    assert one.loc[base.replace("no AC", "full AC"), "verdict"] == "improvement"
    assert len(table) == 5


def test_cli_exit_codes(trees, tmp_path: Path, capsys) -> None:
    a, b = (str(p) for p in trees)
    assert main([a, b]) == 0
    out = capsys.readouterr().out
    assert "only in B: llama2_7b FULL_SHARD" in out and "at 4 node(s)" in out
    assert "5 configurations compared: 2 regression(s), 1 improvement(s)" in out
    assert main([a, b, "--fail-on-regression", "--csv", str(tmp_path / "c.csv")]) == 1
    assert (tmp_path / "c.csv").read_text().count("\n") == 6
    assert main([a, a, "--fail-on-regression"]) == 0
    assert main([a, str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
