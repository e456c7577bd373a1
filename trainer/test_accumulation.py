"""Gradient accumulation at one global batch, on real ranks: however a global batch is split (ranks x micro
batch x accumulation steps), under each sharding strategy and accumulation mode, a step trains the same
model on the same sequences; and each mode's collectives, counted by torch's flight recorder in the run
itself, are the ones its FSDP2 setting promises."""
from __future__ import annotations

import pytest

from bench.core.models import get_arch
from bench.core.schema import RunSpec
from conftest import SERIES

# the runs of conftest.Series train on one pytest-xdist worker: where every test that reads them runs
pytestmark = pytest.mark.xdist_group("series")

GLOBAL = 8  # sequences per optimizer step, in every run below
UNITS = get_arch("tiny_llama").layers + 1  # FSDP units: each block, and the root (embeddings, norm, output)


def _args(sharding: str, nodes: int, gpn: int, micro: int, mode: str,
          global_batch: int = GLOBAL) -> list[str]:
    return ["--model", "tiny_llama", "--sharding", sharding, "--nodes", str(nodes),
            "--gpus-per-node", str(gpn),
            "--precision", "fp32", "--steps", "3", "--warmup-steps", "1", "--seq-len", "64",
            "--micro-batch", str(micro), "--global-batch", str(global_batch), "--accumulation", mode]


# (sharding, nodes, GPUs per node) -> {micro batch: accumulation modes}: every split of GLOBAL that layout has
# (8 = 4 x 2 x 1 = 2 x 2 x 2 = 1 x 4 x 2 on two ranks), each in the modes that apply there. A split without
# accumulation (one micro-batch a step) runs each mode as the default: it is trained once, in sync_each (and
# once in sync_once, where the collectives' test shows that it is the same); on one rank and under
# SHARD_GRAD_OP the modes that change nothing there (one rank shards nothing; SHARD_GRAD_OP's middle split)
# are left to the other layouts
EACH, ONCE, KEPT, DEFERRED = "sync_each", "sync_once", "keep_gathered", "allreduce_once"
LAYOUTS = {("FULL_SHARD", 1, 1): {4: (EACH, ONCE), 2: (EACH, ONCE), 1: (EACH, ONCE)},
           ("FULL_SHARD", 1, 2): {4: (EACH, ONCE), 2: (EACH, ONCE, KEPT), 1: (EACH, ONCE, KEPT)},
           ("SHARD_GRAD_OP", 1, 2): {4: (EACH,), 1: (EACH, ONCE, KEPT)},
           ("NO_SHARD", 1, 2): {4: (EACH,), 2: (EACH, ONCE), 1: (EACH, ONCE)},
           ("HYBRID_SHARD", 2, 2): {2: (EACH,), 1: (EACH, ONCE, DEFERRED, KEPT)}}
RUNS = {(sharding, nodes, gpn, micro, mode): _args(sharding, nodes, gpn, micro, mode)
        for (sharding, nodes, gpn), micros in LAYOUTS.items()
        for micro, modes in micros.items() for mode in modes}
REFERENCE = ("FULL_SHARD", 1, 2, 4, "sync_each")  # no accumulation: one micro batch of 4 per rank
HALF_BATCH = _args("FULL_SHARD", 1, 2, 2, "sync_each", global_batch=4)  # other sequences: other losses
for (_, _nodes, _gpn, *_), _run_args in RUNS.items():
    SERIES.declare(_run_args, nproc=_nodes * _gpn)
SERIES.declare(HALF_BATCH, nproc=2)


@pytest.fixture(scope="module")
def runs() -> dict:
    out = {}
    for key, args in RUNS.items():
        run = SERIES.result(args, nproc=key[1] * key[2])
        assert run.summary["status"] == "ok", (key, run.output[-3000:])
        out[key] = run
    return out


def test_every_split_mode_and_strategy_trains_the_same_losses(runs) -> None:
    reference = runs[REFERENCE].summary["losses"]
    assert len(reference) == 3 and max(reference) - min(reference) > 1e-3  # the optimizer steps
    for key, run in runs.items():
        assert run.summary["losses"] == pytest.approx(reference, rel=1e-5), key


def test_the_losses_can_disagree(runs) -> None:
    """The check above can fail: half the global batch (other sequences, half as many) trains otherwise."""
    other = SERIES.result(HALF_BATCH, nproc=2).summary["losses"]
    assert other != pytest.approx(runs[REFERENCE].summary["losses"], rel=1e-5)


def test_each_run_accumulates_its_share_and_times_the_optimizer_step(runs) -> None:
    for (sharding, nodes, gpn, micro, mode), run in runs.items():
        spec = RunSpec(sharding=sharding, nodes=nodes, gpus_per_node=gpn, micro_batch=micro,
                       global_batch=GLOBAL, accumulation=mode)
        assert {m["grad_accum"] for m in run.of_kind("meta")} == {GLOBAL // (nodes * gpn * micro)}
        assert spec.sequences_per_step == GLOBAL
        s = run.summary
        # tokens per timed unit: the whole global batch, whatever the split
        assert s["tokens_per_s"] * s["step_time_s"] == pytest.approx(GLOBAL * 64, rel=1e-9)
        steps = [r for r in run.of_kind("step")]
        assert {r["tokens"] for r in steps} == {GLOBAL * 64} and {r["samples"] for r in steps} == {GLOBAL}


def _counts(run, group: str | None = None) -> dict[str, int]:
    """Collectives per step in one process group: a 1-D mesh over the world is the default group."""
    groups = run.summary["collectives_per_step"]
    return groups[group] if group else groups["default_pg" if "default_pg" in groups else "mesh_shard"]


def test_sync_once_reduces_each_unit_once_per_step_and_the_default_every_micro_batch(runs) -> None:
    """gloo runs FSDP2's reduce-scatter as an all-reduce of the whole gradient: one per FSDP unit it reduces.
    Four micro-batches of 1: the default reduces four times per step, sync_once once."""
    each, once = runs["FULL_SHARD", 1, 2, 1, "sync_each"], runs["FULL_SHARD", 1, 2, 1, "sync_once"]
    assert _counts(each)["all_reduce"] == 4 * UNITS
    assert _counts(once)["all_reduce"] == UNITS
    assert _counts(once)["all_gather"] == _counts(each)["all_gather"]  # gathers are not what it saves
    # no accumulation, no difference
    no_accumulation = runs["FULL_SHARD", 1, 2, 4, "sync_once"], runs["FULL_SHARD", 1, 2, 4, "sync_each"]
    assert _counts(no_accumulation[0]) == _counts(no_accumulation[1])


def test_keep_gathered_skips_the_forward_gathers_after_the_first_micro_batch(runs) -> None:
    """Each unit's forward gathers its parameters (FULL_SHARD gathers again for the backward, SHARD_GRAD_OP
    keeps them): kept gathered from one backward to the next forward, micro-batches 2 to 4 gather nothing
    for their forward, and the gradients are still reduced every time."""
    for sharding, per_micro_batch in (("FULL_SHARD", 2 * UNITS), ("SHARD_GRAD_OP", UNITS)):
        each, kept = runs[sharding, 1, 2, 1, "sync_each"], runs[sharding, 1, 2, 1, "keep_gathered"]
        assert _counts(each)["all_gather"] == 4 * per_micro_batch, sharding
        assert _counts(each)["all_gather"] - _counts(kept)["all_gather"] == 3 * UNITS, sharding
        assert _counts(kept)["all_reduce"] == _counts(each)["all_reduce"] == 4 * UNITS
    hybrid, kept = runs["HYBRID_SHARD", 2, 2, 1, "sync_each"], runs["HYBRID_SHARD", 2, 2, 1, "keep_gathered"]
    assert _counts(hybrid)["all_gather"] - _counts(kept)["all_gather"] == UNITS  # two micro-batches


def test_one_rank_has_no_collectives(runs) -> None:
    assert runs["FULL_SHARD", 1, 1, 1, "sync_each"].summary["collectives_per_step"] == {}


def test_allreduce_once_defers_only_the_all_reduce_across_nodes(runs) -> None:
    each = runs["HYBRID_SHARD", 2, 2, 1, "sync_each"]
    deferred = runs["HYBRID_SHARD", 2, 2, 1, "allreduce_once"]
    once = runs["HYBRID_SHARD", 2, 2, 1, "sync_once"]
    assert _counts(each, "mesh_replicate")["all_reduce"] == 2 * UNITS  # two micro-batches of 1
    assert _counts(deferred, "mesh_replicate")["all_reduce"] == UNITS
    assert _counts(deferred)["all_reduce"] == _counts(each)["all_reduce"] == 2 * UNITS  # within the node
    assert _counts(once, "mesh_replicate")["all_reduce"] == _counts(once)["all_reduce"] == UNITS
