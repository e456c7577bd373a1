"""The worker's entry point (`python -m trainer`): the process's start-up (arguments, device, process group),
one run through the Trainer (trainer/trainer.py), and every failure turned into a status.

Exit codes: 0 ok, 2 bad arguments (before any process group), 3 oom, 4 nan_loss, 5 rendezvous_error,
1 anything else. The summary record carries the status; the exit code is for launchers that see only it.
"""
from __future__ import annotations

import datetime as dt
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.core.records import COLLECTIVE_TIMEOUT_ENV, Emitter, process_start_time
from bench.core.warm import STARTED_ENV
from trainer.config import TrainArgs, parse_args
from trainer.flight import adopt_buffer_env, dump_on_sigterm, write_dump
from trainer.nvml import NvmlSampler
from trainer.trainer import NanLoss, Trainer, memory_stats

EXIT_OK, EXIT_FAILED, EXIT_OOM, EXIT_NAN, EXIT_RDZV = 0, 1, 3, 4, 5


def rank_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and ("out of memory" in str(e).lower()
                                            or "can't allocate memory" in str(e).lower())


def init_process_group(device: torch.device) -> None:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    adopt_buffer_env(torch.__version__)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # NCCL's watchdog (or gloo's wait) fails a collective that waits longer; the harness sets it below its
    # run timeout so the ranks still write their flight-recorder dumps (trainer/flight.py)
    timeout = float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, 600))
    kwargs: dict[str, Any] = {"timeout": dt.timedelta(seconds=timeout)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(backend, **kwargs)


def since_process_start() -> float | None:
    """Seconds since this process started, from Linux's /proc (the interpreter's start and every import
    before the caller included); None where there is no /proc."""
    ticks = process_start_time()
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if ticks is None else max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def train_run(args: TrainArgs, device: torch.device, emit: Emitter,
              startup: dict[str, float | None] | None = None, stamps: dict[str, float] | None = None) -> int:
    """One run in this (initialised) process group: set up, train, summarise; every failure a status in a
    summary record. Returns the exit code. The meta record carries where its start-up went (`startup`: the
    process's start to main, the arguments, the process group; then the model's setup), as a GPU launch
    costs 20-26 s beyond its steps where a CPU one costs 6 (the H200's evidence, benchmarks/evidence/); the
    summary carries the same moments as wall-clock times (`timeline`: benchmarks/run_cost.py reads them)."""
    stamps = stamps if stamps is not None else {}
    rank = dist.get_rank()
    if dist.get_world_size() != args.spec.world_size:
        emit("summary", status="rendezvous_error",
             error=f"world size {dist.get_world_size()} != nodes x gpus_per_node = {args.spec.world_size}")
        return EXIT_RDZV
    sampler = NvmlSampler(device.index if device.type == "cuda" else None, args.nvml_interval_s,
                          lambda s: emit("nvml", **s))
    trainer = Trainer(args, device, emit)
    trainer.meter = sampler
    from bench.core.system import emit_record  # this node's system record, from its local rank 0
    emit_record(emit, torch, device.index if device.type == "cuda" else None, "trainer")
    try:
        began = time.monotonic()
        trainer.setup()
        startup = {**(startup or {}), "setup_s": time.monotonic() - began}
        stamps["setup"] = time.time()
        emit("meta", **trainer.meta(), nvml_available=sampler.available, nvml_reason=sampler.reason,
             records_file_error=emit.file_error, startup=startup)
        if args.instrument:
            sampler.start()
        trainer.train()
        stamps["steps"] = time.time()
        trainer.trace()
        stamps["trace"] = time.time()
        summary = trainer.summary(sampler.stop())
        if rank == 0:
            emit("summary", **summary, timeline={**stamps, "summary": time.time()})
        for undo in trainer.restore:
            undo()
        return EXIT_OK
    except Exception as e:
        sampler.stop()
        for undo in trainer.restore:
            undo()
        write_dump(rank)  # this rank's collectives when it failed (kept if NCCL's watchdog wrote one)
        code, status = (EXIT_OOM, "oom") if _is_oom(e) else (
            (EXIT_NAN, "nan_loss") if isinstance(e, NanLoss) else (EXIT_FAILED, "failed"))
        emit("summary", status=status, error=f"{type(e).__name__}: {e}", failed_step=len(trainer.step_times),
             losses=trainer.losses, traceback=traceback.format_exc(limit=8), **memory_stats(device))
        return code


def main(argv: list[str] | None = None) -> int:
    to_main = since_process_start()
    stamps = {"main": time.time()}
    if to_main is not None:
        stamps["process_start"] = stamps["main"] - to_main
    args = parse_args(argv)  # exits 2 on bad input, before anything distributed starts
    stamps["args"] = time.time()
    device = rank_device()
    rank = int(os.environ.get("RANK", "0"))
    emit = Emitter(rank, args.spec.run_id, args.run_dir)
    began = time.monotonic()
    try:
        init_process_group(device)
    except Exception as e:
        emit("summary", status="rendezvous_error", error=f"{type(e).__name__}: {e}")
        return EXIT_RDZV
    startup = {"to_main_s": to_main, "args_s": stamps["args"] - stamps["main"],
               "process_group_s": time.monotonic() - began,
               "warm": os.environ.get(STARTED_ENV) == "1"}  # forked by the sweep's warm process
    stamps["process_group"] = time.time()
    dump_on_sigterm(rank)  # stopped by the harness or by torchrun: leave the flight recorder's dump
    try:
        code = train_run(args, device, emit, startup, stamps)
    finally:
        emit.close()
    if code == EXIT_OK:
        dist.barrier()  # no rank tears gloo/NCCL down while a peer still uses it (SIGABRT otherwise)
        dist.destroy_process_group()
    return code
