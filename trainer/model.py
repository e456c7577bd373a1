"""Hugging Face models from presets, or from the config a user brought (transformers' own class for its
model_type, AutoModelForCausalLM): built on the meta device, materialised after sharding.

Weights are random but deterministic per parameter name and seed, independent of how the parameter is
sharded: every rank draws the full tensor for one parameter at a time on its device and keeps its own
shard. So all four strategies start from identical weights (their loss curves can be compared), and
host memory never holds more than one full parameter.
"""
from __future__ import annotations

import contextlib
import json
import sys
import zlib
from collections.abc import Iterator

import torch
from torch import nn

from bench.core.models import ModelArch

# Installed packages transformers imports at its own import for integrations this worker never uses
# (torchao: its quantizers, which import torchao whole; scipy: the object-detection losses). The worker's
# Float8 imports torchao.float8 itself, when a run asks for it. Hidden while transformers is imported, they
# cost a run neither their import time (benchmarks/run_cost.py) nor their log lines (torchao's "Failed to
# load ... _C_*.so" on a build without its kernels).
UNUSED_BY_TRANSFORMERS = ("torchao", "scipy")


@contextlib.contextmanager
def hidden(packages: tuple[str, ...]) -> Iterator[None]:
    """Importing any of `packages` fails inside (importlib's find_spec answers None), unless one is
    imported already; afterwards they import as usual. Nothing is hidden once transformers is (partly)
    imported: it may have found them installed already, and would then import them inside."""
    started = any(name == "transformers" or name.startswith("transformers.") for name in sys.modules)
    hide = [] if started else [p for p in packages if p not in sys.modules]
    for p in hide:
        sys.modules[p] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for p in hide:
            if sys.modules.get(p, 0) is None:
                del sys.modules[p]


try:
    with hidden(UNUSED_BY_TRANSFORMERS):
        import transformers.modeling_utils  # the import chain in which transformers would import them
except ImportError:  # a transformers that imports them whatever importlib says: with them, then
    import transformers.modeling_utils  # noqa: F401
from transformers import (  # noqa: E402  (after the import chain above)
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    T5Config,
    T5ForConditionalGeneration,
)

INIT_STD = 0.02
# Our batches are whole, unpadded, unpacked sequences: SDPA's own causal flag is the whole mask. Under this
# name transformers builds no mask at all (it is not one of its mask functions), so a step takes the same
# path with real tensors and with the fake ones the memory measurement uses; "sdpa" would build a T x T
# mask under fake tensors, where it cannot prove the batch is not packed.
CAUSAL_SDPA = "fsdpbench_causal_sdpa"


def _attention(family: str, attn_impl: str) -> str:
    """The attention implementation transformers runs: causal SDPA without a mask for decoder-only models."""
    if family != "llama" or attn_impl != "sdpa":
        return attn_impl
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    return CAUSAL_SDPA


# What a published config.json carries beyond the architecture: the checkpoint's provenance and dtype
PROVENANCE = ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "model_type")


def brought_config(config_json: str) -> PretrainedConfig:
    """A user's config as transformers' class for its model_type reads it (defaults filled in)."""
    fields = json.loads(config_json)
    architecture = {k: v for k, v in fields.items() if k not in PROVENANCE}
    return AutoConfig.for_model(fields["model_type"], **architecture)


def hf_config(a: ModelArch, attn_impl: str = "sdpa", seq_len: int = 0) -> PretrainedConfig:
    """The transformers config of a preset or of the config a user brought (random init; nothing is
    downloaded)."""
    if a.config_json:
        return brought_hf_config(a.config_json, attn_impl, seq_len)
    if a.family == "llama":
        rope_scaling = ({"rope_type": "llama3", "factor": 8.0 if a.hidden > 3072 else 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192} if a.rope_llama3 else None)
        cfg = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                          num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                          head_dim=a.head_dim, vocab_size=a.vocab, max_position_embeddings=a.max_seq_len,
                          rope_theta=a.rope_theta, rope_scaling=rope_scaling,
                          tie_word_embeddings=a.tie_embeddings, use_cache=False)
    else:
        cfg = T5Config(d_model=a.hidden, d_ff=a.ffn, d_kv=a.head_dim, num_heads=a.heads,
                       num_layers=a.layers, num_decoder_layers=a.layers, vocab_size=a.vocab,
                       feed_forward_proj=a.t5_ff, tie_word_embeddings=True, use_cache=False,
                       dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    cfg._attn_implementation = _attention(a.family, attn_impl)
    return cfg


def brought_hf_config(config_json: str, attn_impl: str = "sdpa", seq_len: int = 0) -> PretrainedConfig:
    """A brought config as the worker runs it. A sequence longer than the model's sliding window runs
    transformers' own SDPA path, which masks to the window (SDPA's causal flag alone would attend to the
    whole prefix: another model); the mask costs a T x T tensor, and no FLOPs are saved (SDPA computes the
    masked scores), as in transformers' own training."""
    cfg = brought_config(config_json)
    cfg.use_cache = False
    masked = attn_impl == "sdpa" and windowed(cfg, seq_len)
    cfg._attn_implementation = "sdpa" if masked else _attention("llama", attn_impl)
    return cfg


def _meta_model(cfg: PretrainedConfig, dtype: torch.dtype, encoder_decoder: bool) -> PreTrainedModel:
    with torch.device("meta"):
        if encoder_decoder:
            model = T5ForConditionalGeneration(cfg)
        else:
            try:
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation=cfg._attn_implementation)
            except ValueError:  # a class SDPA cannot run as its config asks (Gemma 2's soft-capped logits)
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    check_blocks(model)
    return model.to(dtype)


def windowed(cfg: PretrainedConfig, seq_len: int) -> bool:
    """Whether a config attends within a sliding window shorter than the sequence (Mistral 7B v0.1: 4096,
    Phi-3 mini 4k: 2047, StarCoder2: 4096; Qwen2's and Qwen3's only with use_sliding_window)."""
    window = getattr(cfg, "sliding_window", None)
    enabled = getattr(cfg, "use_sliding_window", True) is not False
    return isinstance(window, int) and window < seq_len and enabled


def attention_impl(a: ModelArch, seq_len: int) -> str:
    """The attention implementation the worker asks transformers for, at this sequence length."""
    return hf_config(a, "sdpa", seq_len)._attn_implementation


def build_meta_model(a: ModelArch, dtype: torch.dtype, attn_impl: str = "sdpa",
                     seq_len: int = 0) -> PreTrainedModel:
    """The model with every parameter on the meta device (no memory), in `dtype`, for sequences of seq_len
    (a brought model's sliding window: brought_hf_config)."""
    return _meta_model(hf_config(a, attn_impl, seq_len), dtype, a.family == "t5")


def build_brought_meta_model(config_json: str, dtype: torch.dtype) -> PreTrainedModel:
    """A brought config's model on the meta device, before anything counts it (trainer/census.py)."""
    return _meta_model(brought_hf_config(config_json), dtype, encoder_decoder=False)


def _unwrapped(module: nn.Module) -> nn.Module:
    """A block under activation checkpointing's or compile's wrapper (FSDP2 subclasses it in place)."""
    while True:
        inner = getattr(module, "_checkpoint_wrapped_module", None) or getattr(module, "_orig_mod", None)
        if inner is None:
            return module
        module = inner


def _decoder_layers(model: PreTrainedModel) -> tuple[str, nn.ModuleList]:
    """A decoder's blocks: `model.layers` (Llama and most families), else the one list of modules of the
    classes it names in `_no_split_modules` (GPT-2's `transformer.h`, GPT-NeoX's `gpt_neox.layers`)."""
    inner = getattr(getattr(model, "model", None), "layers", None)
    if isinstance(inner, nn.ModuleList):
        return "model.layers", inner
    split = set(model._no_split_modules or ())
    lists = [(path, m) for path, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)
             and all(split & {c.__name__ for c in type(_unwrapped(block)).__mro__} for block in m)]
    if len(lists) != 1:
        raise TypeError(f"{type(model).__name__}: {len(lists)} lists of its _no_split_modules blocks "
                        f"{sorted(split)}; the harness shards and checkpoints one")
    return lists[0]


def transformer_blocks(model: PreTrainedModel) -> list[tuple[nn.Module, str, int]]:
    """(parent ModuleList, attribute path, index) of every transformer block, in forward order: a decoder's
    layers, the modules of the class it names in `_no_split_modules` (what Accelerate and torchtitan
    wrap per block; check_blocks)."""
    if isinstance(model, T5ForConditionalGeneration):
        stacks = [("encoder.block", model.encoder.block), ("decoder.block", model.decoder.block)]
    else:
        stacks = [_decoder_layers(model)]
    return [(blocks, path, i) for path, blocks in stacks for i in range(len(blocks))]


def check_blocks(model: PreTrainedModel) -> None:
    """The blocks found are the decoder-layer class the model names in `_no_split_modules` (before
    activation checkpointing or compile wraps them): the unit FSDP shards, checkpointing wraps, compile
    compiles."""
    split = set(model._no_split_modules or ())
    found = {type(parent[i]).__name__ for parent, _, i in transformer_blocks(model)}
    if split and not found <= split:
        raise TypeError(f"{type(model).__name__}'s blocks are {sorted(found)}, not its _no_split_modules "
                        f"{sorted(split)}")


def _init_value(name: str, shape: torch.Size, dtype: torch.dtype, device: torch.device,
                seed: int) -> torch.Tensor:
    """Full initial value of one parameter, the same on every rank and under every sharding."""
    if len(shape) == 1:  # norm weights 1, biases (Qwen2's q, k, v) 0
        fill = torch.zeros if name.endswith(".bias") else torch.ones
        return fill(shape, dtype=dtype, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    out = torch.empty(shape, dtype=torch.float32, device=device)
    out.normal_(0.0, INIT_STD, generator=gen)
    return out.to(dtype)


_WRAPPER_NAMES = ("_checkpoint_wrapped_module.", "_orig_mod.")  # activation checkpointing, torch.compile


@torch.no_grad()
def materialize(model: PreTrainedModel, device: torch.device, seed: int,
                param_device: torch.device | None = None) -> None:
    """Allocate the (sharded) parameters on `param_device` (the host with CPU offload; else `device`) and
    fill them deterministically; buffers go to `device`, where the compute runs.

    Parameter names are taken from the unwrapped module path, so checkpoint and compile wrappers do not
    change the values.
    """
    meta_buffers = {n for n, b in model.named_buffers() if b.is_meta}
    param_device = param_device or device
    model.to_empty(device=param_device)
    for name, param in model.named_parameters():
        clean = name
        for wrapper in _WRAPPER_NAMES:
            clean = clean.replace(wrapper, "")
        full = _init_value(clean, param.shape, param.dtype, device, seed)  # one RNG stream, offloaded or not
        local = param.to_local() if hasattr(param, "to_local") else param
        if hasattr(param, "device_mesh"):
            from torch.distributed.tensor import distribute_tensor
            full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        local.copy_(full)
        del full
    _rebuild_buffers(model, device, meta_buffers)


def _rebuild_buffers(model: nn.Module, device: torch.device, names: set[str]) -> None:
    """Recompute buffers that were created on meta: by rebuilding their module where it takes the model
    config (rotary inv_freq), else from the scalar the module keeps beside it (Gemma's embed_scale)."""
    done: set[str] = set()
    for mod_name, module in model.named_modules():
        own = {b: f"{mod_name}.{b}" if mod_name else b for b, _ in module.named_buffers(recurse=False)}
        if not set(own.values()) & names:
            continue
        if hasattr(module, "config"):  # rotary embeddings
            fresh = dict(type(module)(module.config).named_buffers(recurse=False))
        else:
            fresh = {b: torch.tensor(getattr(module, f"scalar_{b}")) for b in own
                     if hasattr(module, f"scalar_{b}")}
        for b, value in fresh.items():
            module._buffers[b] = value.to(device)  # on the compute device, also when parameters are offloaded
            done.add(own[b])
    missing = names - done
    if missing:
        raise RuntimeError(f"buffers left uninitialised on meta: {sorted(missing)}")
