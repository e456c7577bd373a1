"""The launchers, found by `launcher.name`: the built-in ones, any registered in this process with
`register` (a module of your own, imported before the sweep starts), and any installed package's under
the entry-point group ENTRY_POINTS (docs/launchers.md, "Writing a launcher"). Looked up once, when the
sweep starts; a name none of them knows is one ConfigError, before anything is written.

Each launcher owns its settings: the dataclass its class declares as `settings` is the configuration's
section launcher.<its name> (`launcher_sections`), typed, checked and documented as every other section is."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from bench.core.config import ConfigError

# the built-in launchers' classes (bench.core.config.LAUNCHERS names them), imported only when chosen (the
# Kubernetes client is slow to import)
BUILT_IN = {"local": ("bench.launchers.local", "LocalLauncher"),
            "dryrun": ("bench.launchers.local", "DryRunLauncher"),
            "slurm": ("bench.launchers.slurm", "SlurmLauncher"),
            "kubernetes": ("bench.launchers.kubernetes", "KubernetesLauncher")}
ENTRY_POINTS = "fsdpbench.launchers"
_REGISTERED: dict[str, Any] = {}


def register(cls: Any) -> Any:
    """Make a launcher class (its `name`) choosable as launcher.name in this process; a class decorator."""
    _REGISTERED[cls.name] = cls
    return cls


def _installed() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS)}


def names() -> list[str]:
    """Every launcher.name this process can launch with."""
    return sorted({*BUILT_IN, *_REGISTERED, *_installed()})


def placement_of(cfg: Any) -> Any:
    """The study's Placement, as the launcher launcher.name names answers for its cluster."""
    return launcher_for(cfg.launcher.name).placement(cfg)


def launcher_sections(only: list[str] | None = None) -> dict[str, type]:
    """launcher.<name> -> the dataclass of that launcher's own keys, for each launcher (of `only`, else of
    every one this process can launch with) whose class declares `settings` itself: a subclass that
    declares none (dryrun, the local launcher's) reads its parent's section."""
    out = {}
    for name in [*BUILT_IN, *(n for n in names() if n not in BUILT_IN)] if only is None else only:
        if (settings := vars(launcher_for(name)).get("settings")) is not None:
            out[name] = settings
    return out


def launcher_for(name: str) -> Any:
    """The launcher class launcher.name names (the sweep asks it for the study's Placement, then builds
    it)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in BUILT_IN:
        module, attr = BUILT_IN[name]
        return getattr(importlib.import_module(module), attr)
    if name in (installed := _installed()):
        return installed[name].load()
    raise ConfigError(f"launcher.name: {name!r}; known: {', '.join(names())}")
