"""A brought model's counts, taken from the model itself: `python -m trainer.census` (a worker command).

For a decoder family bench/core/models.py has no formula for (Qwen3, OLMo 2, StarCoder2, GPT-2, ...),
the planner needs what it would otherwise derive from the config's fields: parameters (total, per block,
the embedding, whether the output projection is tied), the weights Float8 converts, and FLOPs per token.
The model is built on the meta device (no memory) and counted: parameters by walking it, FLOPs with torch's
FlopCounterMode over one forward and backward at two sequence lengths (a line in the length: the matmuls,
then attention's products), without and with full activation checkpointing (what checkpointing reruns,
per block). So an attention variant, a gated or plain MLP, biases, extra norms or tied embeddings need no
formula.

Each stdin line a config (canonical JSON); each answer a `census` record (or one with `error`).
"""
from __future__ import annotations

import json
import sys
from typing import Any

from bench.core.warm import run_warm

if __name__ == "__main__":
    run_warm("trainer.census")  # in a warm process, where its environment names one (bench/core/warm.py)

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from bench.core.models import Census, has_census, needs_census, register_census  # noqa: E402
from bench.core.records import error_line, format_record  # noqa: E402
from trainer.data import synthetic_batch  # noqa: E402
from trainer.model import build_brought_meta_model, transformer_blocks  # noqa: E402
from trainer.parallel import apply_activation_checkpointing, float8_filter  # noqa: E402

SEQ_LENS = (16, 32)  # two lengths give each count's line in the sequence length
DEPTHS = (1, 2)  # identical blocks: two shallow copies give the FLOPs outside the blocks and of each block


def count_cpu_attention() -> None:
    """FlopCounterMode knows SDPA's GPU kernels; the counts run on the CPU, whose flash kernel it does
    not know (and would count as 0). The same shapes do the same matmuls: count them as torch counts SDPA."""
    from torch.utils import flop_counter as fc
    aten = torch.ops.aten
    if aten._scaled_dot_product_flash_attention_for_cpu in fc.flop_registry:
        return
    for cpu, gpu in ((aten._scaled_dot_product_flash_attention_for_cpu,
                      aten._scaled_dot_product_flash_attention),
                     (aten._scaled_dot_product_flash_attention_for_cpu_backward,
                      aten._scaled_dot_product_flash_attention_backward)):
        fc.register_flop_formula(cpu, get_raw=True)(fc.flop_registry[gpu])  # the GPU kernel's, as registered


def _field(cfg: Any, *names: str, default: Any = None) -> Any:
    return next((getattr(cfg, n) for n in names if isinstance(getattr(cfg, n, None), int)), default)


def _step_flops(config_json: str, seq_len: int, checkpointed: bool) -> tuple[float, float]:
    """(forward, forward and backward) FLOPs of one sequence, on fake tensors as the memory measurement
    steps (some families read values while building masks, which the meta device cannot)."""
    model = build_brought_meta_model(config_json, torch.float32)
    if checkpointed:
        apply_activation_checkpointing(model, "full")
    count_cpu_attention()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        model.train()
        batch = synthetic_batch(vocab=model.get_input_embeddings().num_embeddings, micro_batch=1,
                                seq_len=seq_len, seed=0, first=0, step=0, device=torch.device("cpu"),
                                encoder_decoder=False)
        with FlopCounterMode(display=False) as counter:
            loss = model(**batch).loss
            forward = counter.get_total_flops()
            loss.backward()
    return float(forward), float(counter.get_total_flops())


def _line(values: list[float]) -> tuple[float, float]:
    """(a, b) of a + b * seq through the counts at SEQ_LENS, per token."""
    (s1, s2), (v1, v2) = SEQ_LENS, (v / s for v, s in zip(values, SEQ_LENS))
    slope = (v2 - v1) / (s2 - s1)
    return v1 - slope * s1, slope


def config_at_depth(config_json: str, blocks: int) -> str:
    """The config with `blocks` blocks (transformers maps num_hidden_layers to a family's own name)."""
    fields = json.loads(config_json)
    fields["num_hidden_layers"] = blocks
    if "layer_types" in fields:
        fields["layer_types"] = fields["layer_types"][:blocks]
    return json.dumps(fields, sort_keys=True)


def _counts(config_json: str) -> tuple[list[float], list[float]]:
    """Forward FLOPs, and what full activation checkpointing adds, at each of SEQ_LENS."""
    plain = [_step_flops(config_json, s, False) for s in SEQ_LENS]
    full = [_step_flops(config_json, s, True) for s in SEQ_LENS]
    return [p[0] for p in plain], [f[1] - p[1] for f, p in zip(full, plain)]


def flops(config_json: str, blocks: int, alike: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """(forward per token, full checkpointing's recompute per block and token), each a line in seq. Blocks
    alike: counted on two shallow copies (DEPTHS), whose difference is one block (seconds, whatever the
    depth); else the whole model."""
    if not alike:
        forward, recompute = _counts(config_json)
        return _line(forward), _line([r / blocks for r in recompute])
    (f1, r1), (f2, r2) = (_counts(config_at_depth(config_json, d)) for d in DEPTHS)
    per_block = [b - a for a, b in zip(f1, f2)]
    forward = [a + (blocks - DEPTHS[0]) * p for a, p in zip(f1, per_block)]
    return _line(forward), _line([b - a for a, b in zip(r1, r2)])


def count(config_json: str) -> Census:
    """The census of a brought decoder config."""
    model = build_brought_meta_model(config_json, torch.float32)
    cfg = model.config
    blocks = [parent[i] for parent, _, i in transformer_blocks(model)]
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    float8 = sum(m.weight.numel() for block in blocks for name, m in block.named_modules()
                 if float8_filter(m, name))
    sizes = tuple(sum(p.numel() for p in b.parameters()) for b in blocks)
    layer_types = getattr(cfg, "layer_types", None) or []
    alike = len(set(sizes)) == 1 and len(blocks) > DEPTHS[-1] and len(set(layer_types)) <= 1
    forward, recompute = flops(config_json, len(blocks), alike)
    hidden = _field(cfg, "hidden_size", "n_embd", "d_model")
    heads = _field(cfg, "num_attention_heads", "n_head")
    return Census(
        hidden=hidden, heads=heads, kv_heads=_field(cfg, "num_key_value_heads", default=heads),
        head_dim=_field(cfg, "head_dim", default=hidden // heads), vocab=embedding.shape[0],
        max_seq_len=_field(cfg, "max_position_embeddings", "n_positions", default=2048),
        params=sum(p.numel() for p in model.parameters()), embedding=embedding.numel(),
        tied=output is not None and output.weight is embedding,
        block_params=sizes, float8_params=float8, forward_flops=forward, recompute_flops=recompute)


def ensure(config_json: str) -> None:
    """Count a brought config in this process where its family needs it (a worker's spec.arch reads it)."""
    if needs_census(config_json) and not has_census(config_json):
        register_census(config_json, count(config_json))


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python -m trainer.census < configs.jsonl", file=sys.stderr)
        return 2
    for line in sys.stdin:
        if not line.strip():
            continue
        config_json = line.strip()
        try:
            answer = {"census": count(config_json).__dict__}
        except Exception as e:  # noqa: BLE001 (one config that cannot be built never stops the others)
            answer = {"error": error_line(e)}
        print(format_record("census", **answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
