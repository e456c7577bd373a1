"""The step split from each run's own profiler trace (trainer/trace.py, trace_split.py, trace_waits.py). On
real gloo FSDP2 ranks under torchrun: a rank held back before its collectives leaves its peer waiting that
long, and no exposed communication more; a rank that computes longer leaves its peer waiting for that work;
a one-rank run sends nothing and exposes nothing; NO_SHARD's gradient all-reduce is an all-reduce; the
parts add up to the step for every strategy and accumulation mode, every collective the flight recorder
saw has a kind, and a rank held to a fifth of a core from outside is the one waited for. On synthetic
traces in the shapes torch.profiler writes on a CPU and on CUDA: each part's rule, and waits read within
each collective's own process group. A bad trace leaves the run without a split and says why."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.core.records import parse_records
from bench.core.warm import SOCKET_ENV
from conftest import ROOT, SERIES
from trainer import trace, trace_record, trace_split, trace_waits

pytestmark = pytest.mark.xdist_group("series")  # its runs train in the one series of their world size

# slow_collective: a rank sleeps before each collective of one kind it issues (5 a step here): long against
# what the ranks' arrivals differ by anyway on 2 cores shared with other work (up to 10 ms a collective)
HOLD_S = 0.2
# slow_compute: rank 1's extra compute before each block's forward (4 blocks: 0.4 s a step), long against a
# block's own compute, which the busy loop's core makes its peer's slower (5-12 ms on loaded cores)
BUSY_S = 0.1
SMALL = ["--model", "tiny_llama", "--precision", "fp32", "--steps", "3", "--warmup-steps", "1",
         "--seq-len", "64", "--trace-steps", "2"]
TWO_NODES = [*SMALL, "--nodes", "2", "--gpus-per-node", "1", "--micro-batch", "2"]
REPLICATED = [*TWO_NODES, "--sharding", "NO_SHARD"]  # its only collective: the gradient all-reduce
HELD = [*REPLICATED, "--steps", "2", "--seed", "1", "--fault", "slow_collective", "--fault-rank", "1",
        "--fault-collective", "all_reduce", "--fault-seconds", str(HOLD_S)]  # one timed step: 4 s held
SLOWED = [*TWO_NODES, "--steps", "2", "--seed", "2", "--fault", "slow_compute", "--fault-rank", "1",
          "--fault-seconds", str(BUSY_S)]
ALONE = [*SMALL, "--nodes", "1", "--gpus-per-node", "1", "--micro-batch", "2", "--steps", "2",
         "--trace-steps", "1"]
SERIES.declare(REPLICATED, 2)
SERIES.declare(HELD, 2)
SERIES.declare(SLOWED, 2)
SERIES.declare(ALONE, 1)  # with test_accumulation's one-rank runs
EXPOSED = tuple(f"exposed_{k}" for k in trace.KINDS)
# every strategy, accumulating two micro-batches per step with and without a sync per micro-batch
MATRIX = [(s, a) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
          for a in ("sync_each", "sync_once")]
ISSUED = {"FULL_SHARD": {"all_gather_fwd", "all_gather_bwd", "reduce_scatter"},
          "SHARD_GRAD_OP": {"all_gather_fwd", "reduce_scatter"},
          "HYBRID_SHARD": {"all_gather_fwd", "all_gather_bwd", "reduce_scatter", "all_reduce"},
          "NO_SHARD": {"all_reduce"}}


def _matrix_args(sharding: str, accumulation: str, *extra: str) -> list[str]:
    return [*SMALL, "--nodes", "2", "--gpus-per-node", "2", "--sharding", sharding, "--micro-batch", "1",
            "--global-batch", "8", "--accumulation", accumulation, "--trace-steps", "1",
            "--seed", "3", *extra]  # a run of its own: test_accumulation trains the same specs untraced


# the matrix's FULL_SHARD run with rank 2 held back before each of its reduce-scatters (a run of its own)
HELD_4 = _matrix_args("FULL_SHARD", "sync_each", "--seed", "7", "--steps", "2", "--fault",
                      "slow_collective", "--fault-rank", "2", "--fault-collective", "reduce_scatter",
                      "--fault-seconds", str(HOLD_S))


def _declare_matrix() -> None:
    """The matrix's runs, declared by its (slow) tests only: declared at import, the default suite's first
    4-rank series would train them too."""
    for sharding, accumulation in MATRIX:
        SERIES.declare(_matrix_args(sharding, accumulation), 4)
    SERIES.declare(HELD_4, 4)


def _splits(args: list[str], nproc: int) -> dict[int, dict]:
    result = SERIES.result(args, nproc)
    assert result.summary["status"] == "ok", result.output[-3000:]
    records = {r["rank"]: r for r in result.of_kind("trace")}
    assert sorted(records) == list(range(nproc)), result.output[-3000:]
    for r in records.values():
        assert r["error"] is None and r["split"], r
        assert Path(r["file"]).name == f"rank{r['rank']}.pt.trace.json.gz"
    return records


def _exposed(split: dict) -> float:
    return sum(split["parts"][k] for k in EXPOSED)


def _held_back(plain: dict[int, dict], held: dict[int, dict], rank: int, kind: str) -> None:
    """`rank` slept HOLD_S before each collective of `kind` it issued. Against the same run without the
    hold, in those collectives: every other rank's waiting grows by that time within 10% and its exposed
    communication does not grow; the held rank's sleep is neither waiting nor communication (it idles:
    `other`), nor anyone's compute. Sleeping, the held rank leaves the cores to the others, and the hold
    is long against what the ranks' arrivals differ by anyway on 2 shared cores."""
    added = held[rank]["split"]["collectives"][kind]["count"] * HOLD_S
    for r in held:
        before, after = plain[r]["split"], held[r]["split"]
        grew = {k: after["parts"][k] - before["parts"][k] for k in trace_split.PARTS}
        waited = after["waiting_by_kind"][kind] - before["waiting_by_kind"][kind]
        assert grew["compute"] < 0.2 * added and grew[f"exposed_{kind}"] < 0.1 * added, (r, grew)
        if r == rank:
            assert waited < 0.1 * added and grew["other"] == pytest.approx(added, rel=0.2), (r, grew)
        else:
            assert waited == pytest.approx(added, rel=0.1), (r, waited, added)


def test_a_rank_held_back_before_its_all_reduces_leaves_its_peer_waiting_that_long() -> None:
    _held_back(_splits(REPLICATED, 2), _splits(HELD, 2), rank=1, kind="all_reduce")


def test_a_rank_that_computes_longer_leaves_its_peer_waiting_for_that_work() -> None:
    """Rank 1 computes BUSY_S more before each block's forward: a loop of matmuls bounded by the wall
    clock, so at least that long however loaded the cores are. Read within the run, both ranks under the
    same load: rank 1 computes at least most of that longer than its peer, and its peer waits at least
    most of that longer than it does, in the forward all-gathers after the loops (3 of the 4) no longer
    than rank 1 did longer in all (compute, copies, host time), while rank 1 hardly waits there (the
    root's all-gather, before any loop, may find either rank first). Rank 1 may be later still than its
    loops: gloo spins in its wait, so a waiting peer takes a core of the two from rank 1's own work, and
    the peer waits for that too. The waits are read from the ranks' arrivals on their shared clock,
    whatever each rank's gloo threads did after."""
    split = _splits(SLOWED, 2)
    busy, peer = split[1]["split"], split[0]["split"]
    added = 4 * BUSY_S  # each block's forward, once a step
    more = {k: busy["parts"][k] - peer["parts"][k] for k in trace_split.PARTS}
    excess = sum(more[k] for k in ("compute", "collective_copies", "optimizer", "other"))
    assert more["compute"] > 0.75 * added and -more["waiting"] > 0.75 * added, (more, added)
    gathers = peer["waiting_by_kind"]["all_gather_fwd"], busy["waiting_by_kind"]["all_gather_fwd"]
    assert 2 * BUSY_S < gathers[0] < excess and gathers[1] < BUSY_S / 2, (gathers, excess)


def test_a_one_rank_run_sends_nothing_and_exposes_nothing() -> None:
    """One rank: FSDP2 issues no collective; its copies into and out of the (unsharded) parameters and the
    gradient division are its collective path's local work, never exposed communication."""
    split = _splits(ALONE, 1)[0]["split"]
    assert _exposed(split) == 0 and split["parts"]["waiting"] == 0 and split["collectives"] == {}
    assert split["parts"]["collective_copies"] > 0


def test_no_shards_gradient_all_reduce_is_an_all_reduce() -> None:
    """NO_SHARD issues no all-gather and no reduce-scatter: what it waits on after the backward is its
    all-reduce, over both ranks, not a reduce-scatter."""
    exposed = []
    for r in _splits(REPLICATED, 2).values():
        split = r["split"]
        assert set(split["collectives"]) == {"all_reduce"} and split["unclassified"] == 0
        assert all(split["parts"][k] == 0 for k in EXPOSED if k != "exposed_all_reduce"), split["parts"]
        # filed under the all-reduce, exposed or waited: a rank that waited for the whole of it (its peer
        # descheduled on a loaded machine) exposes none of it
        assert split["parts"]["exposed_all_reduce"] + split["waiting_by_kind"]["all_reduce"] > 0, split
        assert split["collectives"]["all_reduce"]["ranks"] == 2
        exposed.append(split["parts"]["exposed_all_reduce"])
    assert max(exposed) > 0  # the rank that arrived last waits for no one


@pytest.mark.slow  # eight 4-rank runs in one series: close to three minutes on 2 cores
@pytest.mark.parametrize(("sharding", "accumulation"), MATRIX)
def test_the_parts_add_up_to_the_step_and_every_collective_has_a_kind(sharding: str,
                                                                      accumulation: str) -> None:
    """Each strategy and accumulation mode: the parts add up to the step timed by perf_counter, each
    collective's kind is the op that ran (NO_SHARD's and HYBRID_SHARD's gradient all-reduce is all_reduce;
    a run that issues no reduce-scatter exposes none), each read within its own group's ranks, and the
    trace's count is the flight recorder's."""
    _declare_matrix()
    args = _matrix_args(sharding, accumulation)
    ranks = _splits(args, 4)
    for r in ranks.values():
        split, timed = r["split"], statistics.mean(r["step_times_s"])
        # the trace's clock against perf_counter's
        assert sum(split["parts"].values()) == pytest.approx(timed, rel=0.05)
        assert split["unclassified"] == 0 and split["unmatched"] == 0
        kinds = {k for k, v in split["collectives"].items() if v["count"]}
        assert kinds == ISSUED[sharding]
        assert all(split["parts"][f"exposed_{k}"] == 0 for k in trace.KINDS if k not in kinds)
        assert all(split["waiting_by_kind"][k] == 0 for k in trace.KINDS if k not in kinds)
        # HYBRID_SHARD: gathers and reduce-scatters within a node's 2 ranks, the all-reduce across the 2 nodes
        group = 2 if sharding == "HYBRID_SHARD" else 4
        assert all(v["ranks"] == group for v in split["collectives"].values())
    # the flight recorder's count of the last timed step's collectives (every group, every op) is the trace's
    recorder = SERIES.result(args, 4).summary["collectives_per_step"]
    seen = sum(v["count"] for v in ranks[0]["split"]["collectives"].values())
    assert seen == sum(n for ops in recorder.values() for n in ops.values())


@pytest.mark.slow  # a 4-rank run beside the matrix's, in its series: about 10 s
def test_a_rank_held_back_among_four_leaves_its_three_peers_waiting_that_long() -> None:
    _declare_matrix()
    _held_back(_splits(_matrix_args("FULL_SHARD", "sync_each"), 4), _splits(HELD_4, 4), rank=2,
               kind="reduce_scatter")


# a fifth of a core, in 2 ms of every 10: short periods slow a rank throughout, where cgroup's default 100 ms
# period lets it run at full speed for 20 ms bursts between 80 ms stops
CAP_US, PERIOD_US = 2000, 10000


@contextlib.contextmanager
def _capped_cgroup() -> Iterator[Path]:
    """A cgroup of a fifth of a core, from outside the processes it will hold (cgroup v2's cpu.max, else
    v1's cpu controller, as bench/launchers/test_slurm.py holds a Slurm node); skips where neither can be
    written (not root, no cpu controller). Its processes go back to the root group after."""
    root = Path("/sys/fs/cgroup")
    v2 = "cpu" in (root / "cgroup.subtree_control").read_text().split() \
        if (root / "cgroup.subtree_control").exists() else False
    base = root if v2 else root / "cpu"
    group = base / "fsdpbench-trace-capped"
    try:
        group.mkdir(exist_ok=True)
        if v2:
            (group / "cpu.max").write_text(f"{CAP_US} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(CAP_US))
    except OSError:
        pytest.skip("no writable cgroup cpu controller to cap a rank with")
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # a process that has exited meanwhile
                (base / "cgroup.procs").write_text(pid)
        group.rmdir()


def _cap_when_training(torchrun: subprocess.Popen, rank: int, group: Path, records: Path) -> bool:
    """Move `rank`'s worker (a child of torchrun, RANK in its environment) into `group` once it has set up
    (its meta record written): its imports and start-up run at full speed. False if it never got there."""
    while torchrun.poll() is None:
        if records.exists() and '"kind":"meta"' in records.read_text():
            for task in Path(f"/proc/{torchrun.pid}/task").iterdir():
                for child in (task / "children").read_text().split():
                    environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                    if f"RANK={rank}".encode() in environ:
                        (group / "cgroup.procs").write_text(child)
                        return True
        time.sleep(0.05)
    return False


@pytest.mark.slow  # a torchrun of its own, one rank capped from outside it: about 40 s on 2 cores
def test_a_rank_slowed_from_outside_is_the_one_waited_for(tmp_path: Path) -> None:
    """Rank 1 held to a fifth of a core from outside its process (nothing in it knows): it arrives last at
    its collectives, so it shows next to no waiting of its own, and its peer's waiting carries the
    slowdown. The arrival reading says so whatever the durations do: the capped rank is slow inside each
    collective too, so it leaves them later than its peer, against the duration rule's premise."""
    args = [*TWO_NODES, "--seed", "6", "--run-dir", str(tmp_path)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--max-restarts=0", f"--log-dir={tmp_path / 'torchelastic'}", "-m", "trainer", *args]
    with _capped_cgroup() as group:
        cold = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}  # the capped process is the worker
        torchrun = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env={**cold, "OMP_NUM_THREADS": "1"})
        try:
            capped = _cap_when_training(torchrun, 1, group, tmp_path / "records" / "rank1.jsonl")
            output, _ = torchrun.communicate(timeout=300)
        finally:
            torchrun.kill()
    assert capped and torchrun.returncode == 0, output[-3000:]
    split = {r["rank"]: r["split"] for r in parse_records(output.splitlines()) if r["kind"] == "trace"}
    slowed, peer = split[1], split[0]
    assert slowed["parts"]["waiting"] < 0.05 * slowed["step_s"], slowed["parts"]
    assert peer["parts"]["waiting"] > 0.3 * peer["step_s"], peer["parts"]
    assert slowed["premise"]["contradicted"] > 0  # the durations alone would have misread it


def _write(path: Path, data: dict) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


def _exchange(mine: object) -> list[object]:
    return [mine]


def test_kinetos_start_and_stop_notices_leave_a_runs_log_and_nothing_else_does() -> None:
    """kineto writes a USDT notice to standard error at every profiler start and stop, in every traced run's
    log; trace_record.without_kineto_notices drops those two lines and keeps anything else written
    meanwhile."""
    code = ("import os, torch\n"
            "from torch.profiler import ProfilerActivity, profile\n"
            "from trainer.trace_record import without_kineto_notices\n"
            "prof = profile(activities=[ProfilerActivity.CPU])\n"
            "with without_kineto_notices():\n"
            "    prof.__enter__()\n"
            "    os.write(2, b'kept: written meanwhile\\n')\n"
            "torch.ones(3).sum()\n"
            "with without_kineto_notices():\n"
            "    prof.__exit__(None, None, None)\n"
            "prof2 = profile(activities=[ProfilerActivity.CPU])\n"
            "prof2.__enter__(); prof2.__exit__(None, None, None)\n")
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert "kept: written meanwhile" in lines
    notices = [line for line in lines if trace_record.KINETO_NOTICE.match(line.encode())]
    assert len(notices) == 2 and notices[0].endswith("profiler_start"), lines  # the unfiltered profiler's


def test_a_bad_trace_leaves_no_split_and_says_why(tmp_path: Path) -> None:
    good = {trace.META_KEY: {"torch": torch.__version__}, "traceEvents": []}
    cases = {"missing": tmp_path / "none.json.gz",
             "truncated": tmp_path / "cut.json.gz",
             "other torch": _write(tmp_path / "old.json.gz", {**good, trace.META_KEY: {"torch": "2.4.0"}}),
             "no step": _write(tmp_path / "empty.json.gz", good)}
    whole = gzip.compress(json.dumps(good).encode())
    cases["truncated"].write_bytes(whole[:len(whole) // 2])
    why = {name: trace_split.analyse(path, _exchange) for name, path in cases.items()}
    assert all(split is None for split, _ in why.values())
    assert "no trace" in why["missing"][1]
    assert "unreadable" in why["truncated"][1]
    assert "torch 2.4.0" in why["other torch"][1] and torch.__version__ in why["other torch"][1]
    assert "no fsdpbench::step" in why["no step"][1]


# --- the CPU path, on traces in the shape torch.profiler writes for gloo: the main thread's ops (cpu_op)
# nested in ranges (user_annotation), and each collective on one of gloo's work threads (`gloo:*`, a thread
# pair per process group) with the element count and type it runs


def _op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _cpu_trace(reduce_scatter: bool = True) -> dict:
    """One HYBRID_SHARD-like step of 100 us on a CPU (NO_SHARD-like without its reduce-scatter): compute
    0-10 and 30-50; the forward all-gather's range 10-30 (its copy-in 10-14 and the c10d call 14-15, then
    the main thread idles while gloo gathers 16-29); the backward's reduce range 60-85 (the copy-in 60-63,
    the reduce-scatter's call 63-64, run by gloo as an all_reduce 65-71 on the same group's thread, a
    copy 72-74, the all-reduce's call 74-75 and its run 76-84 on another group's thread); the optimizer
    88-95; autograd's op around the reduce range computes 55-60 and 85-86. The rest is the host's: 15-16
    and 29-30 (a collective queued or done, the main thread not yet back), 50-55, 64-65, 71-72, 75-76,
    84-85, 86-88, 95-100."""
    gather = [[2048], [1024]]  # output, input: gloo's event names the input
    ev = [_op(trace.STEP_RANGE, 0.0, 100.0, cat="user_annotation"),
          _op("aten::mm", 0.0, 10.0),
          _op("FSDP::pre_forward (model.layers.0)", 9.0, 22.0, cat="user_annotation"),
          _op("FSDP::all_gather (model.layers.0)", 10.0, 20.0, cat="user_annotation"),
          _op("fsdp::all_gather_copy_in", 10.0, 4.0),
          _op("c10d::_allgather_base_", 14.0, 1.0, **{"Input Dims": gather, "Input type": ["float"] * 2}),
          _op("gloo:all_gather", 16.0, 13.0, tid=7, cat="user_annotation",
              **{"Input Dims": [[1024]], "Input type": ["float"]}),
          _op("aten::addmm", 30.0, 20.0),
          _op("FSDP::pre_backward (model.layers.0)", 50.0, 1.0, cat="user_annotation"),
          _op("autograd::engine::evaluate_function: PostBackward", 55.0, 31.0),  # FSDP's hook runs inside
          _op("FSDP::post_backward_reduce (model.layers.0)", 60.0, 25.0, cat="user_annotation"),
          _op("fsdp::chunk_cat", 60.0, 3.0),
          _op("aten::copy_", 72.0, 2.0),
          _op("c10d::allreduce_", 74.0, 1.0, **{"Input Dims": [[[512]]], "Input type": ["TensorList"]}),
          _op("gloo:all_reduce", 76.0, 8.0, tid=9, cat="user_annotation",
              **{"Input Dims": [[512]], "Input type": ["float"]}),
          _op("Optimizer.step#AdamW.step", 88.0, 7.0, cat="user_annotation"),
          _op("aten::_foreach_add_", 89.0, 5.0)]
    if reduce_scatter:
        ev += [_op("c10d::_reduce_scatter_base_", 63.0, 1.0,
                   **{"Input Dims": [[512], [1024]], "Input type": ["float"] * 2}),
               _op("gloo:all_reduce", 65.0, 6.0, tid=8, cat="user_annotation",
                   **{"Input Dims": [[1024]], "Input type": ["float"]})]
    else:  # NO_SHARD: the reduce range copies in and all-reduces; the host idles where HYBRID reduce-scatters
        ev += [_op("aten::div_", 63.0, 1.0)]
    return {trace.META_KEY: {"torch": torch.__version__}, "traceEvents": ev}


HYBRID_GROUPS = {0: {"all_gather": [0, 1], "reduce_scatter": [0, 1], "all_reduce": [0, 2]},
                 1: {"all_gather": [0, 1], "reduce_scatter": [0, 1], "all_reduce": [1, 3]},
                 2: {"all_gather": [2, 3], "reduce_scatter": [2, 3], "all_reduce": [0, 2]},
                 3: {"all_gather": [2, 3], "reduce_scatter": [2, 3], "all_reduce": [1, 3]}}


def _peer(rank: int, flights: dict[str, list[tuple[float, float]]], host: str = "host") -> dict:
    return {"rank": rank, "host": host, "base_ns": 0, "groups": HYBRID_GROUPS[rank], "flights": flights}


def _alone(tl: trace.Timeline, groups: dict | None = None) -> dict:
    """The split where this rank's peers ran every collective exactly as it did: no waits."""
    mine = trace_waits.exchanged(tl, 0, groups, "host")
    trace_waits.set_waits(tl, mine, [mine])
    return trace_split.split(tl)


def test_each_part_of_a_cpu_step_by_its_rule() -> None:
    """FSDP's copy-in, copy-out and c10d calls are collective_copies, not compute and not communication;
    the main thread idle in FSDP's path is exposed only while a collective it waits for runs, of the kind
    of the op that issued that one (the reduce range waits on the reduce-scatter, then on the all-reduce:
    each its own kind), and idle otherwise; an op of the main thread elsewhere is compute, even inside a
    longer op (autograd's) around FSDP's range."""
    got = _alone(trace.timeline(_cpu_trace()))
    us = 1e-6
    assert got["device"] == "cpu" and got["unclassified"] == 0
    assert got["parts"] == pytest.approx({"compute": 36 * us, "exposed_all_gather_fwd": 13 * us,
                                          "exposed_all_gather_bwd": 0.0, "exposed_reduce_scatter": 6 * us,
                                          "exposed_all_reduce": 8 * us, "waiting": 0.0,
                                          "collective_copies": 12 * us, "optimizer": 7 * us,
                                          "other": 18 * us})
    assert got["collectives"]["all_gather_fwd"] == {"bytes": 8192, "s": pytest.approx(13 * us), "wait_s": 0.0,
                                                    "count": 1, "ranks": None}
    assert got["collectives"]["reduce_scatter"]["bytes"] == 4096  # the unreduced input, fp32
    assert got["collectives"]["all_reduce"]["bytes"] == 2048  # the buffer: its type from gloo's event


def test_a_run_that_issues_no_reduce_scatter_exposes_none() -> None:
    """NO_SHARD's reduce range: its wait is the all-reduce's; the time its reduce-scatter would have taken
    is the host's, never an exposed reduce-scatter."""
    got = _alone(trace.timeline(_cpu_trace(reduce_scatter=False)))
    assert set(got["collectives"]) == {"all_gather_fwd", "all_reduce"}
    assert got["parts"]["exposed_reduce_scatter"] == 0
    assert got["parts"]["exposed_all_reduce"] == pytest.approx(8e-6)


def test_a_collective_of_a_one_rank_group_is_local_work() -> None:
    """HYBRID_SHARD on one node: the all-reduce over a replicate group of one rank sends nothing; gloo
    copying it is the collective path's local work, and it has no wait."""
    groups = {"all_gather": [0, 1], "reduce_scatter": [0, 1], "all_reduce": [0]}
    got = _alone(trace.timeline(_cpu_trace()), groups)
    assert got["parts"]["exposed_all_reduce"] == 0
    assert got["parts"]["collective_copies"] == pytest.approx(20e-6)  # 12 of copies, the all-reduce's 8
    assert got["collectives"]["all_reduce"]["ranks"] == 1


def test_waits_are_read_within_each_collectives_own_group() -> None:
    """HYBRID_SHARD on 2 x 2 ranks: rank 0 gathers and reduce-scatters with rank 1, all-reduces with rank
    2. Rank 1 arrived 4 us after it at the all-gather, rank 2 4 us after it at the all-reduce: 8 us of
    waiting. Rank 3 (other groups) arrived later at both, and rank 1 at the all-reduce: none of that is
    a wait of rank 0's. All ranks share one host's clock and left each collective together: the duration
    rule reads the same, and nothing contradicts it."""
    tl = trace.timeline(_cpu_trace())
    mine = trace_waits.exchanged(tl, 0, HYBRID_GROUPS[0], "host")
    gather, rs, ar = "all_gather_fwd", "reduce_scatter", "all_reduce"
    peers = [_peer(1, {gather: [(20.0, 29.0)], rs: [(65.0, 71.0)], ar: [(82.0, 84.0)]}),
             _peer(2, {gather: [(17.0, 29.0)], rs: [(65.0, 71.0)], ar: [(80.0, 84.0)]}),
             _peer(3, {gather: [(25.0, 29.0)], rs: [(70.0, 71.0)], ar: [(83.0, 84.0)]})]
    trace_waits.set_waits(tl, mine, [mine, *peers])
    got = trace_split.split(tl)
    assert got["parts"]["waiting"] == pytest.approx(8e-6)
    assert got["waiting_by_kind"] == pytest.approx({gather: 4e-6, "all_gather_bwd": 0.0, rs: 0.0, ar: 4e-6})
    assert got["parts"]["exposed_all_gather_fwd"] == pytest.approx(9e-6)
    assert got["waiting_duration_rule"] == pytest.approx(8e-6)
    assert got["premise"] == {"checked": 3, "contradicted": 0, "at_stake_s": 0.0}
    assert {k: v["ranks"] for k, v in got["collectives"].items()} == {gather: 2, rs: 2, ar: 2}


def test_arrivals_on_one_clock_read_the_wait_where_the_durations_mislead() -> None:
    """Rank 1 arrived at the all-gather 4 us after rank 0 but, slowed, left it 6 us after: by durations
    (13 against its 15) rank 0 waited not at all, and rank 1, the one waited for, 2 us. On one host's
    clock the arrivals say rank 0 waited 4 us, and the collective is counted as contradicting the
    duration rule, with 4 us at stake. On two hosts' clocks (no arrival compares) the duration rule is
    all there is."""
    flights = {"all_gather_fwd": [(20.0, 35.0)], "reduce_scatter": [(65.0, 71.0)]}
    got = {}
    for host in ("host", "another host"):
        tl = trace.timeline(_cpu_trace())
        mine = trace_waits.exchanged(tl, 0, {**HYBRID_GROUPS[0], "all_reduce": [0]}, "host")
        trace_waits.set_waits(tl, mine, [mine, _peer(1, flights, host)])
        got[host] = trace_split.split(tl)
    shared, apart = got["host"], got["another host"]
    assert shared["parts"]["waiting"] == pytest.approx(4e-6) and shared["waiting_duration_rule"] == 0
    assert shared["premise"] == {"checked": 2, "contradicted": 1, "at_stake_s": pytest.approx(4e-6)}
    assert apart["parts"]["waiting"] == 0 and apart["premise"]["checked"] == 0


def test_a_group_whose_ranks_disagree_on_a_kinds_count_gets_no_waits() -> None:
    tl = trace.timeline(_cpu_trace())
    mine = trace_waits.exchanged(tl, 0, HYBRID_GROUPS[0], "host")
    peer = _peer(1, {"all_gather_fwd": [(20.0, 29.0), (40.0, 45.0)], "reduce_scatter": [(60.0, 71.0)]})
    trace_waits.set_waits(tl, mine, [mine, peer])
    got = trace_split.split(tl)
    assert got["unmatched"] == 1 and got["waiting_by_kind"]["all_gather_fwd"] == 0


# --- the GPU path, on a trace in the shape torch.profiler writes on CUDA: host ops and ranges on the
# Python thread (cpu_op, user_annotation), cudaLaunchKernel (cuda_runtime) with a correlation id, and
# each kernel (cat "kernel", pid the device, tid and args.stream its stream) with the same correlation


def _gpu_trace() -> dict:
    """One step of 100 us: compute 0-40 on stream 7 with an all-gather on stream 20 at 10-30 (hidden)
    and one at 40-60 (exposed, nothing computes), compute 60-80, a reduce-scatter 80-90 (exposed), the
    optimizer's kernel 92-96, an all-reduce 96-98 (exposed), the all-gather's copy-out 98-100 (launched in
    FSDP's all-gather range: local work), idle otherwise. The backward's ranges, ops and launches are on
    autograd's own thread (101), as on CUDA."""
    host, tid, autograd = [], 100, 101
    ev = [{"ph": "X", "cat": "user_annotation", "name": trace.STEP_RANGE, "pid": 1, "tid": tid, "ts": 1000.0,
           "dur": 100.0},
          {"ph": "X", "cat": "user_annotation", "name": "FSDP::all_gather (model.layers.1)", "pid": 1,
           "tid": tid, "ts": 1000.8, "dur": 1.0},
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
                1090.7),
               ("void at::native::split_with_sizes_copy_out_kernel", 7, 1098.0, 2.0, 1001.6)]

    def thread(ts: float) -> int:
        return autograd if 1035.0 <= ts < 1085.0 else tid
    for name, ts, dims, types in ops:
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": thread(ts), "ts": ts,
                   "dur": 1.0, "args": {"Input Dims": dims, "Input type": types}})
    for corr, (name, stream, ts, dur, launched) in enumerate(kernels):
        host.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                     "tid": thread(launched),
                     "ts": launched, "dur": 0.1, "args": {"correlation": corr, "cbid": 211}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                   "args": {"device": 0, "stream": stream, "correlation": corr, "External id": corr}})
    return {trace.META_KEY: {"torch": torch.__version__}, "traceEvents": ev + host}


def test_the_gpu_split_from_kernels_on_their_streams() -> None:
    got = _alone(trace.timeline(_gpu_trace()))
    us = 1e-6
    assert got["device"] == "gpu" and got["unclassified"] == 0
    assert got["parts"] == pytest.approx({"compute": 60 * us, "exposed_all_gather_fwd": 0.0,
                                          "exposed_all_gather_bwd": 20 * us,
                                          "exposed_reduce_scatter": 10 * us,
                                          "exposed_all_reduce": 2 * us, "waiting": 0.0,
                                          "collective_copies": 2 * us, "optimizer": 4 * us, "other": 2 * us})
    assert got["overlapped"]["all_gather_fwd"] == pytest.approx(20 * us)
    assert got["collectives"]["all_gather_fwd"] == {"bytes": 2048, "s": pytest.approx(20 * us), "wait_s": 0.0,
                                                    "count": 1, "ranks": None}
    assert got["collectives"]["reduce_scatter"]["bytes"] == 2048  # the unreduced input, fp32
    assert got["collectives"]["all_reduce"]["bytes"] == 512  # 256 bf16 elements: the type from the kernel


def test_a_peer_that_came_late_is_waiting_on_a_gpu() -> None:
    """The same step where a peer (another host: no shared clock) spent 5 us in the exposed all-gather:
    this rank's first 15 us of its 20 waited for it, by the duration rule."""
    tl = trace.timeline(_gpu_trace())
    mine = trace_waits.exchanged(tl, 0, None, "host")
    peer = {**mine, "rank": 1, "host": "another host",
            "flights": {**mine["flights"], "all_gather_bwd": [(1055.0, 1060.0)]}}
    trace_waits.set_waits(tl, mine, [mine, peer])
    parts = trace_split.split(tl)["parts"]
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
    perf_counter timed within 5%, compute with the optimizer and FSDP's copies is the time some kernel
    ran in it, and nothing is exposed."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    record = path.with_name(path.name.replace(".pt.trace.json.gz", ".trace_record.json"))
    timed = json.loads(record.read_text())["step_times_s"]
    tl = trace.timeline(data)
    got = _alone(tl)
    assert got["steps"] == len(timed) == 1 and got["device"] == "gpu" and got["unclassified"] == 0
    assert sum(got["parts"].values()) == pytest.approx(got["step_s"])
    assert abs(got["step_s"] / statistics.mean(timed) - 1) <= 0.05, (got["step_s"], timed)
    (start, end), = tl.windows
    kernels = [(max(e["ts"], start), min(e["ts"] + e["dur"], end)) for e in data["traceEvents"]
               if e.get("cat") == "kernel" and e["ts"] < end and e["ts"] + e["dur"] > start]
    busy = _union(kernels) / 1e6
    local = got["parts"]["compute"] + got["parts"]["optimizer"] + got["parts"]["collective_copies"]
    assert local == pytest.approx(busy, rel=1e-6)
    assert got["parts"]["optimizer"] > 0  # AdamW's kernels, told apart by their launches' correlation
    assert got["parts"]["collective_copies"] > 0  # FSDP's gradient copies and division, in its reduce range
    assert _exposed(got) == 0 and got["parts"]["waiting"] == 0  # one rank sends nothing


def test_a_trace_that_cannot_be_written_leaves_the_steps_and_says_why(tmp_path: Path) -> None:
    """A write that fails (a full disk; here a file where the trace's folder should be) keeps the steps'
    times, leaves no half-written file, and the split's reason names the folder; the ranks still meet in
    the exchange, so none waits for a peer that gave up."""
    blocker = tmp_path / "trace"
    blocker.write_text("a file, not a folder")
    ran: list[int] = []
    times, why = trace_record.record(ran.append, range(3, 5), blocker / "rank0.pt.trace.json.gz", False, {})
    assert ran == [3, 4] and len(times) == 2 and all(t >= 0 for t in times)
    assert why is not None and why.startswith(f"trace not written to {blocker}")
    assert blocker.read_text() == "a file, not a folder"
    exchanged: list[object] = []
    split, error = trace_split.analyse(None, lambda mine: exchanged.append(mine) or [mine])
    assert split is None and error is None and exchanged == [None]
    kept = tmp_path / "ok" / "rank0.pt.trace.json.gz"
    _, none = trace_record.record(ran.append, range(5, 6), kept, False, {})
    assert none is None and kept.stat().st_size > 0


def test_a_trace_is_written_compressed_whole_and_nothing_else_is_left(tmp_path: Path, monkeypatch) -> None:
    """The trace torch exports, gzip-compressed at our level (not torch's 9) into its .gz name: the same
    JSON read back, and no uncompressed file beside it or in the temporary directory it was exported to,
    whether the export succeeds or fails."""
    import tempfile
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    class Profiler:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def export_chrome_trace(self, path: str) -> None:
            events = [{"name": "x" * 50, "ts": i} for i in range(999)]
            Path(path).write_text(json.dumps({"traceEvents": events}))
            if self.fail:
                raise OSError(28, "No space left on device")
    path = tmp_path / "trace" / "rank0.pt.trace.json.gz"
    path.parent.mkdir()
    trace_record.write_compressed(Profiler(False), path)
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert len(events) == 999 and events[998]["ts"] == 998
    assert path.read_bytes()[8] != 2  # gzip's header (XFL) says 2 where it was written at level 9, torch's
    assert [p.name for p in path.parent.iterdir()] == [path.name] and not list(scratch.iterdir())
    with pytest.raises(OSError):
        trace_record.write_compressed(Profiler(True), tmp_path / "trace" / "rank1.pt.trace.json.gz")
    assert [p.name for p in path.parent.iterdir()] == [path.name] and not list(scratch.iterdir())
