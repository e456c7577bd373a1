"""The launcher Protocol declares every method the harness calls on a launcher, and every launcher is one:
the sweep, the runner and the preflight call launchers through it, never by probing with getattr."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from bench.launchers.base import Launcher
from bench.launchers.kubernetes import KubernetesLauncher
from bench.launchers.local import LocalLauncher
from bench.launchers.slurm import SlurmLauncher

BENCH = Path(__file__).resolve().parents[1]
LAUNCHERS = (LocalLauncher, SlurmLauncher, KubernetesLauncher)


def callers() -> list[Path]:
    """The harness's code that holds launchers: above bench/launchers (core's `launcher` is the config's)."""
    return [p for p in sorted(BENCH.rglob("*.py"))  # parts below bench/: a checkout's own path may hold them
            if not {"launchers", "core"} & set(p.relative_to(BENCH).parts) and not p.name.startswith("test_")]


def launcher_uses(path: Path) -> tuple[set[str], list[str]]:
    """Attributes read on a name `launcher` (or `self.launcher`), and any getattr(launcher, ...) probe."""
    used: set[str] = set()
    probes: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            base = node.value
            plain = isinstance(base, ast.Name) and base.id == "launcher"
            on_self = (isinstance(base, ast.Attribute) and base.attr == "launcher"
                       and isinstance(base.value, ast.Name) and base.value.id == "self")
            if plain or on_self:
                used.add(node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "launcher"):
            probes.append(f"{path.name}:{node.lineno}")
    return used, probes


def protocol_members() -> set[str]:
    return {n for n in dir(Launcher) if not n.startswith("_")} | set(Launcher.__annotations__)


def test_the_harness_calls_launchers_only_through_the_protocol() -> None:
    used: set[str] = set()
    probes: list[str] = []
    for path in callers():
        u, p = launcher_uses(path)
        used |= u
        probes += p
    assert {"render", "submit", "poll", "preflight", "admit", "executions", "node_names"} <= used, \
        f"the walker missed the harness's calls: {sorted(used)}"
    assert not probes, f"launchers probed with getattr/hasattr: {probes}"
    undeclared = used - protocol_members()
    assert not undeclared, f"called on launchers, not declared by bench.launchers.base.Launcher: {undeclared}"


@pytest.mark.parametrize("cls", LAUNCHERS, ids=lambda c: c.__name__)
def test_every_launcher_is_a_launcher_with_every_member(cls: type) -> None:
    assert Launcher in cls.__mro__
    for name in protocol_members() - {"name"}:
        assert callable(getattr(cls, name)), f"{cls.__name__}.{name}"


def test_the_defaults_are_those_of_a_launcher_with_nothing_to_do() -> None:
    class Bare(Launcher):
        name = "bare"
    bare = Bare()
    assert bare.admit(None) is None and bare.preflight() is None  # type: ignore[arg-type]
    assert bare.plan_note([]) is None and bare.executions(object()) == [] and bare.close() is None
    nodes, down = bare.node_names()
    assert len(nodes) == 1 and nodes[0] and down == {}
    # the launchers that have something to say override the default
    assert SlurmLauncher.executions is not Launcher.executions
    assert KubernetesLauncher.admit is not Launcher.admit
    assert LocalLauncher.plan_note is not Launcher.plan_note and LocalLauncher.close is not Launcher.close
    assert inspect.getsource(Launcher.node_names).count("gethostname") == 1
