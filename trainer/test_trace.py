"""The step split from each run's own profiler trace (trainer/trace.py) on real gloo FSDP2 ranks under
torchrun: a delay put into the all-gathers' path is exposed all-gather, not compute; a rank made to compute
longer leaves its peer waiting; the parts add up to the step for every strategy and accumulation mode, and
every collective the flight recorder saw FSDP2 issue has a kind. The GPU path on a trace in the shape
torch.profiler writes on CUDA; a bad trace leaves the run without a split and says why."""
from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest
import torch

from conftest import SERIES
from trainer import trace

pytestmark = pytest.mark.xdist_group("series")  # its runs train in the one series of their world size

DELAY_S = 0.03  # slow_collective: sleep before each all-gather FSDP2 issues
BUSY_S = 0.02  # slow_compute: rank 1's extra compute in each block's forward (4 blocks: 0.08 s a step)
SMALL = ["--model", "tiny_llama", "--precision", "fp32", "--steps", "3", "--warmup-steps", "1",
         "--seq-len", "64", "--trace-steps", "2"]
TWO_NODES = [*SMALL, "--nodes", "2", "--gpus-per-node", "1", "--micro-batch", "2"]
PLAIN = SERIES.declare(TWO_NODES, 2)
DELAYED = [*TWO_NODES, "--seed", "1", "--fault", "slow_collective", "--fault-collective", "all_gather",
           "--fault-seconds", str(DELAY_S)]
SLOWED = [*TWO_NODES, "--seed", "2", "--fault", "slow_compute", "--fault-rank", "1",
          "--fault-seconds", str(BUSY_S)]
SERIES.declare(DELAYED, 2)
SERIES.declare(SLOWED, 2)
# every strategy, accumulating two micro-batches per step with and without a sync per micro-batch
MATRIX = [(s, a) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
          for a in ("sync_each", "sync_once")]


def _matrix_args(sharding: str, accumulation: str) -> list[str]:
    return [*SMALL, "--nodes", "2", "--gpus-per-node", "2", "--sharding", sharding, "--micro-batch", "1",
            "--global-batch", "8", "--accumulation", accumulation, "--trace-steps", "1",
            "--seed", "3"]  # a run of its own: test_accumulation trains the same specs untraced




def _declare_matrix() -> None:
    """The matrix's runs, declared by its (slow) tests only: declared at import, the default suite's first
    4-rank series would train them too."""
    for sharding, accumulation in MATRIX:
        SERIES.declare(_matrix_args(sharding, accumulation), 4)


def _splits(args: list[str], nproc: int) -> dict[int, dict]:
    result = SERIES.result(args, nproc)
    assert result.summary["status"] == "ok", result.output[-3000:]
    records = {r["rank"]: r for r in result.of_kind("trace")}
    assert sorted(records) == list(range(nproc)), result.output[-3000:]
    for r in records.values():
        assert r["error"] is None and r["split"], r
        assert Path(r["file"]).name == f"rank{r['rank']}.pt.trace.json.gz"
    return records


def _exposed_all_gather(split: dict) -> float:
    return split["parts"]["exposed_all_gather_fwd"] + split["parts"]["exposed_all_gather_bwd"]


def test_a_delay_in_the_all_gathers_path_is_exposed_all_gather_not_compute() -> None:
    plain, delayed = _splits(TWO_NODES, 2), _splits(DELAYED, 2)
    for rank in (0, 1):
        before, after = plain[rank]["split"], delayed[rank]["split"]
        gathers = sum(after["collectives"][k]["count"] for k in ("all_gather_fwd", "all_gather_bwd"))
        assert gathers >= 8  # 4 blocks and the root, forward and backward
        added = gathers * DELAY_S
        assert _exposed_all_gather(after) - _exposed_all_gather(before) == pytest.approx(added, rel=0.3)
        assert after["parts"]["compute"] - before["parts"]["compute"] < 0.25 * added
        # every rank sleeps alike, so the delay is not a wait for a peer; on a loaded 2-core machine (CI)
        # the sleeps end at different times, and the first to arrive waits (seen: 0.10 s of 0.30 s added)
        assert after["parts"]["waiting"] - before["parts"]["waiting"] < 0.5 * added


def test_a_rank_that_computes_longer_leaves_its_peer_waiting() -> None:
    ranks = _splits(SLOWED, 2)
    slow, peer = ranks[1]["split"]["parts"], ranks[0]["split"]["parts"]
    extra = 4 * BUSY_S  # each block's forward, once a step
    # the busy rank computes longer and its peer waits about as long for it; both near what was added, the
    # busy rank's work also slowing its peer's share of 2 shared cores, and other tests' load both
    longer, waited = slow["compute"] - peer["compute"], peer["waiting"] - slow["waiting"]
    assert 0.3 * extra < longer < 3 * extra and 0.3 * extra < waited < 3 * extra
    assert waited == pytest.approx(longer, rel=0.4)


@pytest.mark.slow  # eight 4-rank runs in one series: close to three minutes on 2 cores
@pytest.mark.parametrize(("sharding", "accumulation"), MATRIX)
def test_the_parts_add_up_to_the_step_and_every_collective_has_a_kind(sharding: str,
                                                                      accumulation: str) -> None:
    _declare_matrix()
    args = _matrix_args(sharding, accumulation)
    ranks = _splits(args, 4)
    for r in ranks.values():
        split, timed = r["split"], statistics.mean(r["step_times_s"])
        # the trace's clock against perf_counter's
        assert sum(split["parts"].values()) == pytest.approx(timed, rel=0.05)
        assert split["unclassified"] == 0
    kinds = {k for k, v in ranks[0]["split"]["collectives"].items() if v["count"]}
    expected = {"FULL_SHARD": {"all_gather_fwd", "all_gather_bwd", "reduce_scatter"},
                "SHARD_GRAD_OP": {"all_gather_fwd", "reduce_scatter"},
                "HYBRID_SHARD": {"all_gather_fwd", "all_gather_bwd", "reduce_scatter", "all_reduce"},
                "NO_SHARD": {"all_reduce"}}[sharding]
    assert kinds == expected
    # the flight recorder's count of the last timed step's collectives (every group, every op) is the trace's
    recorder = SERIES.result(args, 4).summary["collectives_per_step"]
    seen = sum(v["count"] for v in ranks[0]["split"]["collectives"].values())
    assert seen == sum(n for ops in recorder.values() for n in ops.values())


def _write(path: Path, data: dict) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


def _exchange(mine: object) -> list[object]:
    return [mine]


def test_a_bad_trace_leaves_no_split_and_says_why(tmp_path: Path) -> None:
    good = {trace.META_KEY: {"torch": torch.__version__}, "traceEvents": []}
    cases = {"missing": tmp_path / "none.json.gz",
             "truncated": tmp_path / "cut.json.gz",
             "other torch": _write(tmp_path / "old.json.gz", {**good, trace.META_KEY: {"torch": "2.4.0"}}),
             "no step": _write(tmp_path / "empty.json.gz", good)}
    whole = gzip.compress(json.dumps(good).encode())
    cases["truncated"].write_bytes(whole[:len(whole) // 2])
    why = {name: trace.analyse(path, _exchange) for name, path in cases.items()}
    assert all(split is None for split, _ in why.values())
    assert "no trace" in why["missing"][1]
    assert "unreadable" in why["truncated"][1]
    assert "torch 2.4.0" in why["other torch"][1] and torch.__version__ in why["other torch"][1]
    assert "no fsdpbench::step" in why["no step"][1]


# --- the GPU path, on a trace in the shape torch.profiler writes on CUDA: host ops and ranges on the
# Python thread (cpu_op, user_annotation), cudaLaunchKernel (cuda_runtime) with a correlation id, and
# each kernel (cat "kernel", pid the device, tid and args.stream its stream) with the same correlation


def _gpu_trace() -> dict:
    """One step of 100 us: compute 0-40 on stream 7 with an all-gather on stream 20 at 10-30 (hidden)
    and one at 40-60 (exposed, nothing computes), compute 60-80, a reduce-scatter 80-90 (exposed), the
    optimizer's kernel 92-96, an all-reduce 96-98 (exposed), idle otherwise. The backward's ranges, ops
    and launches are on autograd's own thread (101), as on CUDA."""
    host, tid, autograd = [], 100, 101
    ev = [{"ph": "X", "cat": "user_annotation", "name": trace.STEP_RANGE, "pid": 1, "tid": tid, "ts": 1000.0,
           "dur": 100.0},
          {"ph": "X", "cat": "user_annotation", "name": "FSDP::pre_backward (model.layers.0)", "pid": 1,
           "tid": autograd, "ts": 1035.0, "dur": 5.0},
          {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "pid": 1, "tid": tid,
           "ts": 1085.0, "dur": 5.0}]
    ops = [("c10d::_allgather_base_", 1001.0, [[1024], [512]], ["c10::BFloat16"] * 2),
           ("c10d::_allgather_base_", 1036.0, [[1024], [512]], ["c10::BFloat16"] * 2),
           ("c10d::_reduce_scatter_base_", 1070.0, [[256], [512]], ["float"] * 2),
           ("c10d::allreduce_", 1090.5, [[[256]], []], ["TensorList", ""])]  # a list: the kernel's type
    gather = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    kernels = [(gather, 20, 1010.0, 20.0, 1001.5), (gather, 20, 1040.0, 20.0, 1036.5),
               ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 1080.0,
                10.0, 1070.5),
               ("ampere_sgemm_128x64_tn", 7, 1000.0, 40.0, 1000.2),
               ("ampere_sgemm_128x64_nn", 7, 1060.0, 20.0, 1037.0),
               ("void at::native::multi_tensor_apply_kernel<AdamW>", 7, 1092.0, 4.0, 1086.0),
               ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 21, 1096.0, 2.0,
                1090.7)]
    def thread(ts: float) -> int:
        return autograd if 1035.0 <= ts < 1085.0 else tid
    for name, ts, dims, types in ops:
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": thread(ts), "ts": ts,
                   "dur": 1.0, "args": {"Input Dims": dims, "Input type": types}})
    for corr, (name, stream, ts, dur, launched) in enumerate(kernels):
        host.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                     "tid": thread(launched),
                     "ts": launched, "dur": 0.3, "args": {"correlation": corr, "cbid": 211}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                   "args": {"device": 0, "stream": stream, "correlation": corr, "External id": corr}})
    return {trace.META_KEY: {"torch": torch.__version__}, "traceEvents": ev + host}


def test_the_gpu_split_from_kernels_on_their_streams() -> None:
    tl = trace.timeline(_gpu_trace())
    trace.set_waits(tl, [trace.collective_durations(tl)])
    got = trace.split(tl)
    us = 1e-6
    assert got["device"] == "gpu" and got["unclassified"] == 0
    assert got["parts"] == pytest.approx({"compute": 60 * us, "exposed_all_gather_fwd": 0.0,
                                          "exposed_all_gather_bwd": 20 * us,
                                          "exposed_reduce_scatter": 10 * us,
                                          "exposed_all_reduce": 2 * us, "waiting": 0.0,
                                          "optimizer": 4 * us, "other": 4 * us})
    assert got["overlapped"]["all_gather_fwd"] == pytest.approx(20 * us)
    assert got["collectives"]["all_gather_fwd"] == {"bytes": 2048, "s": pytest.approx(20 * us), "count": 1}
    assert got["collectives"]["reduce_scatter"]["bytes"] == 2048  # the unreduced input, fp32
    assert got["collectives"]["all_reduce"]["bytes"] == 512  # 256 bf16 elements: the type from the kernel


def test_a_peer_that_came_late_is_waiting_on_a_gpu() -> None:
    """The same step where a peer's exposed all-gather took 5 us: this rank's first 15 us of its 20 waited."""
    tl = trace.timeline(_gpu_trace())
    peer = trace.collective_durations(tl)
    peer["all_gather_bwd"] = [5.0]
    trace.set_waits(tl, [trace.collective_durations(tl), peer])
    parts = trace.split(tl)["parts"]
    assert parts["waiting"] == pytest.approx(15e-6)
    assert parts["exposed_all_gather_bwd"] == pytest.approx(5e-6)


# the smoke's four one-rank runs on an H100 (bench.gpucheck, torch 2.11): their traces and trace records
H100_RUN = (Path(__file__).parents[1] / "benchmarks" / "evidence"
            / "NVIDIA-H100-80GB-HBM3_torch-2.11.0-cu130_2026-11-28")
H100_TRACES = sorted((H100_RUN / "traces").glob("*.pt.trace.json.gz"))


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


@pytest.mark.parametrize("path", H100_TRACES, ids=lambda p: p.name.split("-")[3])
def test_a_real_h100_trace_splits_its_step_as_timed(path: Path) -> None:
    """A trace torch 2.11 wrote on an H100 (one rank, one profiled step): the step is the host's range alone
    (the kernels' `gpu_user_annotation` copy of it is not a second step), its parts add up to the step
    perf_counter timed within 5%, and compute with the optimizer is the time some kernel ran in it."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    record = path.with_name(path.name.replace(".pt.trace.json.gz", ".trace_record.json"))
    timed = json.loads(record.read_text())["step_times_s"]
    tl = trace.timeline(data)
    trace.set_waits(tl, [trace.collective_durations(tl)])
    got = trace.split(tl)
    assert got["steps"] == len(timed) == 1 and got["device"] == "gpu" and got["unclassified"] == 0
    assert sum(got["parts"].values()) == pytest.approx(got["step_s"])
    assert abs(got["step_s"] / statistics.mean(timed) - 1) <= 0.05, (got["step_s"], timed)
    (start, end), = tl.windows
    kernels = [(max(e["ts"], start), min(e["ts"] + e["dur"], end)) for e in data["traceEvents"]
               if e.get("cat") == "kernel" and e["ts"] < end and e["ts"] + e["dur"] > start]
    busy = _union(kernels) / 1e6
    assert got["parts"]["compute"] + got["parts"]["optimizer"] == pytest.approx(busy, rel=1e-6)
    assert got["parts"]["optimizer"] > 0  # AdamW's kernels, told apart by their launches' correlation


def test_a_trace_that_cannot_be_written_leaves_the_steps_and_says_why(tmp_path: Path) -> None:
    """A write that fails (a full disk; here a file where the trace's folder should be) keeps the steps'
    times, leaves no half-written file, and the split's reason names the folder; the ranks still meet in
    the exchange, so none waits for a peer that gave up."""
    blocker = tmp_path / "trace"
    blocker.write_text("a file, not a folder")
    ran: list[int] = []
    times, why = trace.record(ran.append, range(3, 5), blocker / "rank0.pt.trace.json.gz", False, {})
    assert ran == [3, 4] and len(times) == 2 and all(t >= 0 for t in times)
    assert why is not None and why.startswith(f"trace not written to {blocker}")
    assert blocker.read_text() == "a file, not a folder"
    exchanged: list[object] = []
    split, error = trace.analyse(None, lambda mine: exchanged.append(mine) or [mine])
    assert split is None and error is None and exchanged == [None]
    kept = tmp_path / "ok" / "rank0.pt.trace.json.gz"
    _, none = trace.record(ran.append, range(5, 6), kept, False, {})
    assert none is None and kept.stat().st_size > 0
