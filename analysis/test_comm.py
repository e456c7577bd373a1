"""Communication model: bus bytes per strategy by hand, and verdicts on a hand-made sweep with probes."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.comm import ABOVE_PROBE, achieved, achieved_sentences, bus_bytes, comm_model
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


def _probe(sweep: Path, collective: str, nodes: int, busbw: float, efa: int = 32, gpus_per_node: int = 8,
           shares: tuple[tuple[int, float], ...] = ((2**20, 0.1), (2**28, 1.0), (2**30, 1.0))) -> None:
    spec = RunSpec(kind="nccl", model="none", gpus_per_node=gpus_per_node, cluster="p5.48xlarge",
                   efa_per_node=efa, nodes=nodes, collective=collective)
    ranks = gpus_per_node * nodes
    factor = (2 if collective == "all_reduce" else 1) * (ranks - 1) / ranks
    _summary(sweep, spec, nccl_busbw_avg_gbs=busbw / 2, nccl_busbw_max_gbs=busbw, extra={"sizes": [
        {"size": size, "busbw": busbw * share, "algbw": busbw * share / factor, "time_us": 1.0}
        for size, share in shares]})


def test_a_slower_all_gather_probe_lengthens_the_modelled_all_gathers_and_the_table_says_so(tmp_path) -> None:
    """FULL_SHARD's bus bytes split: all-gathers 2 x 15/16 P b_p at the all-gather probe's 60 GB/s, the
    reduce-scatter 15/16 P b_g at the all-reduce probe's 200 (no reduce-scatter probe), against 200 for
    everything without the gather probe."""
    common = {"model": "llama2_7b", "gpus_per_node": 8, "cluster": "p5.48xlarge", "efa_per_node": 32,
              "seq_len": 4096}
    times = {}
    for name, gather in (("ar_only", None), ("slow_gather", 60.0)):
        sweep = tmp_path / name
        _probe(sweep, "all_reduce", 2, 200.0)
        if gather:
            _probe(sweep, "all_gather", 2, gather)
        _summary(sweep, RunSpec(**common, nodes=2), step_time_s=2.0, tokens_per_s=4096 * 16 / 2.0)
        frame = load(sweep).frame
        times[name] = comm_model(aggregate(frame), nccl_sizes(frame)).iloc[0]
    plain, slow = times["ar_only"], times["slow_gather"]
    assert plain["comm_s"] == pytest.approx(15 / 16 * 8 * P / 200e9)
    assert slow["comm_s"] == pytest.approx(15 / 16 * 4 * P / 60e9 + 15 / 16 * 4 * P / 200e9)
    assert slow["busbw_all_gather_gbs"] == 60.0 and slow["busbw_reduce_scatter_gbs"] == 200.0
    assert slow["fed_by"] == ("all-gather: all_gather probe at 2 nodes; reduce-scatter: all_reduce probe "
                              "(no reduce_scatter probe) at 2 nodes")
    assert plain["fed_by"].startswith("all-gather: all_reduce probe (no all_gather probe) at 2 nodes")


def test_what_each_run_got_of_the_network_against_the_probe(tmp_path) -> None:
    """Two 2-node FULL_SHARD runs with trace_collectives (bytes per step in nccl-tests' size
    convention, seconds per step, calls): each kind's bus bandwidth (bytes / s x (W-1)/W over 16 ranks)
    against the probe of its collective at one call's size, and the sentence per node count, its
    bandwidths to three significant figures."""
    sweep = tmp_path / "study"
    _probe(sweep, "all_reduce", 2, 200.0)
    _probe(sweep, "reduce_scatter", 2, 100.0)  # no all-gather probe: its kinds meet the all-reduce's
    frame_rows = []
    for repeat, rs_s in enumerate((0.300, 0.330)):
        spec = RunSpec(model="llama2_7b", gpus_per_node=8, cluster="p5.48xlarge", efa_per_node=32, nodes=2,
                       repeat=repeat)
        trace = {"all_gather_fwd": {"bytes": 32 * 2**28, "s": 0.512, "count": 32},
                 "reduce_scatter": {"bytes": 32 * 2**29, "s": rs_s, "count": 32},
                 "unknown_kind": {"bytes": 1, "s": 1.0, "count": 1}}
        row = RunSummary(run_id=spec.run_id, sweep="study", status="ok", spec=spec, step_time_s=1.0,
                         extra={"trace_collectives": trace}).to_row()
        frame_rows.append(row)
    frame = load(sweep).frame
    table = achieved(pd.concat([frame, pd.DataFrame(frame_rows)], ignore_index=True), nccl_sizes(frame))
    rs = table[table["kind"] == "reduce_scatter"].sort_values("run_id")
    got = sorted(32 * 2**29 / s / 1e9 * 15 / 16 for s in (0.300, 0.330))
    assert sorted(rs["achieved_busbw_gbs"]) == pytest.approx(got)
    assert set(rs["probe_busbw_gbs"]) == {100.0} and set(rs["probe"]) == {"reduce_scatter probe"}
    ag = table[table["kind"] == "all_gather_fwd"].iloc[0]
    assert ag["achieved_busbw_gbs"] == pytest.approx(32 * 2**28 / 0.512 / 1e9 * 15 / 16)
    assert ag["probe"] == "all_reduce probe" and ag["probe_busbw_gbs"] == 200.0
    assert ag["message_bytes"] == 2**28 and len(table) == 4  # the unknown kind is left out
    median = (got[0] + got[1]) / 2
    sentences = achieved_sentences(table)
    assert sentences[1] == (f"the 2-node runs' reduce-scatters reached {median / 100:.0%} of the probe "
                            f"(2 runs; {median:.3g} of 100 GB/s bus bandwidth, reduce_scatter probe over "
                            "2 nodes x 8)")
    gather = 32 * 2**28 / 0.512 / 1e9 * 15 / 16  # 15.7 GB/s
    assert sentences[0] == (f"the 2-node runs' forward all-gathers reached {gather / 200:.0%} of the probe "
                            f"(2 runs; {gather:.3g} of 200 GB/s bus bandwidth, all_reduce probe over "
                            "2 nodes x 8)")


def _hybrid(sweep: Path, trace: dict, nodes: int = 2) -> pd.DataFrame:
    """A HYBRID_SHARD run of `nodes` x 2 ranks with these trace_collectives, beside the sweep's probes."""
    spec = RunSpec(model="llama2_7b", gpus_per_node=2, cluster="p5.48xlarge", efa_per_node=32, nodes=nodes,
                   sharding="HYBRID_SHARD")
    row = RunSummary(run_id=spec.run_id, sweep="study", status="ok", spec=spec, step_time_s=1.0,
                     trace_collectives=trace).to_row()
    frame = load(sweep).frame
    return achieved(pd.concat([frame, pd.DataFrame([row])], ignore_index=True), nccl_sizes(frame))


def test_each_collective_meets_the_probe_of_its_own_group_at_its_own_size(tmp_path: Path) -> None:
    """HYBRID_SHARD on 2 x 2: its reduce-scatters run within a node (the 1-node, 2-GPU probe), its
    all-reduce across the 2 nodes, one rank on each (the 2-node, 1-GPU probe; not the 2 x 2 one, which
    four ranks ran). Each probe is read at the run's own message size, between its probed sizes, on its
    curve made non-decreasing (the noisy 2^26 and 2^27 rows, below 2^25's, are read as 2^25's); the time
    waited for a peer is not the network's. Bytes: 2^30 per step in 4 calls of 2^28."""
    sweep = tmp_path / "study"
    noisy = ((2**24, 0.25), (2**25, 0.5), (2**26, 0.1), (2**27, 0.1), (2**29, 1.0), (2**30, 1.0))
    _probe(sweep, "reduce_scatter", 1, 40.0, gpus_per_node=2, shares=noisy)
    _probe(sweep, "all_reduce", 2, 20.0, gpus_per_node=1)
    _probe(sweep, "all_reduce", 2, 90.0, gpus_per_node=2)
    _probe(sweep, "all_reduce", 1, 99.0, gpus_per_node=2)
    trace = {"reduce_scatter": {"bytes": 2**30, "s": 0.5, "wait_s": 0.1, "count": 4, "ranks": 2},
             "all_reduce": {"bytes": 2**30, "s": 1.0, "count": 4, "ranks": 2}}
    table = _hybrid(sweep, trace).set_index("kind")
    rs, ar = table.loc["reduce_scatter"], table.loc["all_reduce"]
    assert rs["probe_placement"] == "1 node x 2" and ar["probe_placement"] == "2 nodes x 1"
    assert rs["achieved_busbw_gbs"] == pytest.approx(2**30 / 0.4 / 1e9 / 2)  # (n-1)/n over 2 ranks
    assert rs["probe_busbw_gbs"] == pytest.approx(30.0)  # 2^28: halfway from 2^27's 20 (2^25's) to 2^29's 40
    assert ar["probe_busbw_gbs"] == pytest.approx(20.0) and ar["probe"] == "all_reduce probe"
    assert ar["achieved_busbw_gbs"] == pytest.approx(2**30 / 1.0 / 1e9)  # 2(n-1)/n = 1 over 2 ranks


def test_one_rank_collectives_are_left_out_and_a_share_above_the_probe_is_explained(tmp_path: Path) -> None:
    """HYBRID_SHARD on one node: its all-reduce runs over a group of one rank and sends nothing (no row,
    no sentence: not "0% of the probe"); its reduce-scatters passed the probe, and the sentence says why
    that can be."""
    sweep = tmp_path / "study"
    _probe(sweep, "reduce_scatter", 1, 0.1, gpus_per_node=2)
    _probe(sweep, "all_reduce", 1, 0.1, gpus_per_node=2)
    trace = {"reduce_scatter": {"bytes": 2**30, "s": 4.0, "count": 4, "ranks": 2},
             "all_reduce": {"bytes": 2**29, "s": 0.1, "count": 4, "ranks": 1}}
    table = _hybrid(sweep, trace, nodes=1)
    assert list(table["kind"]) == ["reduce_scatter"]
    share = 2**30 / 4.0 / 1e9 / 2 / 0.1  # 134%
    assert achieved_sentences(table) == [
        f"the 1-node runs' reduce-scatters reached {share:.0%} of the probe (1 run; 0.134 of 0.1 GB/s bus "
        f"bandwidth, reduce_scatter probe over 1 node x 2): {ABOVE_PROBE}"]


def test_a_run_above_its_probe_is_said_to_be_beside_a_median_below_it() -> None:
    """A node count's median share below 100% with one run above it: the sentence says that one passed
    the probe, and why that can be."""
    rows = [{"run_id": run, "nodes": 2, "kind": "all_reduce", "share": share,
             "achieved_busbw_gbs": 1.234 * share, "probe_busbw_gbs": 1.234, "probe": "all_reduce probe",
             "probe_placement": "2 nodes x 1"}
            for run, share in (("a", 1.2), ("b", 0.5), ("c", 0.7))]
    assert achieved_sentences(pd.DataFrame(rows)) == [
        "the 2-node runs' all-reduces reached 70% of the probe (3 runs; 0.864 of 1.23 GB/s bus bandwidth, "
        f"all_reduce probe over 2 nodes x 1); 1 of them {ABOVE_PROBE}"]
