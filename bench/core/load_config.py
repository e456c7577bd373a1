"""From a composed configuration (Hydra's, as a plain dict) to a typed, validated SweepConfig: OmegaConf
merges it into the schema (`omegaconf_schema`: the dataclasses of bench/core/config.py as OmegaConf 2.3
reads them, each Literal its values' type), so OmegaConf itself refuses a wrong type or an unknown key;
then the dataclasses again, and bench/core/validation.py's rules. Every problem is one ConfigError line.
"""
from __future__ import annotations

import functools
from dataclasses import MISSING as NO_FACTORY, field, fields, is_dataclass, make_dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from bench.core.config import ConfigError, SweepConfig, is_union
from bench.core.validation import validate


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


def register_schema() -> None:
    """Make SweepConfig the schema of sweeps/config.yaml (its defaults list names `sweep_schema`)."""
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="sweep_schema", node=omegaconf_schema(SweepConfig))


def omegaconf_message(e: OmegaConfBaseException) -> str:
    """OmegaConf's error as one line naming the key, and for a typo the keys that exist there."""
    key = getattr(e, "full_key", None)
    owner = getattr(e, "object_type", None)
    if isinstance(e, (ConfigKeyError, ConfigAttributeError)) and key and is_dataclass(owner):
        return f"unknown key {key}; known there: {', '.join(f.name for f in fields(owner))}"
    msg = (getattr(e, "msg", None) or str(e)).strip().splitlines()[0]
    if "is not a ListConfig, list or tuple" in msg:
        msg = "must be a list, e.g. [4]"
    return f"{key}: {msg}" if key else msg


def from_dict(raw: dict[str, Any]) -> SweepConfig:
    """A composed config (OmegaConf.to_container) as a validated SweepConfig."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(omegaconf_schema(SweepConfig)), raw)
        cfg = _typed(OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    assert isinstance(cfg, SweepConfig)
    validate(cfg)
    return cfg
