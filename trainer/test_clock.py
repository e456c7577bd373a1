"""The compute clock (trainer/clock.py) on real gloo FSDP2 ranks: a rank whose first block takes 0.1 s
longer in its forward and whose last block takes 0.1 s longer in its backward is 0.2 s a step slower in
compute, and its peer, which waits that long in FSDP's collectives (the forward's and the backward's
all-gathers), is not."""
from __future__ import annotations

import os
import sys
import time

import pytest

from bench.core.records import format_record
from bench.core.warm import run_warm
from bench.run import straggler
from trainer.config import parse_args

SLEEP_S = 0.1  # rank 1: its first block's every forward, its last block's every backward
ARGS = ["--model", "tiny_llama", "--nodes", "1", "--gpus-per-node", "2", "--precision", "fp32",
        "--steps", "4", "--warmup-steps", "1", "--seq-len", "64", "--micro-batch", "2"]


@pytest.fixture(scope="module")
def lagging() -> dict:
    from conftest import run_torchrun
    result = run_torchrun(["trainer.test_clock", *ARGS], nproc=2, timeout=300)
    records = [r for r in result.records if r["kind"] == "summary"]
    assert result.returncode == 0 and len(records) == 1, result.output[-3000:]
    return records[0]


def test_a_rank_is_timed_without_the_time_it_waited_for_its_peer(lagging) -> None:
    ranks = {r["rank"]: r for r in lagging["per_rank"]}
    slow, waited = ranks[1]["compute_s"], ranks[0]["compute_s"]
    assert 0 < waited < slow < lagging["step_time_s"]
    assert slow - waited == pytest.approx(2 * SLEEP_S, abs=0.04)  # both sleeps are in rank 1's compute
    # rank 0's step is as long as rank 1's: the 0.2 s it waited is in its step, not in its compute
    assert lagging["step_time_s"] - waited > 1.8 * SLEEP_S


def test_the_lagging_rank_is_named_with_what_it_cost(lagging) -> None:
    found = straggler.find(lagging["per_rank"], tolerance=0.25)
    assert found is not None and found.named and found.unit.endswith("rank 1")
    assert found.held_s == pytest.approx(2 * SLEEP_S, abs=0.04)
    assert straggler.find(lagging["per_rank"][:1], tolerance=0.25) is None  # one unit: nobody to hold back
    # ranks of one host's CPU time each other's time slices: measured, not named there
    on_cpu = straggler.find(lagging["per_rank"], tolerance=0.25, name_ranks=False)
    assert on_cpu is not None and on_cpu.held_s == found.held_s and not on_cpu.named


def test_nodes_are_as_slow_as_their_slowest_rank_and_compared_with_the_others() -> None:
    ranks = [{"node": n, "rank": i, "compute_s": s}
             for i, (n, s) in enumerate([("a", 1.0), ("a", 1.1), ("b", 1.0), ("b", 1.05), ("c", 1.6),
                                         ("c", 1.0)])]
    found = straggler.find(ranks, tolerance=0.25)
    assert found is not None and (found.unit, found.named) == ("c", True)
    assert found.held_s == pytest.approx(1.6 - 1.075) and found.excess == pytest.approx(1.6 / 1.075 - 1)
    assert not straggler.find(ranks[:4], tolerance=0.25).named  # a 5% spread is no straggler
    assert straggler.find([{"node": "a", "rank": 0, "compute_s": None}] * 2, tolerance=0.25) is None


def _lag(args: list[str]) -> None:
    """Under torchrun: the worker's Trainer, rank 1's first block sleeping inside its forward (a pre-hook
    after the clock's) and its last block inside its backward (its MLP's); one record with every rank's
    figures."""
    import torch.distributed as dist

    from bench.core.records import Emitter, exit_now
    from trainer.clock import ComputeClock, timed_modules
    from trainer.main import init_process_group, rank_device
    from trainer.model import transformer_blocks
    from trainer.trainer import Trainer
    parsed = parse_args(args)
    device = rank_device()
    init_process_group(device)
    trainer = Trainer(parsed, device, Emitter(dist.get_rank(), parsed.spec.run_id, None))
    trainer.setup()
    if trainer.clock is None:  # one rank (trainer/test_gpu.py): nobody to wait for, the clock alone
        trainer.clock = ComputeClock(timed_modules(trainer.model), device)
    if dist.get_rank() == 1:
        parent, _, i = transformer_blocks(trainer.model)[0]
        parent[i].register_forward_pre_hook(lambda *_: time.sleep(SLEEP_S))
        last, _, j = transformer_blocks(trainer.model)[-1]  # the first backward: its peer waits in the next
        last[j].mlp.register_full_backward_hook(lambda *_: time.sleep(SLEEP_S))
    trainer.train()
    summary = trainer.summary({})
    if dist.get_rank() == 0:
        print(format_record("summary", per_rank=summary["per_rank"], step_time_s=summary["step_time_s"],
                            device=str(device)), flush=True)
    dist.barrier()
    exit_now(0)


if __name__ == "__main__":
    run_warm("trainer.test_clock")  # in the session's warm process (conftest.py)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _lag(sys.argv[1:])
