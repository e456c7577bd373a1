"""The typed configuration: every field documented, every Literal-typed field's values checked from its one
list, every declared range checked by one rule, each launcher's own section joined to the schema, and
OmegaConf handed a schema it reads while the sweep gets the dataclasses back."""
from __future__ import annotations

import copy
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from bench.core import config, config_doc, load_config
from bench.core.config import ConfigError, Range, SweepConfig, constraint_of, literal_choices
from bench.core.load_config import from_dict
from bench.core.schema import SHARDINGS, Sharding
from bench.core.validation import validate
from bench.launchers import BUILT_IN, launcher_sections
from bench.launchers.kubernetes import KubernetesSettings
from bench.launchers.local import LocalSettings
from bench.launchers.slurm import ADMISSIONS, SlurmSettings

RAW = {"sweep_name": "t", "launcher": {"name": "local"},
       "cluster": {"name": "c", "instance_type": "local", "gpus_per_node": 2, "max_nodes": 2}}
SECTIONS = launcher_sections(list(BUILT_IN))  # the built-in launchers' own sections


def config_classes() -> list[type]:
    """Every section's class: bench/core/config.py's and the built-in launchers' own."""
    schema = [v for v in vars(config).values() if isinstance(v, type) and is_dataclass(v)
              and v.__module__ == config.__name__ and v not in (config.Range, config.Matches)]
    return schema + list(SECTIONS.values())


def test_every_field_and_section_says_what_it_is() -> None:
    """A key's docstring (a section's: its class's) is what --help and docs/study.md show."""
    missing = [f"{cls.__name__}.{f.name}" for cls in config_classes() for f in fields(cls)
               if config_doc._section_class(get_type_hints(cls)[f.name]) is None
               and not config_doc.field_docs(cls).get(f.name)]
    assert not missing, f"fields without a docstring: {missing}"
    assert all(cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") for cls in config_classes())
    # each class one section of the listing: config.py's 13 (the fabric's three among them) and the local,
    # Slurm and Kubernetes launchers'
    assert len(config_doc.sections(SECTIONS)) == len(config_classes()) == 16
    assert SECTIONS == {"local": LocalSettings, "slurm": SlurmSettings, "kubernetes": KubernetesSettings}


def test_a_literal_is_its_lists_one_source() -> None:
    assert get_type_hints(config.Axes)["sharding"] == list[Sharding]
    assert literal_choices(get_args(list[Sharding])[0]) == SHARDINGS
    assert literal_choices(get_type_hints(SlurmSettings)["admission"]) == ADMISSIONS == ("harness", "slurm")
    assert literal_choices(int | None) is None
    assert literal_choices(get_type_hints(config.TraceConfig)["steps"]) is None


def literal_keys(cls: type, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], bool]]:
    """Every Literal-typed field below `cls`: its path and whether it holds a list of values."""
    out = []
    for name, hint in get_type_hints(cls).items():
        inner = get_args(hint)[0] if get_origin(hint) is list else None
        if is_dataclass(hint):
            out += literal_keys(hint, (*path, name))
        elif literal_choices(hint) or (inner is not None and literal_choices(inner)):
            out.append(((*path, name), inner is not None))
    return out


def _set(cfg: SweepConfig, path: tuple[str, ...], value: Any) -> None:
    node: Any = cfg
    for part in path[:-1]:
        node = getattr(node, part)
    setattr(node, path[-1], value)


def test_every_literal_field_refuses_a_value_outside_its_list() -> None:
    """Found from the types, so a Literal field added later (a launcher's too) is checked with no new rule:
    one line naming the key."""
    good = from_dict(copy.deepcopy(RAW), SECTIONS)
    keys = literal_keys(type(good))
    assert {".".join(p) for p, _ in keys} >= {"axes.sharding", "launcher.slurm.admission", "preflight.mode",
                                               "trace.ranks", "nccl.collectives"}
    for path, is_list in keys:
        cfg = copy.deepcopy(good)
        _set(cfg, path, ["nope"] if is_list else "nope")
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        message = str(e.value)
        assert message.startswith(".".join(path)) and "'nope'" in message and "\n" not in message, message


def test_the_messages_name_the_key_and_the_list() -> None:
    cases = {
        ("axes", "sharding"): "axes.sharding: unknown value 'nope'; known: FULL_SHARD, SHARD_GRAD_OP, "
                              "HYBRID_SHARD, NO_SHARD",
        ("launcher", "slurm", "admission"): "launcher.slurm.admission='nope' is not one of: harness, slurm"}
    good = from_dict(copy.deepcopy(RAW), SECTIONS)
    for path, message in cases.items():
        cfg = copy.deepcopy(good)
        _set(cfg, path, ["nope"] if path[-1] == "sharding" else "nope")
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(") + "$"):
            validate(cfg)


def ranged_keys(cls: type, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Range, bool]]:
    """Every field below `cls` that declares a Range: its path, the Range, and whether it holds a list."""
    out = []
    plain, declared = get_type_hints(cls), get_type_hints(cls, include_extras=True)
    for name, hint in declared.items():
        if is_dataclass(plain[name]):
            out += ranged_keys(plain[name], (*path, name))
        elif isinstance(constraint := constraint_of(hint), Range):
            is_list = any(get_origin(h) is list for h in (plain[name], *get_args(plain[name])))
            out.append(((*path, name), constraint, is_list))
    return out


def test_every_declared_range_is_checked_by_the_one_rule() -> None:
    """A value just outside each declared range is one line naming the key, the value and the range, and
    the bound passes where the range includes it. Found from the annotations, so a range declared later
    (on a launcher's field too) is checked with no new rule."""
    good = from_dict(copy.deepcopy(RAW), SECTIONS)
    keys = ranged_keys(type(good))
    assert {".".join(p) for p, _, _ in keys} >= {"launcher.timeout_s", "cluster.max_nodes", "axes.nodes",
                                                  "study.knee_share", "preflight.tolerance", "trace.steps",
                                                  "launcher.slurm.gpus_per_node", "memory.workers"}
    for path, rng, is_list in keys:
        below = rng.gt if rng.gt is not None else None if rng.ge is None else rng.ge - 1
        above = rng.lt if rng.lt is not None else None if rng.le is None else rng.le + 1
        for bad in (v for v in (below, above) if v is not None):
            cfg = copy.deepcopy(good)
            _set(cfg, path, [bad] if is_list else bad)
            with pytest.raises(ConfigError) as e:
                validate(cfg)
            assert str(e.value) == f"{'.'.join(path)}={bad!r} must be {rng.text()}", path
        for bound in (rng.ge, rng.le):
            if bound is not None:
                assert rng.holds(bound)


def test_a_range_reads_as_it_is_written() -> None:
    assert [r.text() for r in (Range(gt=0), Range(ge=1), Range(gt=0, le=1), Range(gt=0, lt=1))] == [
        "> 0", ">= 1", "in (0, 1]", "in (0, 1)"]
    assert Range(gt=0).holds(1e-9) and not Range(gt=0).holds(0) and not Range(gt=0).holds(float("inf"))
    assert not Range(ge=0).holds(float("nan")) and not Range(ge=0).holds(True) and Range(le=1).holds(1)
    assert Range(gt=0).problem("x", float("inf")) == "x=inf must be a finite number > 0"


def test_help_prints_each_declared_range_beside_its_type() -> None:
    listing, markdown = config_doc.text(SECTIONS), config_doc.markdown(SECTIONS)
    assert "  launcher.timeout_s: float (> 0) = 900\n" in listing
    assert "  study.knee_share: float (in (0, 1]) = 0.5\n" in listing
    assert "  launcher.kubernetes.namespace: str (an RFC 1123 label of lower-case letters, digits and -) = " \
           "default\n" in listing
    assert "  launcher.kubernetes.exclude_nodes: list[str] (each a node name) = []\n" in listing
    assert "  axes.nodes: list[int] (each > 0) = [1]\n" in listing
    assert "- `preflight.tolerance` (`float`, in (0, 1), default `0.25`): " in markdown
    assert "  launcher.name: str (required)\n" in listing  # no range: as before


def test_a_launcher_section_joins_the_schema() -> None:
    """launcher.<name> is the launcher's own dataclass, at its defaults unless set, typed by OmegaConf; a
    key of one launcher is unknown under another's section."""
    cfg = from_dict({**copy.deepcopy(RAW), "launcher": {"name": "local", "slurm": {"partition": "p5"}}},
                    SECTIONS)
    assert isinstance(cfg, SweepConfig) and type(cfg.launcher.slurm) is SlurmSettings
    assert cfg.launcher.slurm.partition == "p5" and cfg.launcher.local == LocalSettings()
    with pytest.raises(ConfigError, match="^unknown key launcher.local.partition; known there: python, "
                                          "warm_workers$"):
        from_dict({**copy.deepcopy(RAW), "launcher": {"name": "local", "local": {"partition": "p5"}}},
                  SECTIONS)
    with pytest.raises(ConfigError, match="^launcher.slurm.gpus_per_node: Value 'x'"):
        from_dict({**copy.deepcopy(RAW), "launcher": {"name": "local", "slurm": {"gpus_per_node": "x"}}},
                  SECTIONS)
    with pytest.raises(ConfigError, match="^unknown key launcher.slurm; known there: name, timeout_s"):
        from_dict({**copy.deepcopy(RAW), "launcher": {"name": "local", "slurm": {}}}, {})


def test_a_saved_config_from_before_the_move_is_read_with_each_key_at_its_new_place() -> None:
    old = {**copy.deepcopy(RAW), "faults": [],
           "cluster": {**RAW["cluster"], "slurm": {"partition": "p5"}, "kubernetes": {"namespace": "team"}},
           "launcher": {"name": "slurm", "python": "/opt/py", "warm_workers": False, "kubeconfig": "/k"}}
    cfg = from_dict(load_config.upgraded(old), SECTIONS)
    assert cfg.launcher.slurm.partition == "p5" and cfg.launcher.kubernetes.namespace == "team"
    assert cfg.launcher.slurm.python == cfg.launcher.local.python == "/opt/py"
    assert cfg.launcher.slurm.warm_workers is cfg.launcher.local.warm_workers is False
    assert cfg.launcher.kubernetes.kubeconfig == "/k" and old["launcher"]["python"] == "/opt/py"  # a copy
    with pytest.raises(ConfigError, match=" has moved: set launcher[.]"):  # the old layout, as given
        from_dict(old, SECTIONS)


def test_omegaconf_reads_a_schema_and_the_sweep_gets_the_dataclasses() -> None:
    raw = {**copy.deepcopy(RAW), "axes": {"micro_batch": ["auto", 2]}}
    cfg = from_dict(raw, SECTIONS)
    assert isinstance(cfg, SweepConfig) and type(cfg.launcher.slurm) is SlurmSettings
    assert cfg.axes.micro_batch == ["auto", 2] and cfg.launcher.slurm.admission == "harness"
    schema = load_config.omegaconf_schema(SweepConfig)
    assert schema is not SweepConfig and schema.__name__ == "SweepConfig"
    assert get_type_hints(load_config.omegaconf_schema(config.Axes))["sharding"] == list[str]
    with pytest.raises(ConfigError, match=r"^axes.nodes\[0\]: Value 'x' of type 'str' could not be"):
        from_dict({**copy.deepcopy(RAW), "axes": {"nodes": ["x"]}}, SECTIONS)
    with pytest.raises(ConfigError, match="^unknown key axes.shard; known there: model, nodes"):
        from_dict({**copy.deepcopy(RAW), "axes": {"shard": ["FULL_SHARD"]}}, SECTIONS)
