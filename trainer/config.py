"""Command-line arguments of the worker, validated into a RunSpec before any process group starts."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from bench.core.schema import (
    TRACE_RANKS,
    RunSpec,
    add_fault_arguments,
    add_spec_arguments,
    spec_from_namespace,
)


@dataclass(frozen=True)
class TrainArgs:
    spec: RunSpec
    run_dir: Path | None
    instrument: bool  # per-step records and the NVML sampler; off only for the overhead benchmark
    nvml_interval_s: float
    attn_impl: str
    fault: str  # test hook: inject a failure at fault_step ("oom" raises torch.OutOfMemoryError)
    fault_step: int
    fault_rank: int  # -1: every rank; else only this global rank (a lagging rank)
    lr: float
    fault_seconds: float = 0.0  # slow_collective, slow_compute: the delay
    fault_collective: str = "all_gather"  # slow_collective: which one
    trace_steps: int = 0  # profiled steps after the timed ones (trainer/trace_record.py); 0: no trace
    trace_ranks: str = "all"  # which ranks record one: all, or per_node (each node's local rank 0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    add_spec_arguments(p)
    p.add_argument("--run-dir", type=Path, default=None, help="also write metric records here")
    p.add_argument("--no-instrument", action="store_true", help="no step records, no NVML sampler")
    p.add_argument("--nvml-interval-s", type=float, default=1.0)
    p.add_argument("--attn-impl", default="sdpa", choices=("sdpa", "eager"))
    add_fault_arguments(p)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--trace-steps", type=int, default=0,
                   help="steps recorded with torch.profiler after the timed ones (0: none)")
    p.add_argument("--trace-ranks", default="all", choices=TRACE_RANKS, help="which ranks write a trace")
    return p


def spec_of(argv: list[str]) -> RunSpec:
    """The spec an argument list names, neither validated nor counted (parse_args does both when the run
    starts): what a caller that only needs its run id asks, without counting a brought model's census."""
    return spec_from_namespace(_parser().parse_args(argv))


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Parse and validate; exits with status 2 and one clear line on bad input."""
    parser = _parser()
    ns = parser.parse_args(argv)
    try:
        spec = spec_from_namespace(ns)
        if spec.model_config:  # a brought family with no formula: counted from the model itself
            from trainer.census import ensure
            ensure(spec.model_config)
        arch = spec.arch
        if spec.kind != "train":
            raise ValueError("the trainer runs kind=train specs; nccl probes run `python -m nccl.probe`")
        if spec.micro_batch < 1:
            raise ValueError("micro_batch must be >= 1 (auto is resolved by the sweep before launch)")
        if spec.seq_len > arch.max_seq_len:
            raise ValueError(f"seq_len {spec.seq_len} exceeds {spec.model}'s maximum {arch.max_seq_len}")
        if ns.nvml_interval_s <= 0:
            raise ValueError("--nvml-interval-s must be > 0")
        if ns.trace_steps < 0:
            raise ValueError("--trace-steps must be >= 0")
    except ValueError as e:
        parser.error(str(e))
    return TrainArgs(spec=spec, run_dir=ns.run_dir, instrument=not ns.no_instrument,
                     nvml_interval_s=ns.nvml_interval_s, attn_impl=ns.attn_impl, fault=ns.fault,
                     fault_step=ns.fault_step, fault_rank=ns.fault_rank, lr=ns.lr,
                     fault_seconds=ns.fault_seconds, fault_collective=ns.fault_collective,
                     trace_steps=ns.trace_steps, trace_ranks=ns.trace_ranks)

