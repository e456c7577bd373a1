"""Model presets, and models a user brings as a Hugging Face config: the architecture as pure data.

One table serves the planner (parameter counts, FLOPs, memory estimates; no torch) and the trainer
(which turns a preset into a Hugging Face config, or builds the user's config as it is). Dimensions are
those of the published configs.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Census:
    """A brought model's counts, taken from the model itself (`python -m trainer.census` builds it on the
    meta device): for a decoder family no formula here describes. FLOPs per token are lines in the
    sequence length (a + b * seq: matmuls, then attention's score and value products), read with torch's
    FlopCounterMode at two lengths."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_seq_len: int
    params: int  # every parameter once (a tied output projection is the input embedding)
    embedding: int  # the input embedding's parameters
    tied: bool
    block_params: tuple[int, ...]  # each transformer block's parameters, in forward order
    float8_params: int  # weights of the linears torchao's Float8 training converts (trainer float8_filter)
    forward_flops: tuple[float, float]  # one forward pass per token: a + b * seq
    recompute_flops: tuple[float, float]  # what full activation checkpointing reruns per block, per token

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Census:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()
                      if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ModelArch:
    """Architecture of a decoder-only Llama (and the families a user brings) or an encoder-decoder T5."""

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
    # A model a user brings (bench.core.models.model_source): its Hugging Face config, as the worker builds it
    config_json: str = ""  # canonical JSON; "" for a preset
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    block_norms: int = 2  # RMSNorm weights per block (Gemma 2: 4, before and after attention and MLP)
    experts: int = 0  # mixture of experts (Mixtral): experts per block; 0 = a dense MLP
    experts_per_token: int = 0  # the router's top-k: the experts a token runs through
    fused_projections: bool = False  # Phi-3: q, k, v in one linear, gate and up in another
    counted: Census | None = None  # a family without a formula here: its counts, from the model itself

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


def _llama_block_params(a: ModelArch, active: bool = False) -> int:
    """A decoder block: attention, the gated MLP (of every expert, or of the top-k a token uses, and the
    router), the norms."""
    attn = a.hidden * a.heads * a.head_dim * 2 + a.hidden * a.kv_heads * a.head_dim * 2
    bias = (a.heads + 2 * a.kv_heads) * a.head_dim if a.qkv_bias else 0
    mlp = 3 * a.hidden * a.ffn
    if a.experts:
        mlp = mlp * (a.experts_per_token if active else a.experts) + a.hidden * a.experts  # + router
    return attn + bias + mlp + a.block_norms * a.hidden


def _t5_block_params(a: ModelArch, decoder: bool) -> int:
    inner = a.heads * a.head_dim
    attn = 4 * a.hidden * inner
    mlp = (3 if a.t5_ff.startswith("gated") else 2) * a.hidden * a.ffn
    norms = (3 if decoder else 2) * a.hidden
    return attn * (2 if decoder else 1) + mlp + norms


def block_params(a: ModelArch, active: bool = False) -> list[int]:
    """Parameters of each transformer block, in model order; active: those one token computes with (a
    mixture of experts' top-k; a dense model's all)."""
    if a.counted:
        return list(a.counted.block_params)
    if a.family == "llama":
        return [_llama_block_params(a, active)] * a.layers
    return [_t5_block_params(a, False)] * a.layers + [_t5_block_params(a, True)] * a.layers


def block_linears(a: ModelArch) -> list[tuple[int, int]]:
    """(in, out) features of every nn.Linear weight in one block as transformers builds it (a T5 block's
    self-attention and MLP; its decoder adds cross-attention). A mixture of experts' experts are fused
    parameters, not linears: its router is one."""
    inner, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    if a.family == "t5":
        return [(a.hidden, inner)] * 4 + [(a.hidden, a.ffn)] * (3 if a.t5_ff.startswith("gated") else 2)
    attention = ([(a.hidden, inner + 2 * kv)] if a.fused_projections
                 else [(a.hidden, inner), (a.hidden, kv), (a.hidden, kv)]) + [(inner, a.hidden)]
    if a.experts:
        return attention + [(a.hidden, a.experts)]
    mlp = [(a.hidden, 2 * a.ffn)] if a.fused_projections else [(a.hidden, a.ffn)] * 2
    return attention + mlp + [(a.ffn, a.hidden)]


def float8_linear_params(a: ModelArch) -> int:
    """Weights of the linears torchao's Float8 training converts (trainer/parallel.py float8_filter): those
    inside blocks whose both dimensions are multiples of 16; biases stay in high precision."""
    if a.counted:
        return a.counted.float8_params
    converted = sum(i * o for i, o in block_linears(a) if i % 16 == 0 and o % 16 == 0)
    if a.family == "t5":  # the decoder's blocks add cross-attention's four, shaped as self-attention's
        cross = sum(i * o for i, o in block_linears(a)[:4] if i % 16 == 0 and o % 16 == 0)
        return a.layers * (2 * converted + cross)
    return a.layers * converted


def count_params(a: ModelArch) -> int:
    """Total parameters, counted from the architecture (no weights needed)."""
    if a.counted:
        return a.counted.params
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


def non_embedding_params(a: ModelArch, active: bool = False) -> int:
    """N of the 6N FLOPs rule: all parameters but the input embedding; active: a mixture of experts'
    parameters one token computes with (the router's top-k experts), which is what its FLOPs count.

    A tied output projection still does a matmul per token, so it is counted once as the lm_head.
    """
    inactive = sum(block_params(a)) - sum(block_params(a, active=True)) if active else 0
    embedding = a.counted.embedding if a.counted else a.vocab * a.hidden
    return count_params(a) - inactive - (0 if a.tie_embeddings else embedding)


# ---------------------------------------------------------------- models a user brings

MODELS_DIR = Path(__file__).resolve().parents[2] / "sweeps" / "model"  # a study's own model files
# Families counted here from their config fields (exact: tests hold them to the model cards); any other
# decoder transformers builds is counted from the model itself (Census)
ANALYTIC = {"llama", "mistral", "qwen2", "gemma2", "phi3", "mixtral"}
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
ENCODERS = {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta",
            "mpnet", "modernbert", "camembert"}
DEFAULT_TIED = {"gemma2"}  # model types whose configs tie the embeddings unless they say otherwise


class ModelError(ValueError):
    """A model reference that cannot be trained: one line, naming the reference and why."""


def _name(ref: str, path: Path, cfg: dict[str, Any]) -> str:
    """The model's name in labels and run dirs: a sweeps/model file's stem, else the config's
    `_name_or_path` (its last part), else the directory of a config.json, else the file's stem."""
    raw = (path.stem if path.parent == MODELS_DIR else str(cfg.get("_name_or_path") or "").rstrip("/")
           .split("/")[-1] or (path.parent.name if path.name == "config.json" else path.stem))
    return re.sub(r"[^A-Za-z0-9_.]+", "_", raw).strip("_.").lower() or "model"


def _read_config(ref: str) -> tuple[Path, dict[str, Any]]:
    """The file a reference names and its mapping: a path to a config.json (or its directory), or the name
    of a file in sweeps/model/ (YAML or JSON)."""
    import yaml  # a .json file is read as JSON: PyYAML (YAML 1.1) reads 1e-05 as a string
    candidates = [Path(ref), Path(ref) / "config.json", MODELS_DIR / f"{ref}.yaml",
                  MODELS_DIR / f"{ref}.json"]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        hub = "/" in ref and not ref.startswith((".", "/")) and not ref.endswith(".json")
        why = ("is not a file here; models are built from a local config.json, never downloaded: save the "
               "model's config.json and give its path" if hub else
               f"is neither a preset ({', '.join(sorted(PRESETS))}), a file in sweeps/model/, nor a "
               "config.json path")
        raise ModelError(f"model {ref!r} {why}")
    try:
        cfg = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (ValueError, yaml.YAMLError) as e:
        raise ModelError(f"model {ref!r}: {path} is not valid {path.suffix[1:].upper() or 'YAML'} "
                         f"({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"model {ref!r}: {path} does not hold a mapping of config fields")
    return path, cfg


def _check_decoder(ref: str, cfg: dict[str, Any]) -> None:
    kind = cfg.get("model_type")
    if not kind:
        raise ModelError(f"model {ref!r}: the config has no model_type (a Hugging Face config.json names it)")
    if kind in ENCODERS or any(str(a).endswith(("ForMaskedLM", "ForSequenceClassification"))
                               for a in cfg.get("architectures") or []):
        raise ModelError(f"model {ref!r}: model_type {kind!r} is an encoder-only model; the harness trains "
                         "decoder-only causal language models")
    if cfg.get("is_encoder_decoder"):
        raise ModelError(f"model {ref!r}: model_type {kind!r} is an encoder-decoder model; bring a "
                         "decoder-only config (the T5 presets cover encoder-decoders)")
    if cfg.get("auto_map"):
        raise ModelError(f"model {ref!r}: the config needs the model's own code (auto_map); the harness "
                         "builds transformers' classes only and runs no downloaded code")
    if kind in ANALYTIC:
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size") if not isinstance(cfg.get(k), int)]
        if missing:
            raise ModelError(f"model {ref!r}: the config lacks {', '.join(missing)}")
    elif any(isinstance(cfg.get(k), int) and cfg[k] > 1 for k in EXPERT_FIELDS):
        raise ModelError(f"model {ref!r}: model_type {kind!r} is a mixture of experts; of those the harness "
                         "counts Mixtral's (the top-k experts a token runs through) only")


@functools.cache
def model_source(ref: str) -> tuple[str, str]:
    """(name, canonical config JSON) of a model reference; a preset is (its name, ""). Raises ModelError."""
    if ref in PRESETS:
        return ref, ""
    path, cfg = _read_config(ref)
    _check_decoder(ref, cfg)
    return _name(ref, path, cfg), json.dumps(cfg, sort_keys=True, separators=(",", ":"))


# Censuses by config JSON, taken where torch is (bench.predict.census, trainer.census)
_COUNTED: dict[str, Census] = {}


@functools.cache
def needs_census(config_json: str) -> bool:
    """Whether a brought config's counts come from the model itself (a family with no formula here)."""
    return bool(config_json) and json.loads(config_json)["model_type"] not in ANALYTIC


def register_census(config_json: str, census: Census) -> None:
    _COUNTED[config_json] = census


def has_census(config_json: str) -> bool:
    return config_json in _COUNTED


def _counted_arch(name: str, config_json: str) -> ModelArch:
    census = _COUNTED.get(config_json)
    if census is None:
        raise ModelError(f"model {name!r}: model_type {json.loads(config_json)['model_type']!r} is counted "
                         "from the model itself, which needs torch and transformers here (python -m "
                         "trainer.census)")
    return ModelArch(
        name=name, family="llama", hidden=census.hidden, ffn=0, layers=len(census.block_params),
        heads=census.heads, kv_heads=census.kv_heads, head_dim=census.head_dim, vocab=census.vocab,
        tie_embeddings=census.tied, max_seq_len=census.max_seq_len, config_json=config_json, counted=census)


@functools.cache
def arch_from_config(name: str, config_json: str) -> ModelArch:
    """The architecture of a decoder a user brought, from its Hugging Face config fields (defaults as
    transformers' config classes set them), or, for a family no formula here describes, from its census."""
    if needs_census(config_json):
        return _counted_arch(name, config_json)
    c = json.loads(config_json)
    kind, heads = c["model_type"], c["num_attention_heads"]
    return ModelArch(
        name=name, family="llama", hidden=c["hidden_size"], ffn=c["intermediate_size"],
        layers=c["num_hidden_layers"], heads=heads, kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads, vocab=c["vocab_size"],
        tie_embeddings=bool(c.get("tie_word_embeddings", kind in DEFAULT_TIED)),
        max_seq_len=c.get("max_position_embeddings") or 2048, rope_theta=float(c.get("rope_theta", 10000.0)),
        config_json=config_json, qkv_bias=kind == "qwen2", block_norms=4 if kind == "gemma2" else 2,
        experts=c.get("num_local_experts", 0) if kind == "mixtral" else 0,
        experts_per_token=c.get("num_experts_per_tok", 0) if kind == "mixtral" else 0,
        fused_projections=kind == "phi3")


def arch_of(model: str, model_config: str = "") -> ModelArch:
    """A run's architecture: its preset, or the config it carries (RunSpec.model, RunSpec.model_config)."""
    return arch_from_config(model, model_config) if model_config else get_arch(model)
