"""From command-line overrides to a sweep's resolved config (Hydra over sweeps/), and the launcher its
`launcher.name` picks (bench.launchers.launcher_for): what `python -m bench.sweep` and `python -m
bench.preflight` both start from."""
from __future__ import annotations

import re
from typing import Any

from bench.core.config import ConfigError, SweepConfig
from bench.core.load_config import moved, omegaconf_message, register_schema
from bench.launchers import launcher_for, launcher_sections
from bench.launchers.base import PROJECT_ROOT, Launcher

CONFIG_DIR = PROJECT_ROOT / "sweeps"


def available_sweeps() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "sweep").glob("*.yaml"))


def override_key(override: str) -> str:
    """The key an override sets or removes: `+cluster.gpu=H100-SXM` -> cluster.gpu."""
    return override.split("=", 1)[0].lstrip("~+").split("@", 1)[0]


def compose(overrides: list[str]) -> tuple[dict[str, Any], str]:
    """Resolved config as a plain dict, and its YAML for the results store; a key that has moved is one
    ConfigError naming its new key (in a YAML file too: `omegaconf_message`)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    for override in overrides:
        if message := moved(override_key(override)):
            raise ConfigError(message)
    register_schema(launcher_sections())
    early, late = whole_sections(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=early)
        for key, value in late:
            cfg.merge_with(nested(key, value))
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
        return OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_yaml(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    except AssertionError:  # OmegaConf.update into a section that is null here ("Unexpected type for root")
        raise ConfigError(null_section(overrides)) from None
    except HydraException as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, OmegaConfBaseException):  # "Error merging override X" + why: keep the why,
            where = re.match(r"In '([^']+)'", str(e))  # and the file it is in ("In 'cluster/mine': ...")
            in_file = f"{where.group(1)}.yaml: " if where else ""
            raise ConfigError(in_file + omegaconf_message(cause)) from None
        raise ConfigError(hydra_message(str(e)) or type(e).__name__) from None


def whole_sections(overrides: list[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """The overrides Hydra applies, and those merged after it from the root: each that sets a whole section
    (`cluster.fabric.scale_out={transport:infiniband,adapters:8}`) and each later one inside such a section,
    in their order. Hydra's update cannot merge a mapping into a section the config leaves null (OmegaConf
    2.3 fails inside it); a merge from the root fills the section's schema from the mapping."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:  # Hydra's compose says what is wrong with it
        return overrides, []
    early, late, sections = [], [], []
    for text, override in zip(overrides, parsed):
        key = override.key_or_group
        plain = override.type == OverrideType.CHANGE and override.package is None and "." in key
        whole = plain and not override.is_sweep_override() and isinstance(override.value(), dict)
        if whole or (plain and any(key.startswith(f"{s}.") for s in sections)):
            late.append((key, override.value()))
            sections += [key] if whole else []
        else:
            early.append(text)
    return early, late


def nested(key: str, value: Any) -> dict[str, Any]:
    """`a.b.c`, v -> {"a": {"b": {"c": v}}}: an override as a mapping from the root."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def null_section(overrides: list[str]) -> str:
    """One line for an override of a key inside a section the config leaves null (a cluster without
    `fabric.scale_out`): such a section is a cluster file's to set."""
    deep = [override_key(o) for o in overrides if override_key(o).count(".") >= 2 and "=" in o]
    key = deep[0] if deep else "an override"
    section = key.rsplit(".", 1)[0]
    return (f"{key}: {section} is null in this configuration; set it whole ({section}={{...}}) or describe "
            f"it in a cluster file (sweeps/cluster/ethernet-tcp.yaml sets a fabric's) and pick that with "
            f"cluster=NAME")


def hydra_message(text: str) -> str:
    """Hydra's multi-line error as one line that keeps what a user acts on: the error, the `+key` hint and
    the available options (not the config search path)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    out = lines[0]
    hints = [ln for ln in lines[1:] if ln.startswith("To append")]
    if hints:
        out += f" ({hints[0][0].lower()}{hints[0][1:]})"
    if any(ln.startswith("Available options") for ln in lines):
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Available options"))
        options = [ln for ln in lines[start + 1:] if ":" not in ln and "=" not in ln]
        out += f"; available: {', '.join(options)}"
    return out


def make_launcher(cfg: SweepConfig) -> Launcher:
    """The launcher launcher.name names, for this study's cluster (its placement: `launcher.placement`)."""
    return launcher_for(cfg.launcher.name)(cfg)
