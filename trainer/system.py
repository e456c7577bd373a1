"""`python -m trainer.system`: this node's `system` record (bench/core/system.py: GPU, driver, CUDA, NCCL,
libfabric, aws-ofi-nccl, EFA devices, topology, instance type, image, versions, git, the NCCL/FI/TORCH/...
environment; each fact a value or {"missing": why}) on stdout, and in the run's records with --run-dir.

The trainer and the torch probe write theirs themselves at start; a launcher runs this command on each node
before an nccl-tests binary, which writes none (bench/launchers/slurm_script.py, k8s_manifests.py). It
reads its GPU as the trainer does: this process's LOCAL_RANK device, through CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from bench.core.records import Emitter
from bench.core.system import emit_record


def local_device() -> int | None:
    """This process's CUDA device (LOCAL_RANK's), None where there is no GPU."""
    return int(os.environ.get("LOCAL_RANK", "0")) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.system", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-id", default="system", help="the run the record belongs to")
    parser.add_argument("--source", default="trainer.system", help="who ran it (nccl-tests, a launcher)")
    parser.add_argument("--run-dir", type=Path, default=None, help="also append it to the run's records")
    args = parser.parse_args(argv)
    emit = Emitter(int(os.environ.get("RANK", "0")), args.run_id, args.run_dir)
    try:
        emit_record(emit, torch, local_device(), args.source)
    finally:
        emit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
