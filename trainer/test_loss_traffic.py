"""The performance model's loss traffic (bench/predict/traffic.py loss_bytes) against the ops a real step runs
on the logits: the worker's own model and parallelization, real tensors on one rank of a fake process
group, each op that reads or writes a logits-sized tensor seen by a dispatch mode as it runs."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bench.core.models import get_arch
from bench.core.schema import RunSpec
from bench.predict.traffic import loss_bytes

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
# no copy: the result aliases its input (views) or is a reshape of a fresh matmul output
ALIASES = {torch.ops.aten._unsafe_view.default, torch.ops.aten.detach.default}
# read one logit a row by its target (a gather), or write the dense gradient from one: their logits-sized
# inputs are not read
GATHERS = {torch.ops.aten.nll_loss_forward.default, torch.ops.aten.nll_loss_backward.default}


class _LogitTraffic(TorchDispatchMode):
    """Bytes each op outside the matmuls reads from and writes to tensors of the logits' size (a micro-batch's
    tokens x the vocabulary), each operand once."""

    def __init__(self, logits: int) -> None:
        super().__init__()
        self.logits, self.bytes, self.ops = logits, 0, set()

    def _sized(self, tree: object) -> int:
        return sum(t.nbytes for t in tree_leaves(tree)
                   if isinstance(t, torch.Tensor) and t.numel() == self.logits)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func in MATMULS or func in ALIASES or func.is_view:
            return out
        moved = (0 if func in GATHERS else self._sized((args, kwargs))) + self._sized(out)
        if moved:
            self.bytes += moved
            self.ops.add(func.__name__)
        return out


def measured(spec: RunSpec) -> tuple[int, set[str]]:
    """Rank 0's loss traffic over one micro-batch's forward and backward, and the ops that moved it."""
    from trainer.data import rank_batches
    from trainer.memory import fake_rank
    from trainer.model import materialize
    from trainer.parallel import backward, parallelize
    arch, device = get_arch(spec.model), torch.device("cpu")
    with fake_rank(spec.world_size):
        model = parallelize(spec, arch, device).model
        materialize(model, device, seed=0)
        batch = rank_batches(spec, arch, rank=0, step=0, device=device)[0]
        traffic = _LogitTraffic(spec.micro_batch * spec.seq_len * arch.vocab)
        with traffic:
            backward(model(**batch).loss, None)
        return traffic.bytes, traffic.ops


def _spec(model: str, precision: str) -> RunSpec:
    # 3 x 48 tokens: no weight or activation of either tiny model has a micro-batch's logits' size
    return RunSpec(model=model, sharding="FULL_SHARD", gpus_per_node=2, precision=precision, micro_batch=3,
                   seq_len=48)


# bytes a logit: a causal LM casts 16-bit logits to fp32 and back (transformers' ForCausalLMLoss: 12 of the
# 36), T5's loss stays in the logits' dtype
CASES = [("tiny_llama", "fp32", 24), ("tiny_llama", "bf16_mixed", 36), ("tiny_llama", "bf16_pure", 36),
         ("tiny_llama", "fp16_mixed", 36), ("tiny_t5", "fp32", 24), ("tiny_t5", "bf16_mixed", 12)]


@pytest.mark.parametrize(("model", "precision", "per_logit"), CASES)
def test_the_model_counts_the_loss_traffic_the_real_models_run(model, precision, per_logit) -> None:
    spec, arch = _spec(model, precision), get_arch(model)
    tokens = spec.micro_batch * spec.seq_len
    moved, ops = measured(spec)
    assert moved == pytest.approx(loss_bytes(spec, arch) * tokens, rel=1e-9)
    assert moved == per_logit * tokens * arch.vocab
    names = {o.split(".")[0] for o in ops}
    assert {"_log_softmax", "_log_softmax_backward_data", "nll_loss_backward"} <= names
    assert ("_to_copy" in names) == (per_logit == 36)  # the casts, exactly where the model charges them
