"""Model FLOPs (for MFU/HFU) and a per-GPU memory estimate (for the planner), from the architecture.

FLOPs per token follow the convention torchtitan and llm-foundry share: 6*N + 12*L*H*Q*T, with N the
parameters without the input embedding (every matmul weight, forward 2 and backward 4 FLOPs per
parameter per token) and 12*L*H*Q*T the attention score and value matmuls (QK^T and AV, 2*T*Q each per
head forward, times 3 with backward). Causal masking is not discounted, as in that convention.
"""
from __future__ import annotations

from dataclasses import dataclass

from bench.core.models import ModelArch, block_params, count_params, non_embedding_params
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


def _attention_layers(a: ModelArch) -> int:
    """Attention matmul pairs per token: T5's decoder blocks attend twice (self and cross)."""
    return a.layers if a.family == "llama" else a.layers * 3


def model_flops_per_token(a: ModelArch, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), without recompute."""
    return 6.0 * non_embedding_params(a) + 12.0 * _attention_layers(a) * a.heads * a.head_dim * seq_len


def _block_forward_flops_per_token(a: ModelArch, index: int, seq_len: int) -> float:
    attn_pairs = 2 if (a.family == "t5" and index >= a.layers) else 1
    return 2.0 * block_params(a)[index] + 4.0 * attn_pairs * a.heads * a.head_dim * seq_len


def recompute_flops_per_token(a: ModelArch, seq_len: int, ac: str) -> float:
    """Extra forward FLOPs that activation checkpointing spends re-running checkpointed blocks.

    torch's non-reentrant checkpoint stops recomputing once the last tensor backward needs is rebuilt
    (early stop). A block's final FFN projection output is saved by nothing (the residual add needs no
    inputs), so that matmul (2 * hidden * ffn per token) is not rerun; measured with the FLOP counter.
    """
    if ac == "selective_op":  # every matmul output is saved: only FLOP-free elementwise ops rerun
        return 0.0
    final_projection = 2.0 * a.hidden * a.ffn
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


def state_bytes_per_param(precision: str) -> int:
    """Bytes of parameter, gradient and AdamW moments per parameter (fp32 master weights under mixed
    precision: 4 + 4 + 8)."""
    return _STATE_BYTES[precision]


def shard_size(sharding: str, nodes: int, gpus_per_node: int) -> int:
    """How many ranks one parameter is split across."""
    world = nodes * gpus_per_node
    return {"FULL_SHARD": world, "SHARD_GRAD_OP": world, "HYBRID_SHARD": gpus_per_node,
            "NO_SHARD": 1}[sharding]


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes by category; `total` is what the planner compares to device memory."""

    states: float  # sharded params + grads + AdamW moments (0 with offload: they are in host memory)
    unsharded: float  # gathered compute-dtype params/grads alive at the peak
    activations: float
    host: float = 0.0  # this GPU's share of host memory: its offloaded states (offload=cpu)

    @property
    def total(self) -> float:
        return self.states + self.unsharded + self.activations

    @property
    def total_gib(self) -> float:
        return self.total / GIB


def _activation_elements_per_token_block(a: ModelArch) -> float:
    inner = a.heads * a.head_dim
    kv = a.kv_heads * a.head_dim
    ffn_tensors = 5 if a.family == "llama" else 3  # SwiGLU keeps gate, up, act, product, down input
    return 9 * a.hidden + 2 * kv + inner + ffn_tensors * a.ffn


def estimate_memory(a: ModelArch, *, sharding: str, precision: str, ac: str, wrap_policy: str,
                    nodes: int, gpus_per_node: int, micro_batch: int, seq_len: int, offload: str = "none",
                    ) -> MemoryEstimate:
    """Peak bytes per GPU for one training step of FSDP2 with AdamW.

    offload=cpu (CPUOffloadPolicy) keeps the sharded parameters, gradients and AdamW state in host memory
    (the optimizer steps there); the GPU holds what is gathered for compute and the activations.

    A planning estimate (within tens of percent), not an allocator simulation: it decides which runs are
    worth launching and is drawn against the measured peak in the report.
    """
    params = count_params(a)
    c = COMPUTE_BYTES[precision]
    states = params * state_bytes_per_param(precision) / shard_size(sharding, nodes, gpus_per_node)
    host = states if offload == "cpu" else 0.0
    states -= host
    biggest_block = max(block_params(a))
    root = params - sum(block_params(a))  # embeddings, final norms, lm_head: the root FSDP unit
    if wrap_policy == "whole_model" or sharding in ("SHARD_GRAD_OP", "NO_SHARD"):
        unsharded = params * c + (params * 4 if wrap_policy == "whole_model" else 0)
    else:
        unsharded = root * c + biggest_block * (2 * c + 4)  # current + prefetched unit, its grads
    tokens = micro_batch * seq_len
    per_block = _activation_elements_per_token_block(a) * c * tokens
    n_ckpt = len(checkpointed_blocks(ac, a.blocks))
    if ac == "selective_op":  # kept: block input, q/k/v, attention output, o_proj, the FFN matmuls' outputs
        inner, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
        kept = 3 * a.hidden + 2 * inner + 2 * kv + (2 if a.family == "llama" else 1) * a.ffn
        acts = a.blocks * kept * c * tokens + per_block  # plus one block rebuilt during its backward
        acts += tokens * a.vocab * (c + 8)
        return MemoryEstimate(states=states, unsharded=unsharded, activations=acts, host=host)
    acts = (a.blocks - n_ckpt) * per_block + n_ckpt * a.hidden * c * tokens
    if n_ckpt:
        acts += per_block  # one block's activations rebuilt during its backward
    acts += tokens * a.vocab * (c + 8)  # logits, their fp32 upcast and the loss gradient
    return MemoryEstimate(states=states, unsharded=unsharded, activations=acts, host=host)
