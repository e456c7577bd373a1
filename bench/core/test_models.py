"""Models a user brings as a Hugging Face config: parameter counts against the model cards, mixture-of-experts
active parameters, names and run ids, and one-line refusals of what cannot be trained."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.flops import model_flops_per_token
from bench.core.models import ModelError, arch_from_config, count_params, model_source, non_embedding_params
from bench.core.schema import RunSpec

ROOT = Path(__file__).resolve().parents[2]
HF = Path(__file__).parent / "testdata" / "hf"
PUBLISHED = json.loads((HF / "published_params.json").read_text())


def _arch(ref: str):
    return arch_from_config(*model_source(ref))


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_a_published_config_counts_its_model_cards_parameters(model: str) -> None:
    assert count_params(_arch(str(HF / model / "config.json"))) == PUBLISHED[model]


def test_mixtral_computes_with_its_top_two_experts() -> None:
    """Mixtral 8x7B: 46.7B parameters, 12.9B active per token (its model card): the router picks 2 of 8
    experts, so a token's FLOPs count 2 experts' MLPs, every attention weight, the router, the head."""
    arch = _arch(str(HF / "mixtral_8x7b_v0.1" / "config.json"))
    embedding = arch.vocab * arch.hidden
    active = non_embedding_params(arch, active=True)
    assert active + embedding == 12_879_925_248
    expert = 3 * arch.hidden * arch.ffn
    assert non_embedding_params(arch) - active == arch.layers * 6 * expert  # 6 of 8 experts idle per token
    attention = 12 * arch.layers * arch.heads * arch.head_dim * 4096
    assert model_flops_per_token(arch, 4096) == 6 * active + attention


def test_a_dense_model_is_all_active() -> None:
    arch = _arch(str(HF / "mistral_7b_v0.1" / "config.json"))
    assert non_embedding_params(arch, active=True) == non_embedding_params(arch)


def test_names_come_from_the_file_or_the_config() -> None:
    assert model_source(str(HF / "qwen2_7b" / "config.json"))[0] == "qwen2_7b"  # _name_or_path Qwen/Qwen2-7B
    assert model_source(str(HF / "gemma2_9b"))[0] == "gemma_2_9b"  # a directory holding config.json
    assert model_source("tiny_mistral")[0] == "tiny_mistral"  # sweeps/model/tiny_mistral.yaml
    assert model_source("llama2_7b") == ("llama2_7b", "")  # a preset carries no config


def test_an_edited_config_is_a_new_run(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    config = json.loads((HF / "mistral_7b_v0.1" / "config.json").read_text())
    ids = []
    for layers in (32, 16):
        path.write_text(json.dumps({**config, "num_hidden_layers": layers}))
        model_source.cache_clear()
        name, cfg = model_source(str(path))
        ids.append(RunSpec(model=name, model_config=cfg).run_id)
    assert ids[0] != ids[1]
    assert RunSpec(model="tiny_llama").run_id == RunSpec(model="tiny_llama", model_config="").run_id


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.json"
    path.write_text(text)
    model_source.cache_clear()
    return str(path)


@pytest.mark.parametrize("text,why", [
    ("{not json", "is not valid JSON"),
    ('{"model_type": "bert", "hidden_size": 768}', "is an encoder-only model"),
    ('{"model_type": "t5", "is_encoder_decoder": true}', "is an encoder-decoder model"),
    ('{"model_type": "qwen2_moe", "num_experts": 60}', "is a mixture of experts"),
    ('{"hidden_size": 768}', "has no model_type"),
    ('{"model_type": "mistral", "hidden_size": 64}', "lacks intermediate_size"),
    ('[1, 2]', "does not hold a mapping"),
    ('{"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "x.Y"}}', "runs no downloaded code"),
])
def test_a_config_that_cannot_be_trained_is_refused_in_one_line(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ModelError) as e:
        model_source(_write(tmp_path, text))
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_hub_id_is_refused_not_downloaded() -> None:
    with pytest.raises(ModelError, match="never downloaded"):
        model_source("mistralai/Mistral-7B-v0.1")
    with pytest.raises(ModelError, match="neither a preset"):
        model_source("no_such_model")


@pytest.mark.parametrize("override,why", [
    ("axes.model=[/nonexistent/config.json]", "is neither a preset"),
    (f"axes.model=[{HF / 'phi3_mini_4k' / 'config.json'}]", "exceeds model"),  # max_position_embeddings 4096
])
def test_bad_models_stop_the_sweep_before_anything_is_written(tmp_path: Path, override: str,
                                                              why: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=p5_scaling", override,
                           "axes.seq_len=[8192]", f"results_root={tmp_path}", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and why in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
