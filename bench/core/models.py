"""Model presets: the architecture of every model the harness can train, as pure data.

One table serves the planner (parameter counts, FLOPs, memory estimates; no torch) and the trainer
(which turns a preset into a Hugging Face config). Dimensions are those of the published configs.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArch:
    """Architecture of a decoder-only Llama or an encoder-decoder T5."""

    name: str
    family: str  # "llama" | "t5"
    hidden: int
    ffn: int
    layers: int  # decoder-only: blocks; T5: blocks per stack (encoder and decoder each)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    max_seq_len: int
    rope_theta: float = 10000.0
    rope_llama3: bool = False  # Llama 3.1/3.2 rope scaling
    t5_ff: str = "relu"  # T5: "relu" (2 matrices) or "gated-gelu" (3)
    published_params: int | None = None  # from the model card / safetensors index, for tests

    @property
    def blocks(self) -> int:
        """Transformer blocks in the whole model (T5: encoder + decoder)."""
        return self.layers * (2 if self.family == "t5" else 1)


def _llama(name: str, hidden: int, ffn: int, layers: int, heads: int, kv: int, vocab: int,
           tie: bool, seq: int, published: int | None, llama3: bool = False,
           head_dim: int | None = None) -> ModelArch:
    return ModelArch(name=name, family="llama", hidden=hidden, ffn=ffn, layers=layers, heads=heads,
                     kv_heads=kv, head_dim=head_dim or hidden // heads, vocab=vocab,
                     tie_embeddings=tie, max_seq_len=seq,
                     rope_theta=500000.0 if llama3 else 10000.0, rope_llama3=llama3,
                     published_params=published)


def _t5(name: str, d_model: int, d_ff: int, layers: int, heads: int, d_kv: int,
        published: int | None, ff: str = "relu", vocab: int = 32128) -> ModelArch:
    return ModelArch(name=name, family="t5", hidden=d_model, ffn=d_ff, layers=layers, heads=heads,
                     kv_heads=heads, head_dim=d_kv, vocab=vocab, tie_embeddings=True,
                     max_seq_len=512, t5_ff=ff, published_params=published)


PRESETS: dict[str, ModelArch] = {m.name: m for m in [
    # Published counts: Hugging Face safetensors metadata of meta-llama/* and google-t5/* (total params).
    _llama("llama2_7b", 4096, 11008, 32, 32, 32, 32000, False, 4096, 6_738_415_616),
    _llama("llama2_13b", 5120, 13824, 40, 40, 40, 32000, False, 4096, 13_015_864_320),
    _llama("llama2_70b", 8192, 28672, 80, 64, 8, 32000, False, 4096, 68_976_648_192),
    _llama("llama3_1_8b", 4096, 14336, 32, 32, 8, 128256, False, 131072, 8_030_261_248, True),
    _llama("llama3_1_70b", 8192, 28672, 80, 64, 8, 128256, False, 131072, 70_553_706_496, True),
    _llama("llama3_2_1b", 2048, 8192, 16, 32, 8, 128256, True, 131072, 1_235_814_400, True, 64),
    _llama("llama3_2_3b", 3072, 8192, 28, 24, 8, 128256, True, 131072, 3_212_749_824, True, 128),
    _t5("t5_3b", 1024, 16384, 24, 32, 128, 2_851_598_336),
    _t5("t5_11b", 1024, 65536, 24, 128, 128, 11_307_321_344),
    # Tiny presets for CPU tests and the smoke sweep; same code paths, seconds per step.
    _llama("tiny_llama", 128, 344, 4, 4, 2, 1024, False, 2048, None),
    _llama("small_llama", 512, 1376, 8, 8, 4, 8192, False, 2048, None),
    _t5("tiny_t5", 128, 512, 2, 4, 32, None),
]}


def get_arch(name: str) -> ModelArch:
    """Look a preset up, with the list of valid names in the error."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(PRESETS))}") from None


def _llama_block_params(a: ModelArch) -> int:
    attn = a.hidden * a.heads * a.head_dim * 2 + a.hidden * a.kv_heads * a.head_dim * 2
    mlp = 3 * a.hidden * a.ffn
    return attn + mlp + 2 * a.hidden  # two RMSNorm weights


def _t5_block_params(a: ModelArch, decoder: bool) -> int:
    inner = a.heads * a.head_dim
    attn = 4 * a.hidden * inner
    mlp = (3 if a.t5_ff.startswith("gated") else 2) * a.hidden * a.ffn
    norms = (3 if decoder else 2) * a.hidden
    return attn * (2 if decoder else 1) + mlp + norms


def block_params(a: ModelArch) -> list[int]:
    """Parameters of each transformer block, in model order."""
    if a.family == "llama":
        return [_llama_block_params(a)] * a.layers
    return [_t5_block_params(a, False)] * a.layers + [_t5_block_params(a, True)] * a.layers


def count_params(a: ModelArch) -> int:
    """Total parameters, counted from the architecture (no weights needed)."""
    embed = a.vocab * a.hidden
    total = embed + sum(block_params(a))
    if a.family == "llama":
        total += a.hidden  # final norm
    else:
        # Relative position bias lives in the first block of each stack (32 buckets x heads);
        # one final norm per stack.
        total += 2 * 32 * a.heads + 2 * a.hidden
    if not a.tie_embeddings:
        total += embed  # separate lm_head
    return total


def non_embedding_params(a: ModelArch) -> int:
    """N of the 6N FLOPs rule: all parameters but the input embedding.

    A tied output projection still does a matmul per token, so it is counted once as the lm_head.
    """
    return count_params(a) - (0 if a.tie_embeddings else a.vocab * a.hidden)
