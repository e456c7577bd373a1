"""The typed configuration: every field documented, every Literal-typed field's values checked from its one
list, and OmegaConf handed a schema it reads while the sweep gets the dataclasses back."""
from __future__ import annotations

import copy
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from bench.core import config, config_doc, load_config
from bench.core.config import ConfigError, FaultRule, SweepConfig, literal_choices
from bench.core.load_config import from_dict
from bench.core.schema import SHARDINGS, Sharding
from bench.core.validation import validate

RAW = {"sweep_name": "t", "launcher": {"name": "local"},
       "cluster": {"name": "c", "instance_type": "local", "gpus_per_node": 2, "max_nodes": 2}}


def config_classes() -> list[type]:
    return [v for v in vars(config).values() if isinstance(v, type) and is_dataclass(v)
            and v.__module__ == config.__name__]


def test_every_field_and_section_says_what_it_is() -> None:
    """A key's docstring (a section's: its class's) is what --help and docs/study.md show."""
    docs = config_doc.field_docs()
    missing = [f"{cls.__name__}.{f.name}" for cls in config_classes() for f in fields(cls)
               if config_doc._section_class(get_type_hints(cls)[f.name]) is None
               and not docs[cls.__name__].get(f.name)]
    assert not missing, f"fields without a docstring: {missing}"
    assert all(cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") for cls in config_classes())
    assert len(config_doc.sections()) == len(config_classes()) == 13  # each class one section of the listing


def test_a_literal_is_its_lists_one_source() -> None:
    assert get_type_hints(config.Axes)["sharding"] == list[Sharding]
    assert literal_choices(get_args(list[Sharding])[0]) == SHARDINGS
    assert literal_choices(get_type_hints(config.SlurmClusterConfig)["admission"]) == config.ADMISSIONS == (
        "harness", "slurm")
    assert literal_choices(int | None) is None
    assert literal_choices(get_type_hints(config.TraceConfig)["steps"]) is None


def literal_keys(cls: type = SweepConfig, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], bool]]:
    """Every Literal-typed field below `cls`: its path (an entry of a list: the list's name then "[]") and
    whether it holds a list of values."""
    out = []
    for name, hint in get_type_hints(cls).items():
        inner = get_args(hint)[0] if get_origin(hint) is list else None
        if is_dataclass(hint):
            out += literal_keys(hint, (*path, name))
        elif inner is not None and is_dataclass(inner):
            out += literal_keys(inner, (*path, name, "[]"))
        elif literal_choices(hint) or (inner is not None and literal_choices(inner)):
            out.append(((*path, name), inner is not None))
    return out


def _set(cfg: SweepConfig, path: tuple[str, ...], value: Any) -> None:
    node: Any = cfg
    for part in path[:-1]:
        if part == "[]":  # an entry of a list of sections: faults
            node.append(FaultRule(fault="none"))
            node = node[-1]
        else:
            node = getattr(node, part)
    setattr(node, path[-1], value)


def test_every_literal_field_refuses_a_value_outside_its_list() -> None:
    """Found from the types, so a Literal field added later is checked with no new rule: one line naming the
    key (an entry of faults: the list and the field)."""
    good = from_dict(copy.deepcopy(RAW))
    keys = literal_keys()
    assert {".".join(p) for p, _ in keys} >= {"axes.sharding", "cluster.slurm.admission", "preflight.mode",
                                               "trace.ranks", "faults.[].fault", "nccl.collectives"}
    for path, is_list in keys:
        cfg = copy.deepcopy(good)
        _set(cfg, path, ["nope"] if is_list else "nope")
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        where = ("faults: unknown " + path[-1]) if "[]" in path else ".".join(path)
        message = str(e.value)
        assert message.startswith(where) and "'nope'" in message and "\n" not in message, message


def test_the_messages_name_the_key_and_the_list() -> None:
    cases = {
        ("axes", "sharding"): "axes.sharding: unknown value 'nope'; known: FULL_SHARD, SHARD_GRAD_OP, "
                              "HYBRID_SHARD, NO_SHARD",
        ("cluster", "slurm", "admission"): "cluster.slurm.admission='nope' is not one of: harness, slurm",
        ("faults", "[]", "collective"): "faults: unknown collective 'nope'; known: all_reduce, all_gather, "
                                        "reduce_scatter"}
    good = from_dict(copy.deepcopy(RAW))
    for path, message in cases.items():
        cfg = copy.deepcopy(good)
        _set(cfg, path, ["nope"] if path[-1] == "sharding" else "nope")
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(") + "$"):
            validate(cfg)


def test_omegaconf_reads_a_schema_and_the_sweep_gets_the_dataclasses() -> None:
    raw = {**copy.deepcopy(RAW), "faults": [{"fault": "sleep", "match": {"nodes": 1}}],
           "axes": {"micro_batch": ["auto", 2]}}
    cfg = from_dict(raw)
    assert type(cfg) is SweepConfig and type(cfg.cluster.slurm) is config.SlurmClusterConfig
    assert type(cfg.faults[0]) is FaultRule and cfg.faults[0].match == {"nodes": 1}
    assert cfg.axes.micro_batch == ["auto", 2] and cfg.cluster.slurm.admission == "harness"
    schema = load_config.omegaconf_schema(SweepConfig)
    assert schema is not SweepConfig and schema.__name__ == "SweepConfig"
    assert get_type_hints(load_config.omegaconf_schema(config.Axes))["sharding"] == list[str]
    with pytest.raises(ConfigError, match=r"^axes.nodes\[0\]: Value 'x' of type 'str' could not be"):
        from_dict({**copy.deepcopy(RAW), "axes": {"nodes": ["x"]}})
    with pytest.raises(ConfigError, match="^unknown key axes.shard; known there: model, nodes"):
        from_dict({**copy.deepcopy(RAW), "axes": {"shard": ["FULL_SHARD"]}})
