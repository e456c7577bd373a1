"""Communication model: bus bytes per strategy by hand, and verdicts on a hand-made sweep with probes."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis.comm import bus_bytes, comm_model
from analysis.load import load
from analysis.scaling import aggregate, nccl_sizes
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary

P = 6_738_415_616  # Llama-2-7b


def test_bus_bytes_per_strategy() -> None:
    p = 1e9  # bf16_mixed: 2 bytes gathered, 4 bytes reduced
    assert bus_bytes("FULL_SHARD", "bf16_mixed", p, 2, 8) == (0.0, pytest.approx(15 / 16 * (4e9 + 4e9)))
    assert bus_bytes("SHARD_GRAD_OP", "bf16_mixed", p, 2, 8) == (0.0, pytest.approx(15 / 16 * 6e9))
    assert bus_bytes("NO_SHARD", "fp32", p, 2, 8) == (0.0, pytest.approx(2 * 15 / 16 * 4e9))
    intra, inter = bus_bytes("HYBRID_SHARD", "bf16_pure", p, 4, 8)  # 2 bytes both ways
    assert intra == pytest.approx(7 / 8 * 6e9) and inter == pytest.approx(2 * 3 / 4 * 2e9 / 8)
    assert bus_bytes("FULL_SHARD", "fp32", p, 1, 1) == (0.0, 0.0)  # one GPU talks to no one


def _summary(sweep: Path, spec: RunSpec, **metrics) -> None:
    d = rundir.run_dir(sweep, spec)
    rundir.write_spec(d, spec)
    rundir.write_summary(d, RunSummary(run_id=spec.run_id, sweep=sweep.name, status="ok", spec=spec,
                                       run_dir=str(d), **metrics))


def test_verdicts_on_a_hand_made_sweep(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    common = {"model": "llama2_7b", "gpus_per_node": 8, "cluster": "p5.48xlarge", "efa_per_node": 32}
    for nodes, busbw_big in ((1, 200.0), (2, 100.0)):
        probe = RunSpec(kind="nccl", **{**common, "model": "none"}, nodes=nodes)
        _summary(sweep, probe, nccl_busbw_max_gbs=busbw_big, extra={"sizes": [
            {"size": 2**20, "busbw": 10.0, "algbw": 5.0, "time_us": 1.0},
            {"size": 2**28, "busbw": busbw_big, "algbw": busbw_big / 2, "time_us": 1.0}]})
    steps = {("FULL_SHARD", 1): 1.0, ("FULL_SHARD", 2): 1.3,
             ("SHARD_GRAD_OP", 1): 1.0, ("SHARD_GRAD_OP", 2): 2.0}
    for (sharding, nodes), step in steps.items():
        _summary(sweep, RunSpec(**common, sharding=sharding, nodes=nodes, seq_len=4096),
                 step_time_s=step, tokens_per_s=4096 * 8 * nodes / step)
    frame = load(sweep).frame
    comm = comm_model(aggregate(frame), nccl_sizes(frame)).set_index(["sharding", "nodes"])
    # One block's parameters in bf16 (421 MB) is closest to the 256 MiB probe size: 200 GB/s on 1 node.
    full1, full2 = comm.loc[("FULL_SHARD", 1)], comm.loc[("FULL_SHARD", 2)]
    assert full1["busbw_gbs"] == 200.0 and full2["busbw_gbs"] == 100.0
    assert full1["comm_s"] == pytest.approx(7 / 8 * 8 * P / 200e9)
    assert full2["comm_s"] == pytest.approx(15 / 16 * 8 * P / 100e9)
    assert full2["lost_s"] == pytest.approx(0.3)
    grew = 15 / 16 * 8 * P / 100e9 - 7 / 8 * 8 * P / 200e9  # 0.27 s of the 0.3 s lost
    assert full2["comm_growth_s"] == pytest.approx(grew)
    assert full2["verdict"] == (f"communication-bound ({grew / 0.3:.0%} of the lost time is slower "
                                "collectives)")
    sgo2 = comm.loc[("SHARD_GRAD_OP", 2)]
    assert sgo2["comm_growth_s"] == pytest.approx(15 / 16 * 6 * P / 100e9 - 7 / 8 * 6 * P / 200e9)
    assert sgo2["verdict"].startswith("not communication-bound")
    assert comm.loc[("FULL_SHARD", 1), "verdict"] == "base"
