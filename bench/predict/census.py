"""The counts of a brought model whose family has no formula in bench/core/models.py, taken from the model
itself by `python -m trainer.census` (this module runs it as a command: bench never imports torch) and
cached beside the memory measurements, under the same fingerprint of the worker's sources and libraries.
A config transformers cannot build is refused here, in one line, before anything is launched.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from bench.core.config import ConfigError
from bench.core.models import Census, has_census, needs_census, register_census
from bench.core.records import parse_records
from bench.core.rundir import atomic_write_text
from bench.launchers.base import PROJECT_ROOT
from bench.launchers.processes import command_env, die_with_parent
from bench.predict.memory import default_cache_dir, fingerprint

TIMEOUT_S = 600.0  # a 32B model (Qwen3 32B's shape) counts in about 13 s on two cores


def ensure(name: str, config_json: str, cache_dir: str | Path | None = None) -> None:
    """Make a brought config's architecture known to this process (bench.core.models.arch_of): from the
    cache, else counted now. Raises ConfigError where it cannot be counted."""
    if not needs_census(config_json) or has_census(config_json):
        return
    key = hashlib.sha256((config_json + fingerprint()).encode()).hexdigest()[:16]
    path = Path(cache_dir or default_cache_dir()) / "census" / f"{key}.json"
    try:
        census = Census.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        census = count(name, config_json)
        atomic_write_text(path, json.dumps(census.__dict__))
    register_census(config_json, census)


def count(name: str, config_json: str) -> Census:
    """Run the census worker on one config; its error, if any, as one line."""
    kind = json.loads(config_json)["model_type"]
    where = f"model {name!r} (model_type {kind!r})"
    if importlib.util.find_spec("torch") is None:
        raise ConfigError(f"{where} is counted from the model itself, which needs torch and transformers "
                          "where the sweep plans (pip install torch)")
    print(f"model: counting {name} ({kind}) from the model itself: python -m trainer.census", flush=True)
    try:
        done = subprocess.run([sys.executable, "-m", "trainer.census"], input=config_json + "\n", text=True,
                              capture_output=True, cwd=PROJECT_ROOT, env=command_env(), timeout=TIMEOUT_S,
                              preexec_fn=die_with_parent())
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{where}: counting it took over {TIMEOUT_S:g} s") from None
    answers = [r for r in parse_records(done.stdout.splitlines()) if r.get("kind") == "census"]
    if not answers:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]
        raise ConfigError(f"{where}: the census worker gave no answer ({last})")
    if "error" in answers[0]:
        raise ConfigError(f"{where} cannot be built and counted here: {answers[0]['error']}")
    return Census.from_dict(answers[0]["census"])
