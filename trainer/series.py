"""`python -m trainer.series ARGVS_JSON`: several worker runs, one after another, in one process group.

Each element of the JSON list is one `python -m trainer` argument list; each run goes through the worker's
own `train_run` (the same Trainer, records and statuses) and its records carry its own run id. What it
saves is the start-up of a worker per run (importing torch and transformers, the rendezvous): the tests
train dozens of small configurations on 2 cores, and a torchrun per configuration cost most of their time.
A sweep never uses it: its runs are separate jobs with their own timeouts and failures.
"""
from __future__ import annotations

import json
import os
import sys

from bench.core.warm import run_warm

if __name__ == "__main__":
    run_warm("trainer.series")  # in the tests' warm process, where they have one (conftest.run_torchrun)

import torch.distributed as dist  # noqa: E402

from bench.core.records import Emitter, exit_now  # noqa: E402
from trainer.config import parse_args  # noqa: E402
from trainer.main import EXIT_OK, init_process_group, rank_device, train_run  # noqa: E402


def main(argv: list[str]) -> int:
    runs = [parse_args(args) for args in json.loads(argv[0])]  # every argument list valid before any runs
    device = rank_device()
    init_process_group(device)
    rank, codes = int(os.environ.get("RANK", "0")), []
    for args in runs:
        emit = Emitter(rank, args.spec.run_id, args.run_dir)
        try:
            codes.append(train_run(args, device, emit))
        finally:
            emit.close()
        dist.barrier()
    dist.destroy_process_group()
    return next((code for code in codes if code != EXIT_OK), EXIT_OK)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
