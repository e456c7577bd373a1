"""Model presets, FLOPs and activation checkpointing, checked against independent counts."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.flop_counter import FlopCounterMode

from bench.core.flops import hardware_flops_per_token, model_flops_per_token, recompute_flops_per_token
from bench.core.models import PRESETS, count_params, get_arch
from trainer.model import build_meta_model, materialize
from trainer.parallel import apply_activation_checkpointing

PUBLISHED = [name for name, a in PRESETS.items() if a.published_params]


@pytest.mark.parametrize("name", PUBLISHED)
def test_meta_model_has_published_parameter_count(name: str) -> None:
    """The Hugging Face model built from the preset, on meta (no weights allocated)."""
    model = build_meta_model(get_arch(name), torch.bfloat16)
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == PRESETS[name].published_params


@pytest.mark.parametrize("name", list(PRESETS))
def test_analytic_count_matches_the_hf_model(name: str) -> None:
    model = build_meta_model(get_arch(name), torch.float32)
    assert count_params(get_arch(name)) == sum(p.numel() for p in model.parameters())


def _counted_flops(arch_name: str, seq: int, batch: int, ac: str = "none") -> tuple[int, dict]:
    arch = get_arch(arch_name)
    model = build_meta_model(arch, torch.float32, attn_impl="eager")
    apply_activation_checkpointing(model, ac)
    materialize(model, torch.device("cpu"), seed=0)
    ids = torch.randint(0, arch.vocab, (batch, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops(), counter.get_flop_counts()["Global"]


@pytest.mark.parametrize("arch_name", ["tiny_llama", "tiny_t5"])
def test_formula_flops_match_flop_counter(arch_name: str) -> None:
    """6N + 12LHQT per token against torch.utils.flop_counter on a real forward+backward.

    Eager attention, because the counter does not see the fused CPU SDPA kernel. The residual is the
    norm weights (and T5's relative-position tables): they are in N but are not matmuls, so the formula
    counts 6 FLOPs per token for each of them that the counter does not.
    """
    seq, batch = 64, 2
    counted, _ = _counted_flops(arch_name, seq, batch)
    formula = model_flops_per_token(get_arch(arch_name), seq) * seq * batch
    assert counted == pytest.approx(formula, rel=0.05)
    assert counted < formula  # the residual has a known sign: non-matmul parameters


def test_llama_attention_term_is_exact() -> None:
    """The 12LHQT term equals the counted bmm FLOPs exactly (QK^T and AV, forward and backward)."""
    arch, seq, batch = get_arch("tiny_llama"), 64, 2
    _, by_op = _counted_flops("tiny_llama", seq, batch)
    bmm = sum(v for k, v in by_op.items() if "bmm" in str(k))
    assert bmm == 12 * arch.layers * arch.heads * arch.head_dim * seq * seq * batch


@pytest.mark.parametrize("arch_name", ["tiny_llama", "tiny_t5"])
@pytest.mark.parametrize("ac", ["full", "selective", "selective_op"])
def test_activation_checkpointing_recomputes_what_hfu_counts(arch_name: str, ac: str) -> None:
    """Counted FLOPs rise under AC by the forward of the checkpointed blocks: HFU's extra term."""
    seq, batch = 64, 2
    base, _ = _counted_flops(arch_name, seq, batch, "none")
    with_ac, _ = _counted_flops(arch_name, seq, batch, ac)
    arch = get_arch(arch_name)
    extra = recompute_flops_per_token(arch, seq, ac) * seq * batch
    assert with_ac - base == pytest.approx(extra, rel=0.02, abs=1e-9 * base)
    if ac == "selective_op":  # matmul outputs saved: the backward reruns no FLOP-counted op
        assert with_ac == base and hardware_flops_per_token(arch, seq, ac) == model_flops_per_token(arch, seq)
        return
    assert hardware_flops_per_token(arch, seq, ac) > model_flops_per_token(arch, seq)
    assert hardware_flops_per_token(arch, seq, "none") == model_flops_per_token(arch, seq)


def _activation_peak(ac: str) -> float:
    arch = replace(get_arch("small_llama"), layers=4)
    model = build_meta_model(arch, torch.float32)
    apply_activation_checkpointing(model, ac)
    materialize(model, torch.device("cpu"), seed=0)
    ids = torch.randint(0, arch.vocab, (2, 256))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(input_ids=ids, labels=ids).loss.backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return next(v for k, v in peak.items() if str(k).endswith("ACT"))


def test_activation_checkpointing_saves_activation_memory() -> None:
    none, full, selective, by_op = (_activation_peak(ac)
                                    for ac in ("none", "full", "selective", "selective_op"))
    assert full < 0.5 * none
    assert full < selective < none
    assert full < by_op < none  # the saved matmul outputs cost more than full AC, less than nothing
