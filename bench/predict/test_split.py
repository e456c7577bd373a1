"""The predicted split (bench/predict/split.py, perf.Prediction.parts): the parts add up to the step and to
the trace's definitions (a CPU exposes all its communication; ranks beyond the machine's capacity wait
their turn instead of computing slower), the points lost add up, and the change named is the one the
model predicts wins the most back without slowing the largest node count, within what memory allows."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bench.core.hardware import GPUS
from bench.core.schema import RunSpec
from bench.predict.comm import EXPOSED_PARTS, Network
from bench.predict.cpu import CPU, CPU_TURNS_SHARED, CpuFacts, cpu_share
from bench.predict.devices import LocalMachine
from bench.predict.memory import MemoryFigure, states_gib
from bench.predict.network import one_node, published
from bench.predict.perf import CALIBRATION, Prediction, predict
from bench.predict.split import (
    Known,
    Options,
    Split,
    best_change,
    comparable,
    lost_points,
    memory_check,
    predicted,
    rounded,
    win_back,
)

H100 = GPUS["H100-SXM"]
LOOPBACK = Network(None, "test loopback")
CPU_STUDY = replace(CALIBRATION, cpu_capacity=2.0, cpu_host_s=3e-3)
SEVEN_B = RunSpec(model="llama2_7b", nodes=1, gpus_per_node=8, micro_batch=2, seq_len=4096, efa_per_node=0,
                  cluster="p5.48xlarge")


def _p5(spec: RunSpec) -> Prediction:
    return predict(spec, H100, published("p5.48xlarge", spec.efa_per_node, spec.nodes))


def test_the_points_lost_add_up_part_by_part() -> None:
    """Weak scaling: a 1.0 s step at 1 node, 1.25 s at 2 of the same tokens: 20 points, 16 of them the
    reduce-scatter's 0.1 -> 0.3 s over 1.25 s. Strong scaling halves the work: a 0.6 s step at twice the
    nodes is 100 (1 - 0.5 x 1.0 / 0.6) = 16.7 points."""
    base = Split({"compute": 0.7, "exposed_reduce_scatter": 0.1, "other": 0.2}, 1.0, 8000)
    top = Split({"compute": 0.7, "exposed_reduce_scatter": 0.3, "waiting": 0.15, "other": 0.1}, 1.25, 8000)
    lost, parts = lost_points(base, top)
    assert lost == pytest.approx(20.0) and sum(parts.values()) == pytest.approx(lost)
    assert parts["exposed_reduce_scatter"] == pytest.approx(16.0) and parts["waiting"] == pytest.approx(12.0)
    assert rounded(parts, 20) == {"compute": 0, "exposed_reduce_scatter": 16, "waiting": 12, "other": -8}
    half = Split({"compute": 0.35, "exposed_reduce_scatter": 0.15, "other": 0.1}, 0.6, 4000)
    lost, parts = lost_points(base, half)
    assert lost == pytest.approx(100 * (1 - 0.5 / 0.6)) and sum(parts.values()) == pytest.approx(lost)
    assert parts["compute"] == pytest.approx(0.0)  # half the compute for half the tokens: nothing lost


def test_a_gpu_predictions_parts_add_up_and_its_exposed_communication_is_the_exposed_parts() -> None:
    pred = _p5(replace(SEVEN_B, nodes=16))
    assert sum(pred.parts.values()) == pytest.approx(pred.step_time_s, rel=1e-12)
    assert pred.exposed_s == pytest.approx(sum(pred.parts[k] for k in EXPOSED_PARTS), rel=1e-12)
    assert pred.parts["exposed_reduce_scatter"] > 0 and pred.parts["exposed_all_reduce"] == 0
    assert "waiting" not in pred.parts  # a GPU's straggler is no property of a configuration
    host_bound = predict(RunSpec(model="tiny_llama", nodes=1, gpus_per_node=1), H100, one_node(H100))
    assert host_bound.bound == "host-bound" and host_bound.parts["other"] > 10 * host_bound.parts["compute"]
    assert sum(host_bound.parts.values()) == pytest.approx(host_bound.host_s)


def test_a_cpu_exposes_every_collective_and_its_extra_ranks_wait_their_turn() -> None:
    """On 2 cores (capacity 2), 2 ranks run at the speed of 2; 4 ranks take turns: of the time their share
    adds to their work, CPU_TURNS_SHARED runs their own work slower and the rest waits for a peer, and the
    step is their work over the share of 4 whatever that division."""
    two = RunSpec(model="tiny_llama", nodes=1, gpus_per_node=2)
    four = replace(two, nodes=2)
    cpu = CpuFacts(frozenset({"avx2"}), 2445.0, 2)
    p2, p4 = (predict(s, CPU, LOOPBACK, cal=CPU_STUDY, local=LocalMachine(cpu)) for s in (two, four))
    for p in (p2, p4):
        assert p.exposed_s == pytest.approx(p.comm_s, rel=1e-12)  # gloo blocks the main thread
        assert sum(p.parts.values()) == pytest.approx(p.step_time_s, rel=1e-12)
    running = cpu_share(2, 2.0)
    turns = running / cpu_share(4, 2.0)
    slower = 1 + CPU_TURNS_SHARED * (turns - 1)
    for part in ("compute", "other"):
        assert p4.parts[part] == pytest.approx(p2.parts[part] * slower, rel=1e-12)
    assert p4.parts["optimizer"] == pytest.approx(p2.parts["optimizer"] / 2 * slower, rel=1e-12)  # 4 shards
    assert p2.parts["waiting"] == pytest.approx(0.0, abs=1e-12)
    work = p2.parts["compute"] + p2.parts["optimizer"] / 2 + p2.parts["other"]  # at the running speed
    assert p4.parts["waiting"] == pytest.approx(work * (1 - CPU_TURNS_SHARED) * (turns - 1), rel=1e-9)
    assert p4.parts["waiting"] + work * slower == pytest.approx(work * turns, rel=1e-9)
    assert p2.parts["other"] == pytest.approx(3e-3 * 4 * 3 / running, rel=1e-9)  # 4 blocks x 3 passes


def test_the_change_named_is_the_largest_predicted_gain_that_does_not_slow_the_top_node_count() -> None:
    """Llama 2 7B FULL_SHARD over TCP at 16 p5 nodes: its adapters (32 on the cluster) win the most back;
    without them, a larger micro batch; refused by memory, the next best; activation checkpointing, which
    wins points by slowing the smallest node count more than the largest, never."""
    base, top = SEVEN_B, SEVEN_B.at_nodes(16)
    lost, parts, gain = best_change(base, top, _p5, Options(32, H100))
    assert lost == pytest.approx(lost_points(predicted(base, _p5(base)), predicted(top, _p5(top)))[0])
    assert gain is not None and gain.change.name == "32 EFA adapters"
    after = lost_points(predicted(gain.base, _p5(gain.base)), predicted(gain.top, _p5(gain.top)))[0]
    assert gain.points == pytest.approx(lost - after) and gain.top.efa_per_node == 32
    assert gain.speedup == pytest.approx(_p5(gain.top).tokens_per_s_per_gpu / _p5(top).tokens_per_s_per_gpu)
    tcp = best_change(base, top, _p5, Options(0, H100))[2]
    assert tcp is not None and tcp.change.name == "micro batch x2" and tcp.fits is None
    assert "its memory not measured" in win_back(tcp, parts)
    no_room = Options(0, H100, lambda spec: spec.micro_batch <= 2)
    refused = best_change(base, top, _p5, no_room)[2]
    assert refused is not None and refused.change.name not in ("micro batch x2", "full AC")
    assert refused.speedup >= 1 and refused.points >= 1


def test_memory_is_judged_by_the_plan_then_by_its_line_through_the_state_then_by_the_state() -> None:
    spec = replace(SEVEN_B, nodes=2)
    planned = Known(spec, 40.0, True)
    fits = memory_check(80.0, {spec.run_id: planned})
    assert fits(spec) is True
    doubled = replace(spec, micro_batch=4)  # activations 40 - states, twice: the plan's affine estimate
    estimate = states_gib(doubled) + 2 * (40.0 - states_gib(spec))
    assert fits(doubled) is (MemoryFigure(estimate, 0.0, "estimate").need_gib(doubled) <= 80.0)
    assert memory_check(60.0, {spec.run_id: planned})(doubled) is False  # 2 x 37 GiB of activations
    assert fits(replace(spec, sharding="NO_SHARD")) is False  # 7B's state unsharded: 105 GiB
    assert fits(replace(spec, activation_checkpointing="full")) is None  # not planned, state fits
    assert memory_check(None, {})(doubled) is True  # a CPU study: no GPU memory to exceed
    wide = replace(SEVEN_B, nodes=16, micro_batch=8, global_batch=1024)  # 8 sequences a rank: mb16 is no run
    narrow = replace(wide, nodes=8, micro_batch=16)
    known = {wide.run_id: Known(wide, 22.0, True)}
    assert memory_check(80.0, known)(narrow) is None  # not that run at another micro batch: not known


def test_a_measured_split_is_compared_with_fsdps_copies_in_other() -> None:
    measured = {"compute": 0.5, "collective_copies": 0.1, "other": 0.2, "waiting": 0.05}
    assert comparable(measured) == {"compute": 0.5, **dict.fromkeys(EXPOSED_PARTS, 0.0), "waiting": 0.05,
                                    "optimizer": 0.0, "other": pytest.approx(0.3)}
