"""The performance model's gradient accumulation traffic (bench/predict/traffic.py accumulation_bytes) against
the adds and casts a real FSDP2 step runs into its gradient accumulators: the worker's own model and
parallelization, real tensors on one rank of a fake process group, three micro-batches a step, each op
that reads or writes an accumulator seen by a dispatch mode as it runs."""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.core.models import count_params, get_arch
from bench.core.schema import RunSpec
from bench.predict.traffic import accumulation_bytes

ARCH = get_arch("tiny_llama")  # every dimension even: shards of 2 and 4 ranks hold no padding
ADDS = (torch.ops.aten.add_.Tensor, torch.ops.aten.add.Tensor)


def _storage(t: object) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


def _accumulators(model: torch.nn.Module) -> tuple[set[int], set[int]]:
    """Storages a step accumulates gradients in: sharded gradients, unsharded accumulated gradients and
    HSDP's partial reduce output; and the unsharded gradients autograd wrote, where it accumulates itself."""
    acc, unsharded = set(), set()
    for module in model.modules():
        group = getattr(module, "_get_fsdp_state", lambda: None)()
        group = group and group._fsdp_param_group
        if group is None:
            continue
        acc.add(_storage(group._partial_reduce_output))
        for fp in group.fsdp_params:
            grad = fp.sharded_param.grad
            acc.update({_storage(grad._local_tensor if grad is not None else None),
                        _storage(fp.unsharded_accumulated_grad)})
            param = getattr(fp, "_unsharded_param", None)
            unsharded.add(_storage(param.grad if param is not None else None))
    return acc - {None, 0}, unsharded - {None, 0}


class _Traffic(TorchDispatchMode):
    """Bytes read and written by each add into or out of an accumulator (an unsharded gradient an add
    reads is one: fp32 and bf16_pure accumulate in place in it), and by each cast whose output a later add
    accumulates into (sync_once's first micro-batch, cast to the reduce dtype)."""

    def __init__(self, storages: Callable[[], tuple[set[int], set[int]]]) -> None:
        super().__init__()
        self.storages, self.bytes = storages, 0
        # output storage -> (the output, the cast's bytes), until an add writes it; a storage address is
        # reused once its tensor is freed, so only a cast whose output still lives is the accumulator's
        self.casts: dict[int, tuple[weakref.ref, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default:
            self.casts[_storage(out)] = (weakref.ref(out), args[0].nbytes + out.nbytes)
        elif func in ADDS:
            inputs = [a for a in args[:2] if isinstance(a, torch.Tensor)]
            touched = {_storage(a) for a in inputs}
            acc, unsharded = self.storages()
            if touched & (acc | unsharded):
                self.bytes += sum(a.nbytes for a in inputs) + out.nbytes
                output, cast = self.casts.pop(_storage(args[0]), (lambda: None, 0))
                if _storage(args[0]) in acc and output() is not None:  # the accumulator was a cast's output
                    self.bytes += cast
        return out


def measured_bytes(spec: RunSpec) -> int:
    """Rank 0's accumulation traffic over one step's micro-batches (forward and backward; not the
    optimizer, which the model counts apart)."""
    from trainer.data import rank_batches
    from trainer.memory import fake_rank
    from trainer.model import materialize
    from trainer.parallel import accumulate, backward, parallelize
    device = torch.device("cpu")
    with fake_rank(spec.world_size):
        model = parallelize(spec, ARCH, device).model
        materialize(model, device, seed=0)
        batches = rank_batches(spec, ARCH, rank=0, step=0, device=device)
        traffic = _Traffic(lambda: _accumulators(model))
        with traffic:
            for k, batch in enumerate(batches):
                accumulate(model, spec.accumulation, last=k == len(batches) - 1)
                backward(model(**batch).loss / len(batches), None)
        return traffic.bytes


def _spec(sharding: str, nodes: int, gpn: int, mode: str, precision: str, accum: int = 3) -> RunSpec:
    return RunSpec(model="tiny_llama", sharding=sharding, nodes=nodes, gpus_per_node=gpn, precision=precision,
                   micro_batch=1, seq_len=32, global_batch=accum * nodes * gpn, accumulation=mode)


CASES = [("FULL_SHARD", 1, 2, mode, precision) for mode in ("sync_each", "sync_once")
         for precision in ("fp32", "bf16_mixed", "bf16_pure")] + [
    ("SHARD_GRAD_OP", 1, 2, "keep_gathered", "bf16_mixed"), ("FULL_SHARD", 1, 4, "sync_once", "bf16_mixed"),
    ("HYBRID_SHARD", 2, 2, "allreduce_once", "bf16_mixed"),
    ("HYBRID_SHARD", 2, 2, "allreduce_once", "bf16_pure"), ("HYBRID_SHARD", 2, 2, "sync_once", "bf16_mixed")]


@pytest.mark.parametrize(("sharding", "nodes", "gpn", "mode", "precision"), CASES)
def test_the_model_counts_the_accumulation_traffic_fsdp2_runs(sharding, nodes, gpn, mode, precision) -> None:
    spec = _spec(sharding, nodes, gpn, mode, precision)
    compute, beside = accumulation_bytes(spec, count_params(ARCH))
    assert measured_bytes(spec) == pytest.approx(compute + beside, rel=1e-9)
    assert (compute > 0) == (mode == "sync_once") and (beside > 0) == (mode != "sync_once")


def test_one_micro_batch_a_step_accumulates_nothing_and_the_count_can_fail() -> None:
    """Without accumulation no op touches an accumulator; and the count is not a constant: two more
    micro-batches of sync_once's cast-and-add cost two more adds of the whole model."""
    one = _spec("FULL_SHARD", 1, 2, "sync_once", "bf16_mixed", accum=1)
    assert measured_bytes(one) == 0 == sum(accumulation_bytes(one, count_params(ARCH)))
    three, five = (_spec("FULL_SHARD", 1, 2, "sync_once", "bf16_mixed", accum=n) for n in (3, 5))
    assert measured_bytes(five) - measured_bytes(three) == 2 * (4 + 2 + 4) * count_params(ARCH)
    assert measured_bytes(replace(three, precision="fp32")) != measured_bytes(three)
