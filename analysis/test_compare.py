"""`analysis.compare` on two hand-made results trees with planted changes of known size."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.compare import compare, main, side
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary
from conftest import ROOT


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


def _system(sweep_dir: Path, nccl: str, env: dict[str, str]) -> None:
    """Give every run of a tree one node's system record: NVIDIA's driver 550, NCCL `nccl`, `env`."""
    for d in rundir.iter_run_dirs(sweep_dir):
        summary = rundir.read_summary(d)
        summary.extra["system"] = [{"node": "p5-00", "source": "trainer", "facts": {
            "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_driver": "550.54.15", "nccl": nccl, "env": env}}]
        rundir.write_summary(d, summary)


def test_what_else_changed_is_printed_first_and_named_in_the_last_line(trees, capsys) -> None:
    a, b = trees
    _system(a, "2.21.5", {"NCCL_DEBUG": "INFO"})
    _system(b, "2.23.4", {"NCCL_DEBUG": "INFO", "FI_EFA_USE_DEVICE_RDMA": "1"})
    assert main([str(a), str(b), "--fail-on-regression"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["system: NCCL 2.21.5 -> 2.23.4", "system: FI_EFA_USE_DEVICE_RDMA unset -> 1"]
    assert out[2].startswith("| configuration |")  # before the throughput deltas
    assert out[-1] == ("5 configurations compared: 2 regression(s), 1 improvement(s); system differs: "
                       "NCCL 2.21.5 -> 2.23.4; FI_EFA_USE_DEVICE_RDMA unset -> 1")
    assert main([str(a), str(a)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "system: the same on both sides"


SMOKE_ONE_RUN = ["+sweep=smoke", "axes.precision=[bf16_mixed]", "axes.activation_checkpointing=[none]",
                 "axes.gpus_per_node=[1]", "axes.compile=[false]", "axes.global_batch=[null]",
                 "nccl.enabled=false", "trace.enabled=false", "memory.measure=false"]


@pytest.mark.slow  # two sweeps of one one-rank run each: about 30 s on 2 cores
def test_two_smoke_studies_one_environment_variable_apart(tmp_path: Path) -> None:
    """The same one-run smoke sweep twice through the local launcher, the second with FI_EFA_USE_DEVICE_RDMA
    set: the comparison names that variable and no other fact (the git facts aside: this checkout is shared
    and may change between the two sweeps)."""
    for name, extra in (("a", {}), ("b", {"FI_EFA_USE_DEVICE_RDMA": "1"})):
        env = {k: v for k, v in os.environ.items() if k != "FI_EFA_USE_DEVICE_RDMA"}
        proc = subprocess.run([sys.executable, "-m", "bench.sweep", *SMOKE_ONE_RUN,
                               f"results_root={tmp_path / name}"], cwd=ROOT, capture_output=True, text=True,
                              timeout=600, env={**env, **extra})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "analysis.compare", str(tmp_path / "a"), str(tmp_path / "b"),
                           "--fail-on-regression"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [ln.removeprefix("system: ") for ln in proc.stdout.splitlines() if ln.startswith("system: ")]
    assert [ln for ln in lines if not ln.startswith("git")] == ["FI_EFA_USE_DEVICE_RDMA unset -> 1"], \
        proc.stdout
    assert "system differs: " in proc.stdout.splitlines()[-1]
    assert "FI_EFA_USE_DEVICE_RDMA unset -> 1" in proc.stdout.splitlines()[-1]
