"""A brought family with no formula, as the planner sees it: counted once by the worker command and cached,
refused in one line where it cannot be built or counted, and planned like a preset (memory measured, a
prediction) by the sweep's own command."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

import bench.predict.census as census
from bench.core import models
from bench.core.config import ConfigError
from bench.core.models import arch_of, count_params, model_source

ROOT = Path(__file__).resolve().parents[2]


def _forget(config: str) -> None:
    models._COUNTED.pop(config, None)
    models.arch_from_config.cache_clear()


def test_a_census_is_counted_once_then_read_from_the_cache(tmp_path: Path, monkeypatch, capsys) -> None:
    name, config = model_source("tiny_qwen3")
    _forget(config)
    census.ensure(name, config, tmp_path)
    assert "counting tiny_qwen3 (qwen3)" in capsys.readouterr().out
    params = count_params(arch_of(name, config))
    assert params == sum(json.loads(p.read_text())["params"] for p in (tmp_path / "census").glob("*.json"))
    _forget(config)

    def count_again(*_):
        raise AssertionError("counted again")
    monkeypatch.setattr(census, "count", count_again)
    census.ensure(name, config, tmp_path)
    assert count_params(arch_of(name, config)) == params


def test_a_preset_family_needs_no_census(tmp_path: Path) -> None:
    census.ensure(*model_source("tiny_mistral"), tmp_path)
    assert not (tmp_path / "census").exists()


def test_without_torch_a_counted_family_is_refused_in_one_line(tmp_path: Path, monkeypatch) -> None:
    name, config = model_source("tiny_gpt2")
    _forget(config)
    monkeypatch.setattr(census.importlib.util, "find_spec", lambda _: None)
    with pytest.raises(ConfigError, match="needs torch and transformers where the sweep plans"):
        census.ensure(name, config, tmp_path)


def test_a_model_type_transformers_does_not_know_stops_the_sweep_before_anything_is_written(
        tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "not_a_model", "hidden_size": 64}))
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke", f"axes.model=[{path}]",
                           f"results_root={results}", f"memory.cache_dir={tmp_path / 'cache'}", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot be built and counted here" in proc.stderr and "not_a_model" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not results.exists()


@pytest.mark.slow
def test_p5_scaling_plans_a_qwen3_config_like_a_preset(tmp_path: Path) -> None:
    """p5_scaling's dry run with a family the planner has no formula for: every training run gets a measured
    memory peak and a prediction (about a minute cold on two cores, census included)."""
    config = ROOT / "bench" / "core" / "testdata" / "hf" / "qwen3_0_6b" / "config.json"
    proc = subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=p5_scaling", f"axes.model=[{config}]",
                           f"results_root={tmp_path / 'results'}", f"memory.cache_dir={tmp_path / 'cache'}",
                           "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "counting qwen3_0_6b (qwen3) from the model itself" in proc.stdout
    with open(tmp_path / "results" / "p5_scaling" / "plan.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "train"]
    assert len(rows) >= 10 and {r["model"] for r in rows} == {"qwen3_0_6b"}
    assert all(r["pred_mem_source"] == "measured" and float(r["pred_tokens_per_s_per_gpu"]) > 0 for r in rows)


def test_float8_on_a_model_with_no_linear_it_converts_stops_the_sweep(tmp_path: Path) -> None:
    """GPT-2's projections are Conv1D, not nn.Linear: torchao converts none of them, and the worker would
    refuse the run after launch; the plan refuses it first."""
    from bench.predict.test_memory import cfg_for
    from bench.study.plan import expand
    cfg = cfg_for(tmp_path, "+sweep=smoke", "axes.model=[tiny_gpt2]", "axes.precision=[fp8_tensorwise]")
    with pytest.raises(ConfigError, match="fp8_tensorwise converts no linear of model 'tiny_gpt2'"):
        expand(cfg)
