"""`python -m nccl.probe`: an all-reduce bandwidth sweep with torch.distributed, for machines without
nccl-tests (gloo on CPU, nccl on GPU). It reports the same fields with nccl-tests' definitions:

    algbw = bytes / time        busbw = algbw * 2(n-1)/n        (GB/s = 1e9 bytes/s)

time is the mean over `nccl_iters` timed iterations after warm-up, averaged over ranks (nccl-tests'
default). torch's all_reduce works in place, so every row is an in-place row. After timing, one
all-reduce of known values (rank+1) is checked and mismatches are counted as #wrong.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.core.records import Emitter, exit_now
from bench.core.schema import add_fault_arguments, add_spec_arguments, spec_from_namespace
from nccl.command import busbw_factor, expected_network

WARMUP_ITERS = 5


def sizes(min_bytes: int, max_bytes: int, elem_bytes: int = 4) -> list[int]:
    """Message sizes doubling from min to max, rounded to whole float32 elements."""
    out, size = [], max(min_bytes, elem_bytes)
    while size <= max_bytes:
        out.append(size - size % elem_bytes)
        size *= 2
    return out


def _time_allreduce(tensor: torch.Tensor, iters: int, device: torch.device) -> float:
    for _ in range(WARMUP_ITERS):
        dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - t0) / iters
    mean = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


def _count_wrong(tensor: torch.Tensor) -> int:
    n = dist.get_world_size()
    tensor.fill_(dist.get_rank() + 1)
    dist.all_reduce(tensor)
    return int((tensor != n * (n + 1) / 2).sum().item())


def measure(size: int, iters: int, device: torch.device) -> dict[str, Any]:
    """One row: time, algbw, busbw and #wrong for a message of `size` bytes."""
    n = dist.get_world_size()
    tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
    time_s = _time_allreduce(tensor, iters, device)
    algbw = size / time_s / 1e9
    return {"size": size, "count": size // 4, "dtype": "float", "redop": "sum", "placement": "in-place",
            "time_us": time_s * 1e6, "algbw": algbw, "busbw": algbw * busbw_factor(n),
            "wrong": _count_wrong(tensor)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nccl.probe", description=__doc__)
    add_spec_arguments(parser)
    parser.add_argument("--run-dir", type=Path, default=None)
    add_fault_arguments(parser)
    ns = parser.parse_args(argv)
    if ns.fault == "sleep":  # test mode of the scheduling tests: a fixed duration, no work (as trainer/__main__)
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
    if rank == 0:
        emit("meta", spec=spec.to_dict(), world_size=n, backend=backend, host=socket.gethostname(),
             torch=torch.__version__, device_name=torch.cuda.get_device_name(device) if cuda else "cpu",
             expected_network=expected_network(spec.efa_per_node) if cuda else None)
    rows = []
    for i, size in enumerate(sizes(spec.nccl_min_bytes, spec.nccl_max_bytes)):
        if ns.fault == "hang" and i == ns.fault_step:
            time.sleep(10**6)
        if ns.fault == "crash" and i == ns.fault_step:
            raise SystemExit(f"injected crash at size index {i} (test fault)")
        row = measure(size, spec.nccl_iters, device)
        rows.append(row)
        if rank == 0:
            emit("nccl", **row)
    if rank == 0:
        wrong = sum(r["wrong"] for r in rows)
        emit("summary", status="ok" if wrong == 0 else "failed",
             error=None if wrong == 0 else f"all-reduce returned {wrong} wrong elements",
             source="torch.distributed", transport=backend if not cuda else None, ranks=n, backend=backend,
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
