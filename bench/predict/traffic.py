"""HBM traffic of a step that no per-block constant carries, each figure the bytes the real ops move (read
each operand, write the result, once): counted in real steps by trainer/test_accumulation_traffic.py and
trainer/test_loss_traffic.py, and charged by bench/predict/perf.py at the GPU's HBM bandwidth."""
from __future__ import annotations

from collections.abc import Iterable

from bench.core.flops import COMPUTE_BYTES, PARAM_BYTES, REDUCE_BYTES, shard_size
from bench.core.models import ModelArch, count_params
from bench.core.schema import RunSpec


def accumulation_bytes(spec: RunSpec, params: int) -> tuple[float, float]:
    """HBM bytes one rank's gradient accumulation moves per optimizer step (each add reads both operands
    and writes one), as FSDP2 runs it: (on the compute stream, beside it on the reduce-scatter stream).
    sync_once adds each later micro-batch's unsharded gradients (compute dtype) into an accumulator of
    the reduce dtype in the post-backward hook, after casting the first micro-batch's where the two differ
    (FSDPParam.to_accumulated_grad_if_needed, accumulate_unsharded_grad_if_needed): the whole model's
    parameters, in the step's critical path. The other modes reduce every micro-batch and add the new
    shard into the sharded gradient (foreach_reduce; allreduce_once into HSDP's partial reduce output) in
    the parameters' own dtype, which is every precision's reduce dtype too, on the reduce-scatter stream
    beside the backward: a 1/shard of that, which the model leaves to the overlap.
    trainer/test_accumulation_traffic.py counts these bytes in real FSDP2 steps."""
    n, p = spec.grad_accum, spec.precision
    if n == 1:
        return 0.0, 0.0
    if spec.accumulation == "sync_once":
        grad, acc = COMPUTE_BYTES[p], REDUCE_BYTES[p]
        cast = grad + acc if grad != acc else 0
        return float(params * (cast + (n - 1) * (2 * acc + grad))), 0.0
    shard = shard_size(spec.sharding, spec.nodes, spec.gpus_per_node)
    return 0.0, params / shard * (n - 1) * 3 * PARAM_BYTES[p]


def loss_bytes(spec: RunSpec, arch: ModelArch, per_logit: float | None = None) -> float:
    """HBM bytes per token the loss moves over the logits outside the LM head's matmuls (each op reads its
    operands and writes its result once): a term no per-block constant carries, since it scales with the
    vocabulary, not hidden x blocks (Llama 3.2 1B: 128256 logits a token against 2048 x 16 hidden units).
    transformers' causal LMs cast the logits to fp32 (ForCausalLMLoss) and back in the backward; then
    log_softmax (read, write), nll_loss's backward (writes the dense gradient) and log_softmax's backward
    (reads two, writes one), in the loss dtype; T5's loss stays in the logits' dtype (no cast).
    trainer/test_loss_traffic.py counts these bytes in the real models' forward and backward."""
    if per_logit is not None:  # a published stack's own figure (perf.Stack.loss_bytes)
        return per_logit * arch.vocab
    logits = COMPUTE_BYTES[spec.precision]  # the LM head stays 16-bit under Float8 (blocks only)
    loss = logits if arch.family == "t5" else 4
    cast = 2 * (logits + loss) if logits != loss else 0
    return float((6 * loss + cast) * arch.vocab)


def copy_bytes(spec: RunSpec, arch: ModelArch, kinds: Iterable[tuple[str, float, int]]) -> float:
    """HBM bytes of FSDP2's copies around one micro-batch's collectives, on the compute stream (the trace's
    collective_copies): each all-gather's copy-out reads the gathered buffer and writes the parameters
    (foreach_all_gather_copy_out: twice its bytes); each reduce-scatter's copy-in reads the unsharded
    gradients in the compute dtype and writes the flat input in the reduce dtype (foreach_reduce's
    chunk_cat, casting as it copies). `kinds`: (kind, bytes of the model's collective, ranks in its
    group); a group of one rank runs none."""
    grads = count_params(arch) * (COMPUTE_BYTES[spec.precision] + REDUCE_BYTES[spec.precision])
    total = 0.0
    for kind, size, ranks in kinds:
        if ranks > 1 and kind == "all_gather":
            total += 2 * size
        elif ranks > 1 and kind == "reduce_scatter":
            total += grads
    return total
