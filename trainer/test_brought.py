"""Models a user brings (a Hugging Face config): transformers' own class built on meta with the model card's
parameter count, wrapped per decoder layer, trained by real torchrun with the same loss under every strategy,
and its FLOPs counted on fake tensors as the planner's analytic count has them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.core.flops import hardware_flops_per_token, model_flops_per_token
from bench.core.models import count_params, model_source
from bench.core.schema import RunSpec
from conftest import SERIES
from trainer.model import build_meta_model, transformer_blocks

# the runs of conftest.Series train on one pytest-xdist worker: where every test that reads them runs
pytestmark = pytest.mark.xdist_group("series")

HF = Path(__file__).resolve().parents[1] / "bench" / "core" / "testdata" / "hf"
PUBLISHED = json.loads((HF / "published_params.json").read_text())


def _spec(ref: str, **fields) -> RunSpec:
    name, config = model_source(ref)
    return RunSpec(model=name, model_config=config, **fields)


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_the_model_transformers_builds_has_the_cards_parameter_count(model: str) -> None:
    spec = _spec(str(HF / model / "config.json"))
    built = build_meta_model(spec.arch, torch.bfloat16)
    assert type(built).__name__ == json.loads(spec.model_config)["architectures"][0]
    assert sum(p.numel() for p in built.parameters()) == PUBLISHED[model] == count_params(spec.arch)
    blocks = transformer_blocks(built)
    assert len(blocks) == spec.arch.layers
    assert {type(parent[i]).__name__ for parent, _, i in blocks} == set(built._no_split_modules)


@pytest.mark.parametrize("ref,ac", [("tiny_mistral", "none"), ("tiny_qwen2", "full"),
                                    ("tiny_gemma2", "selective"), ("tiny_llama", "full"),
                                    ("small_llama", "none"), ("tiny_t5", "none")])
def test_flops_counted_on_fake_tensors_equal_the_analytic_count(ref: str, ac: str) -> None:
    """Model FLOPs (three forwards) within 1% of 6N + attention. The hardware count can be a few percent
    above the analytic one: SDPA's backward recomputes the attention scores (torch counts that matmul), which
    the analytic convention leaves out; where attention is a small share (real model sizes) it vanishes."""
    from trainer.memory import measure
    seq = 128 if ref.endswith("t5") else 256
    spec = _spec(ref, nodes=1, gpus_per_node=2, micro_batch=1, seq_len=seq, activation_checkpointing=ac)
    measured = measure(spec, count_flops=True)
    assert measured["flops_per_token"] == pytest.approx(model_flops_per_token(spec.arch, seq), rel=0.01)
    hardware = hardware_flops_per_token(spec.arch, seq, ac)  # 6N counts the norms' weights: 0.2% at this size
    assert 0.998 * hardware <= measured["hw_flops_per_token"] < 1.05 * hardware


def test_a_mixture_of_experts_is_counted_analytically_not_on_fake_tensors() -> None:
    """Routing reads the router's values, which fake tensors do not have: the counted FLOPs miss the experts
    a token would be sent to. The planner's FLOPs for Mixtral are the analytic top-k count
    (bench/core/models.py), which this shows the fake count cannot replace."""
    from trainer.memory import measure
    spec = _spec("tiny_mixtral", nodes=1, gpus_per_node=2, micro_batch=1, seq_len=256)
    assert measure(spec)["flops_per_token"] < 0.9 * model_flops_per_token(spec.arch, 256)


def _brought(ref: str, sharding: str) -> list[str]:
    name, config = model_source(ref)
    return ["--model", name, "--model-config", config, "--sharding", sharding, "--nodes", "1",
            "--gpus-per-node", "2", "--precision", "fp32", "--steps", "4", "--warmup-steps", "1",
            "--seq-len", "64", "--micro-batch", "2"]


BROUGHT = {(ref, sharding): _brought(ref, sharding) for ref in ("tiny_mistral", "tiny_qwen2", "tiny_gemma2")
           for sharding in ("FULL_SHARD", "NO_SHARD")}
for _args in BROUGHT.values():
    SERIES.declare(_args, nproc=2)  # trained with the other 2-rank runs of the session (conftest.Series)


@pytest.fixture(scope="module")
def brought_runs():
    return {key: SERIES.result(args, nproc=2) for key, args in BROUGHT.items()}


@pytest.mark.parametrize("ref", ["tiny_mistral", "tiny_qwen2", "tiny_gemma2"])
def test_a_brought_model_trains_with_the_same_loss_under_every_strategy(brought_runs, ref: str) -> None:
    full, none = brought_runs[ref, "FULL_SHARD"], brought_runs[ref, "NO_SHARD"]
    assert full.returncode == 0, full.output[-3000:]
    assert none.returncode == 0, none.output[-3000:]
    losses = full.summary["losses"]
    assert none.summary["losses"] == pytest.approx(losses, rel=2e-5, abs=2e-5)
    assert max(losses) - min(losses) > 1e-3  # the optimizer steps: equal curves are not equal constants


def test_brought_models_differ_from_each_other(brought_runs) -> None:
    """The parity above can fail: each config is its own model, not the same Llama under three names."""
    first = [brought_runs[ref, "FULL_SHARD"].summary["losses"][0] for ref in ("tiny_mistral", "tiny_qwen2",
                                                                             "tiny_gemma2")]
    assert len({round(x, 4) for x in first}) == 3


@pytest.mark.parametrize("ref", ["tiny_llama", "llama3_2_1b", "tiny_qwen2", "tiny_mixtral", "tiny_t5",
                                 *(str(HF / model / "config.json") for model in sorted(PUBLISHED))])
def test_the_planners_float8_weights_are_those_torchao_converts(ref: str) -> None:
    """The plan's Float8 all-gather and matmul FLOPs (bench/predict/perf.py) count the weights the worker
    converts: linears inside blocks with both dimensions multiples of 16 (tiny_llama's MLP of 344 is not),
    no biases (Qwen2's q, k, v), no experts (fused parameters in transformers' MoE), Phi-3's fused q, k, v."""
    from torchao.float8.float8_linear import Float8Linear

    from bench.core.models import float8_linear_params
    from trainer.parallel import convert_float8
    spec = _spec(ref)
    model = build_meta_model(spec.arch, torch.bfloat16)
    convert_float8(model, torch.device("cpu"))
    converted = sum(m.weight.numel() for m in model.modules() if isinstance(m, Float8Linear))
    assert float8_linear_params(spec.arch) == converted > 0


def test_a_sequence_longer_than_the_sliding_window_attends_within_it() -> None:
    """Mistral's window, faithfully: beyond it the worker's model computes what transformers' eager
    attention (which masks to the window) computes, not the whole causal prefix."""
    from trainer.model import materialize
    name, config = model_source("tiny_mistral")
    windowed_config = json.dumps({**json.loads(config), "sliding_window": 8}, sort_keys=True)
    arch = RunSpec(model=name, model_config=windowed_config).arch
    ids = torch.randint(0, arch.vocab, (1, 32), generator=torch.Generator().manual_seed(0))

    def logits(**build) -> torch.Tensor:
        model = build_meta_model(arch, torch.float32, **build)
        materialize(model, torch.device("cpu"), seed=0)
        with torch.no_grad():
            return model(input_ids=ids).logits

    ours, eager, unwindowed = logits(seq_len=32), logits(attn_impl="eager", seq_len=32), logits(seq_len=8)
    torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(unwindowed[:, 8:], eager[:, 8:], atol=1e-3)  # the whole prefix: another model
    torch.testing.assert_close(unwindowed[:, :8], eager[:, :8], rtol=1e-4, atol=1e-4)  # within it: the same
