"""Model FLOPs (for MFU/HFU) and the state bytes per GPU (the planner's lower bound), from the architecture.

FLOPs per token follow the convention torchtitan and llm-foundry share: 6*N + 12*L*H*Q*T, with N the
parameters without the input embedding (every matmul weight, forward 2 and backward 4 FLOPs per parameter
per token; of a mixture of experts, the router's top-k experts' weights: what one token computes with) and
12*L*H*Q*T the attention score and value matmuls (QK^T and AV, 2*T*Q each per
head forward, times 3 with backward). Causal masking is not discounted, as in that convention.
A brought model of a family with no formula here is counted from itself (bench.core.models.Census: three
times its forward FLOPs, as FlopCounterMode counts them; the same convention, norms aside).
"""
from __future__ import annotations

from bench.core.models import ModelArch, block_params, non_embedding_params
from bench.core.schema import AC_MODES  # one owner of the list

GIB = 1024**3
SELECTIVE_EVERY = 2  # selective AC checkpoints every 2nd transformer block (layer-level selective)
# selective_op: every block checkpointed by operator: matmul and attention outputs saved, the rest
# (norms, activations, elementwise products) recomputed in the backward.


def checkpointed_blocks(ac: str, n_blocks: int) -> list[int]:
    """Indices of the blocks that activation checkpointing wraps; the trainer uses this same rule."""
    if ac in ("full", "selective_op"):
        return list(range(n_blocks))
    if ac == "selective":
        return [i for i in range(n_blocks) if i % SELECTIVE_EVERY == 0]
    if ac == "none":
        return []
    raise ValueError(f"unknown activation_checkpointing {ac!r}; known: {', '.join(AC_MODES)}")


def _line(coefficients: tuple[float, float], seq_len: int) -> float:
    return coefficients[0] + coefficients[1] * seq_len


def _attention_layers(a: ModelArch) -> int:
    """Attention matmul pairs per token: T5's decoder blocks attend twice (self and cross)."""
    return a.layers if a.family == "llama" else a.layers * 3


def attention_square_flops_per_token(a: ModelArch, seq_len: int) -> float:
    """One attention matmul (QK^T or AV) over the whole square, per token, over every layer: the convention
    counts six (forward two, backward four) and two more per block activation checkpointing reruns."""
    return 2.0 * _attention_layers(a) * a.heads * a.head_dim * seq_len


def model_flops_per_token(a: ModelArch, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), without recompute."""
    if a.counted:
        return 3.0 * _line(a.counted.forward_flops, seq_len)
    return 6.0 * non_embedding_params(a, active=True) + 6.0 * attention_square_flops_per_token(a, seq_len)


def _block_forward_flops_per_token(a: ModelArch, index: int, seq_len: int) -> float:
    attn_pairs = 2 if (a.family == "t5" and index >= a.layers) else 1
    return 2.0 * block_params(a, active=True)[index] + 4.0 * attn_pairs * a.heads * a.head_dim * seq_len


def recompute_flops_per_token(a: ModelArch, seq_len: int, ac: str) -> float:
    """Extra forward FLOPs that activation checkpointing spends re-running checkpointed blocks.

    torch's non-reentrant checkpoint stops recomputing once the last tensor backward needs is rebuilt
    (early stop). A block's final FFN projection output is saved by nothing (the residual add needs no
    inputs), so that matmul (2 * hidden * ffn per token) is not rerun; measured with the FLOP counter. Gemma 2
    normalises the MLP's output before the residual add: its norm needs that output, which is rerun.
    """
    if ac == "selective_op":  # every matmul output is saved: only FLOP-free elementwise ops rerun
        return 0.0
    if a.counted:  # counted under full checkpointing, block by block alike
        return len(checkpointed_blocks(ac, a.blocks)) * _line(a.counted.recompute_flops, seq_len)
    final_projection = 0.0 if a.block_norms == 4 else 2.0 * a.hidden * a.ffn
    return sum(_block_forward_flops_per_token(a, i, seq_len) - final_projection
               for i in checkpointed_blocks(ac, a.blocks))


def hardware_flops_per_token(a: ModelArch, seq_len: int, ac: str) -> float:
    """FLOPs the hardware executes per token: model FLOPs plus AC recompute (for HFU)."""
    return model_flops_per_token(a, seq_len) + recompute_flops_per_token(a, seq_len, ac)


# ---------------------------------------------------------------- memory estimate

# Float8 training keeps bf16_mixed's fp32 state; its all-gathers and matmul inputs are 1 byte, but the
# estimate keeps 2 (the BF16 copies and the attention stay), erring towards launching less.
_STATE_BYTES = {"fp32": 16, "bf16_mixed": 16, "fp16_mixed": 16, "bf16_pure": 8, "fp8_tensorwise": 16}
COMPUTE_BYTES = {"fp32": 4, "bf16_mixed": 2, "fp16_mixed": 2, "bf16_pure": 2, "fp8_tensorwise": 2}
# The mixed-precision policy's reduce dtype (trainer/parallel.py: mp_policy): gradients are reduced in fp32
# except in pure bf16.
REDUCE_BYTES = {"fp32": 4, "bf16_mixed": 4, "fp16_mixed": 4, "bf16_pure": 2, "fp8_tensorwise": 4}


# The parameters' own dtype (trainer/parallel.py DTYPES: fp32 master weights but in pure bf16), which their
# gradients take before they are reduced
PARAM_BYTES = {"fp32": 4, "bf16_mixed": 4, "fp16_mixed": 4, "bf16_pure": 2, "fp8_tensorwise": 4}


def state_bytes_per_param(precision: str) -> int:
    """Bytes of parameter, gradient and AdamW moments per parameter (fp32 master weights under mixed
    precision: 4 + 4 + 8)."""
    return _STATE_BYTES[precision]


def shard_size(sharding: str, nodes: int, gpus_per_node: int) -> int:
    """How many ranks one parameter is split across."""
    world = nodes * gpus_per_node
    return {"FULL_SHARD": world, "SHARD_GRAD_OP": world, "HYBRID_SHARD": gpus_per_node,
            "NO_SHARD": 1}[sharding]
