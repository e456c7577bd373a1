"""A brought model of a family with no formula (Qwen3, GPT-2) counted from the model itself: parameters as
the model cards publish them, FLOPs as a formula written out here has them, the families with a formula
counted the same both ways, and the model trained by real torchrun under two strategies with one loss."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.core.flops import model_flops_per_token, recompute_flops_per_token
from bench.core.models import (
    arch_of,
    count_params,
    float8_linear_params,
    model_source,
    needs_census,
    non_embedding_params,
    register_census,
)
from conftest import SERIES
from trainer.census import count, flops

# the runs of conftest.Series train on one pytest-xdist worker: where every test that reads them runs
pytestmark = pytest.mark.xdist_group("series")

HF = Path(__file__).resolve().parents[1] / "bench" / "core" / "testdata" / "hf"


def _counted(ref: str):
    name, config = model_source(ref)
    census = count(config)
    register_census(config, census)
    return name, config, census


def test_qwen3_0_6b_has_its_cards_parameters() -> None:
    """Model card: 0.6B parameters, 0.44B non-embedding. The formula: Llama's block plus Qwen3's q and k
    norms (head_dim each), tied embeddings."""
    name, config, census = _counted(str(HF / "qwen3_0_6b" / "config.json"))
    h, heads, kv, d, ffn, layers, vocab = 1024, 16, 8, 128, 3072, 28, 151936
    block = h * heads * d * 2 + h * kv * d * 2 + 3 * h * ffn + 2 * h + 2 * d
    assert census.block_params == (block,) * layers
    assert census.params == layers * block + h + vocab * h == 596_049_920
    assert round(census.params / 1e9, 1) == 0.6 and round((census.params - census.embedding) / 1e9, 2) == 0.44
    assert census.tied and census.max_seq_len == 40960
    arch = arch_of(name, config)
    assert count_params(arch) == census.params and arch.layers == layers and arch.hidden == h


def test_gpt2_is_counted_from_its_own_blocks() -> None:
    """GPT-2 keeps its blocks in transformer.h, learned positions, biases everywhere and a plain MLP:
    124,439,808 parameters (openai-community/gpt2). Its forward FLOPs per token: 2 x the matmul weights
    (12 d^2 per block, the tied output projection) + 4 x layers x d x seq for attention."""
    name, config, census = _counted(str(HF / "gpt2" / "config.json"))
    d, layers, vocab = 768, 12, 50257
    assert census.params == 124_439_808 and census.tied and len(census.block_params) == layers
    assert census.forward_flops == (2 * (12 * d * d * layers + vocab * d), 4 * layers * d)
    arch = arch_of(name, config)
    assert model_flops_per_token(arch, 1024) == 3 * (census.forward_flops[0] + 1024 * census.forward_flops[1])


@pytest.mark.parametrize("ref", ["tiny_gpt2", "tiny_qwen3"])
def test_two_shallow_copies_count_what_the_whole_model_counts(ref: str) -> None:
    _, config, census = _counted(ref)
    assert (census.forward_flops, census.recompute_flops) == flops(config, len(census.block_params), False)


@pytest.mark.parametrize("ref", ["tiny_mistral", "tiny_qwen2", "tiny_gemma2",
                                 str(HF / "mistral_7b_v0.1" / "config.json"), str(HF / "phi3_mini_4k")])
def test_a_family_with_a_formula_counts_the_same_from_the_model(ref: str) -> None:
    """The census and bench/core/models.py's formulas agree: parameters and Float8 weights exactly, FLOPs
    within 0.2% (the formula's 6N counts the norms' weights as matmuls). It found the formula's Gemma 2
    recompute 7% low: its MLP output feeds a norm, so checkpointing reruns the last projection too."""
    name, config = model_source(ref)
    assert not needs_census(config)
    arch = arch_of(name, config)
    counted = replace(arch, counted=count(config))
    assert count_params(counted) == count_params(arch)
    assert non_embedding_params(counted) == non_embedding_params(arch)
    assert float8_linear_params(counted) == float8_linear_params(arch)
    for seq in (512, 4096):
        assert model_flops_per_token(counted, seq) == pytest.approx(model_flops_per_token(arch, seq),
                                                                    rel=2e-3)
        for ac in ("full", "selective"):
            assert recompute_flops_per_token(counted, seq, ac) == pytest.approx(
                recompute_flops_per_token(arch, seq, ac), rel=2e-3)


def test_a_family_without_a_formula_needs_its_census() -> None:
    from bench.core.models import ModelError, arch_from_config
    name, config = model_source("tiny_qwen3")
    arch_from_config.cache_clear()
    from bench.core import models
    models._COUNTED.pop(config, None)
    with pytest.raises(ModelError, match="counted from the model itself"):
        arch_of(name, config)


def _args(ref: str, sharding: str) -> list[str]:
    name, config = model_source(ref)
    return ["--model", name, "--model-config", config, "--sharding", sharding, "--nodes", "1",
            "--gpus-per-node", "2", "--precision", "fp32", "--steps", "4", "--warmup-steps", "1",
            "--seq-len", "64", "--micro-batch", "2", "--activation-checkpointing", "full"]


def _run(ref: str, sharding: str):
    return SERIES.result(_args(ref, sharding), nproc=2)


for _sharding in ("FULL_SHARD", "NO_SHARD"):  # trained with the session's other 2-rank runs (conftest.Series)
    SERIES.declare(_args("tiny_gpt2", _sharding), nproc=2)


@pytest.mark.parametrize("ref", ["tiny_gpt2", pytest.param("tiny_qwen3", marks=pytest.mark.slow)])
def test_a_counted_family_trains_with_the_same_loss_under_every_strategy(ref: str) -> None:
    """The worker counts the model as the planner did (its census in the worker's own process): the
    summary's model FLOPs are the census's."""
    full, none = _run(ref, "FULL_SHARD"), _run(ref, "NO_SHARD")
    assert full.returncode == 0, full.output[-3000:]
    assert none.returncode == 0, none.output[-3000:]
    losses = full.summary["losses"]
    assert none.summary["losses"] == pytest.approx(losses, rel=2e-5, abs=2e-5)
    assert max(losses) - min(losses) > 1e-3
    _, _, census = _counted(ref)
    per_token = 3 * (census.forward_flops[0] + 64 * census.forward_flops[1])
    expected = per_token * full.summary["tokens_per_s_per_gpu"] / 1e12
    assert full.summary["tflops_per_gpu"] == pytest.approx(expected, rel=1e-6)
