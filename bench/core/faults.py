"""Test hook: faults injected into the workers of the runs a rule matches, so the harness's handling of a
crash, a hang, an OOM or a lagging rank is tested on real runs. Not a setting of a study: the rules come from
the environment of the sweep (FSDPBENCH_FAULTS, a YAML or JSON list of rules such as
`[{match: {precision: fp32}, fault: hang, step: 1}]`), never from its configuration or --help-config, and
reach each worker as its `--fault*` arguments (`bench.launchers.base.fault_args`).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, is_dataclass
from typing import Any

import yaml
from omegaconf import MISSING

from bench.core.config import ConfigError
from bench.core.load_config import typed
from bench.core.schema import FAULTS_ENV, SPEC_FIELDS, Fault, FaultCollective
from bench.core.validation import check_fields


@dataclass
class FaultRule:
    """A fault injected into the runs whose spec matches every key of `match`."""

    match: dict[str, Any] = field(default_factory=dict)
    """Run spec field -> a value or a list of values; the rule applies to the runs matching every key."""
    fault: Fault = MISSING
    """The fault to inject."""
    step: int = 1
    """The step at which the fault fires."""
    seconds: float = 0.0
    """sleep: seconds slept instead of working; slow_collective, slow_compute: the delay per call."""
    rank: int | None = None
    """Only this global rank (a lagging rank); null: every rank."""
    collective: FaultCollective = "all_gather"
    """slow_collective: the collective delayed."""


def environ(text: str) -> dict[str, str]:
    """This process's environment with the rules `text` gives, for a sweep started as a command (the tests,
    benchmarks/schedule_slurm.py)."""
    return {**os.environ, FAULTS_ENV: text}


def rules() -> tuple[FaultRule, ...]:
    """The rules $FSDPBENCH_FAULTS gives (none where it is unset), typed and checked: a bad one is one
    ConfigError line naming the variable, before anything is launched."""
    return parse(os.environ.get(FAULTS_ENV, ""))


@functools.cache
def parse(text: str) -> tuple[FaultRule, ...]:
    try:
        entries = yaml.safe_load(text) if text.strip() else []
    except yaml.YAMLError as e:
        raise ConfigError(f"{FAULTS_ENV}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{FAULTS_ENV} must be a list of rules, e.g. [{{match: {{}}, fault: hang}}]")
    return tuple(_rule(entry) for entry in entries)


def _rule(entry: dict[str, Any]) -> FaultRule:
    try:
        rule = typed(FaultRule, entry)
    except ConfigError as e:
        raise ConfigError(f"{FAULTS_ENV}: {e}") from None
    assert is_dataclass(rule)
    check_fields(rule, in_list=FAULTS_ENV)
    if unknown := sorted(set(rule.match) - set(SPEC_FIELDS)):  # a misspelt key would silently never fire
        raise ConfigError(f"{FAULTS_ENV}: unknown match key(s) {', '.join(unknown)}; keys are run spec "
                          f"fields: {', '.join(SPEC_FIELDS)}")
    return rule
