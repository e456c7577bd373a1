"""From a composed configuration (Hydra's, as a plain dict) to a typed, validated SweepConfig: OmegaConf
merges it into the schema (`omegaconf_schema`: the dataclasses of bench/core/config.py, with the launchers'
own sections (`with_sections`), as OmegaConf 2.3 reads them, each Literal its values' type), so OmegaConf
itself refuses a wrong type or an unknown key; then the dataclasses again, and bench/core/validation.py's
rules. Every problem is one ConfigError line; a key that has moved (`MOVED`) is one naming its new place.
"""
from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import MISSING as NO_FACTORY, field, fields, is_dataclass, make_dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from bench.core.config import ConfigError, LauncherConfig, SweepConfig, is_union
from bench.core.schema import FAULTS_ENV
from bench.core.validation import validate

Sections = Mapping[str, type]  # launcher.<name> -> the dataclass of that launcher's own keys

# Keys that have moved: the old key (or section) -> where its value goes now. Given on a command line or in
# a YAML file, one is a ConfigError naming the new key (`moved`); in a sweep dir's saved sweep.yaml, written
# before the move, it is carried over (`upgraded`). An old key with no new place is gone.
MOVED: dict[str, tuple[str, ...]] = {
    "cluster.slurm": ("launcher.slurm",),
    "cluster.kubernetes": ("launcher.kubernetes",),
    "launcher.warm_workers": ("launcher.local.warm_workers", "launcher.slurm.warm_workers"),
    "launcher.python": ("launcher.local.python", "launcher.slurm.python"),
    "launcher.workdir": ("launcher.slurm.workdir",),
    "launcher.kubeconfig": ("launcher.kubernetes.kubeconfig",),
    "launcher.context": ("launcher.kubernetes.context",),
    "faults": (),  # the test hook's: the environment's FSDPBENCH_FAULTS (bench.core.faults)
}


def moved(key: str) -> str | None:
    """The one line for a key that has moved, naming its new key; None for any other key."""
    for old, new in MOVED.items():
        if key == old or key.startswith(old + "."):
            rest = key[len(old):]
            if not new:
                return f"{key} is no setting any more: faults are a test hook, given in ${FAULTS_ENV}"
            return f"{key} has moved: set {' or '.join(n + rest for n in new)} (each launcher owns its keys)"
    return None


def upgraded(raw: dict[str, Any]) -> dict[str, Any]:
    """A sweep.yaml saved before keys moved, with each at its new place (a value already there wins) and
    the gone ones dropped: an old sweep dir stays readable (its predictor, its cluster)."""
    out = copy.deepcopy(raw)
    for old, new in MOVED.items():
        *path, last = old.split(".")
        parent = _node(out, path)
        if not isinstance(parent, dict) or last not in parent:
            continue
        value = parent.pop(last)
        for target in new:
            *where, name = target.split(".")
            node = _node(out, where, create=True)
            merged = {**value, **node.get(name, {})} if isinstance(value, dict) else node.get(name, value)
            node[name] = merged
    return out


def _node(tree: dict[str, Any], path: list[str], create: bool = False) -> Any:
    for part in path:
        if create and not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _lowered(hint: Any) -> Any:
    """A type as OmegaConf 2.3 reads it: a Literal is its values' type, a union of more than one type
    besides None is Any (micro_batch: int or auto), a dataclass its omegaconf_schema."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return type(args[0])
    if is_union(hint):
        kept = [a for a in args if a is not type(None)]
        inner = _lowered(kept[0]) if len(kept) == 1 else Any
        return inner | None if len(kept) < len(args) else inner
    if origin is list:
        return list[_lowered(args[0])]
    if origin is dict:
        return dict[args[0], _lowered(args[1])]
    return omegaconf_schema(hint) if is_dataclass(hint) else hint


_TYPED: dict[type, type] = {}  # each omegaconf_schema class -> the dataclass it stands for


def with_sections(sections: Sections) -> type:
    """SweepConfig with each launcher's own section under `launcher`: launcher.<name>, its dataclass, at its
    defaults unless set. The classes are made once per set of sections and named as the ones they extend."""
    return _with_sections(tuple(sections.items()))


@functools.cache
def _with_sections(sections: tuple[tuple[str, type], ...]) -> type:
    own = [(name, cls, field(default_factory=cls)) for name, cls in sections]
    launcher = make_dataclass("LauncherConfig", own, bases=(LauncherConfig,), namespace=_as(LauncherConfig))
    return make_dataclass("SweepConfig", [("launcher", launcher, field(default=MISSING))],
                          bases=(SweepConfig,), namespace=_as(SweepConfig))


def _as(cls: type) -> dict[str, Any]:
    """A made class's namespace: the docstring and module of the class it extends."""
    return {"__doc__": cls.__doc__, "__module__": cls.__module__}


@functools.cache
def omegaconf_schema(cls: type) -> type:
    """`cls` as OmegaConf reads it: a dataclass of the same name, fields and defaults, typed by `_lowered`."""
    hints = get_type_hints(cls)
    specs = []
    for f in fields(cls):
        factory = f.default_factory
        if isinstance(factory, type) and is_dataclass(factory):
            factory = omegaconf_schema(factory)
        spec = field(default=f.default) if factory is NO_FACTORY else field(default_factory=factory)
        specs.append((f.name, _lowered(hints[f.name]), spec))
    schema = make_dataclass(cls.__name__, specs)
    _TYPED[schema] = cls
    return schema


def _typed(value: Any) -> Any:
    """What OmegaConf.to_object made of an omegaconf_schema, as the dataclasses above (in lists and dicts
    too)."""
    if is_dataclass(value) and not isinstance(value, type):
        return _TYPED[type(value)](**{f.name: _typed(getattr(value, f.name)) for f in fields(value)})
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    return value


def register_schema(sections: Sections) -> None:
    """Make SweepConfig, with the launchers' sections, the schema of sweeps/config.yaml (its defaults list
    names `sweep_schema`)."""
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="sweep_schema", node=omegaconf_schema(with_sections(sections)))


def omegaconf_message(e: OmegaConfBaseException) -> str:
    """OmegaConf's error as one line naming the key, and for a typo the keys that exist there."""
    key = getattr(e, "full_key", None)
    owner = getattr(e, "object_type", None)
    if isinstance(e, (ConfigKeyError, ConfigAttributeError)) and key and is_dataclass(owner):
        return moved(key) or f"unknown key {key}; known there: {', '.join(f.name for f in fields(owner))}"
    msg = (getattr(e, "msg", None) or str(e)).strip().splitlines()[0]
    if "is not a ListConfig, list or tuple" in msg:
        msg = "must be a list, e.g. [4]"
    return f"{key}: {msg}" if key else msg


def typed(cls: type, raw: Any) -> Any:
    """`raw` (a plain dict) merged into the dataclass `cls` as OmegaConf reads it, and `cls` again: OmegaConf
    refuses a wrong type or an unknown key, as one ConfigError line."""
    try:
        return _typed(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(omegaconf_schema(cls)), raw)))
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None


def from_dict(raw: dict[str, Any], sections: Sections) -> SweepConfig:
    """A composed config (OmegaConf.to_container) as a validated SweepConfig, with the launchers' own
    `sections` (`bench.launchers.launcher_sections()`) under its launcher."""
    cfg = typed(with_sections(sections), raw)
    assert isinstance(cfg, SweepConfig)
    validate(cfg)
    return cfg
