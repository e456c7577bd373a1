"""`python -m nccl.probe`: a bandwidth sweep of one collective (`--collective`: all_reduce, all_gather or
reduce_scatter) with torch.distributed, for machines without nccl-tests (gloo on CPU, nccl on GPU). It
reports the same fields with nccl-tests' definitions (doc/PERFORMANCE.md):

    algbw = bytes / time        busbw = algbw * 2(n-1)/n (all-reduce), algbw * (n-1)/n (the others)

bytes being the whole tensor: the all-reduced one, the gathered output, the reduce-scatter's input (n
shards of size/n). time is the mean over `nccl_iters` timed iterations after warm-up, averaged over ranks
(nccl-tests' default). The sizes are the doubling sweep plus the study's own (`--nccl-sizes`), each
rounded down to whole float32 elements n shards can split. torch's all_reduce works in place, so every
all-reduce row is an in-place row; the gather and reduce-scatter write a separate output (out-of-place).
After timing, one collective of known values (rank+1) is checked and mismatches are counted as #wrong.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import time
from pathlib import Path
from typing import Any

from bench.core.warm import run_warm

if __name__ == "__main__":
    run_warm("nccl.probe")  # in the local sweep's warm process, where it has one; it exits as the probe did

import torch  # noqa: E402  (after the hand-off: a warm probe never imports it itself)
import torch.distributed as dist  # noqa: E402

from bench.core.records import Emitter, exit_now  # noqa: E402
from bench.core.schema import add_fault_arguments, add_spec_arguments, spec_from_namespace  # noqa: E402
from bench.probes.command import busbw_factor, expected_network  # noqa: E402

WARMUP_ITERS = 5


def sizes(min_bytes: int, max_bytes: int, elem_bytes: int = 4, shards: int = 1,
          extra: tuple[int, ...] = ()) -> list[int]:
    """Message sizes doubling from min to max, and the `extra` (study) sizes, ascending, each rounded down
    to whole float32 elements that `shards` ranks split evenly (a gather's or reduce-scatter's shards)."""
    unit = elem_bytes * shards
    out, size = set(), max(min_bytes, unit)
    while size <= max_bytes:
        out.add(size)
        size *= 2
    out.update(s for s in extra if s >= unit)
    return sorted({s - s % unit for s in out})


class _Collective:
    """One collective on float32 tensors of `size` bytes in all: its input, output and checked result."""

    def __init__(self, kind: str, size: int, device: torch.device) -> None:
        self.kind, n = kind, dist.get_world_size()
        count = size // 4
        shard = count // n
        self.input = torch.ones(shard if kind == "all_gather" else count, dtype=torch.float32, device=device)
        self.output = (torch.empty(count, dtype=torch.float32, device=device) if kind == "all_gather" else
                       torch.empty(shard, dtype=torch.float32, device=device) if kind == "reduce_scatter"
                       else self.input)

    def run(self) -> None:
        if self.kind == "all_gather":
            GATHER(self.output, self.input)
        elif self.kind == "reduce_scatter":
            SCATTER(self.output, self.input)
        else:
            dist.all_reduce(self.input)

    def count_wrong(self) -> int:
        """Run once on rank+1 everywhere: a gather holds each rank's value in its shard, a reduction the
        sum n(n+1)/2."""
        n, rank = dist.get_world_size(), dist.get_rank()
        self.input.fill_(rank + 1)
        self.run()
        if self.kind == "all_gather":
            want = torch.arange(1, n + 1, dtype=torch.float32, device=self.output.device)
            want = want.repeat_interleave(self.output.numel() // n)
            return int((self.output != want).sum().item())
        return int((self.output != n * (n + 1) / 2).sum().item())


# The single-tensor collectives under their torch >= 2.13 names (the older ones warn there, on every call's
# first use in a process); torch 2.11 has the older names only.
GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _time(op: _Collective, iters: int, device: torch.device) -> float:
    for _ in range(WARMUP_ITERS):
        op.run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        op.run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - t0) / iters
    mean = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


def measure(size: int, iters: int, device: torch.device, collective: str = "all_reduce") -> dict[str, Any]:
    """One row: time, algbw, busbw and #wrong for a collective over `size` bytes in all."""
    n = dist.get_world_size()
    op = _Collective(collective, size, device)
    time_s = _time(op, iters, device)
    algbw = size / time_s / 1e9
    return {"size": size, "count": size // 4, "dtype": "float",
            "redop": "none" if collective == "all_gather" else "sum",
            "placement": "in-place" if collective == "all_reduce" else "out-of-place",
            "time_us": time_s * 1e6, "algbw": algbw, "busbw": algbw * busbw_factor(n, collective),
            "wrong": op.count_wrong()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nccl.probe", description=__doc__)
    add_spec_arguments(parser)
    parser.add_argument("--run-dir", type=Path, default=None)
    add_fault_arguments(parser)
    ns = parser.parse_args(argv)
    # test mode of the scheduling tests: a fixed duration, no work (as trainer/__main__)
    if ns.fault == "sleep":
        print(f"fsdpbench test mode: sleeping {ns.fault_seconds:g} s, from {time.time():.3f}", flush=True)
        time.sleep(ns.fault_seconds)
        print(f"fsdpbench test mode: slept until {time.time():.3f}", flush=True)
        return 0
    try:
        spec = spec_from_namespace(ns)
    except ValueError as e:
        parser.error(str(e))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    emit = Emitter(int(os.environ.get("RANK", "0")), spec.run_id, ns.run_dir)
    backend = "nccl" if cuda else "gloo"
    try:
        dist.init_process_group(backend, timeout=dt.timedelta(minutes=5))
    except Exception as e:  # noqa: BLE001 - any failure to rendezvous is recorded as such, not raised
        emit("summary", status="rendezvous_error", error=f"{type(e).__name__}: {e}")
        return 5
    rank, n = dist.get_rank(), dist.get_world_size()
    from bench.core.system import emit_record  # this node's system record, from its local rank 0
    emit_record(emit, torch, device.index if cuda else None, "nccl.probe")
    if rank == 0:
        emit("meta", spec=spec.to_dict(), world_size=n, backend=backend, host=socket.gethostname(),
             torch=torch.__version__, device_name=torch.cuda.get_device_name(device) if cuda else "cpu",
             expected_network=expected_network(spec.efa_per_node) if cuda else None)
    rows = []
    shards = 1 if spec.collective == "all_reduce" else n
    for i, size in enumerate(sizes(spec.nccl_min_bytes, spec.nccl_max_bytes, shards=shards,
                                   extra=spec.study_sizes)):
        if ns.fault == "hang" and i == ns.fault_step:
            time.sleep(10**6)
        if ns.fault == "crash" and i == ns.fault_step:
            raise SystemExit(f"injected crash at size index {i} (test fault)")
        row = measure(size, spec.nccl_iters, device, spec.collective)
        rows.append(row)
        if rank == 0:
            emit("nccl", **row)
    if rank == 0:
        wrong = sum(r["wrong"] for r in rows)
        emit("summary", status="ok" if wrong == 0 else "failed",
             error=None if wrong == 0 else f"{spec.collective} returned {wrong} wrong elements",
             source="torch.distributed", collective=spec.collective,
             transport=backend if not cuda else None, ranks=n, backend=backend,
             busbw_avg_gbs=sum(r["busbw"] for r in rows) / len(rows),
             busbw_max_gbs=max(r["busbw"] for r in rows), algbw_max_gbs=max(r["algbw"] for r in rows),
             sizes=[{k: r[k] for k in ("size", "time_us", "algbw", "busbw", "wrong")} for r in rows],
             host=socket.gethostname(), torch_version=torch.__version__,
             device_name=torch.cuda.get_device_name(device) if cuda else "cpu")
    emit.close()
    dist.barrier()  # see trainer.main: tear down only when every rank is done
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
