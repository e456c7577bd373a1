"""The import arrows point one way (docs/architecture.md, "Layers"):

    bench.core  <-  trainer, nccl, bench, analysis      shared definitions import none of them
    bench       <-  nccl, analysis                      the probe's command facts (bench.probes.command);
                                                        the results store (rundir)

Within bench, its parts stand on one another in one order (BENCH_PARTS, lowest first): a part imports only
the parts below it, and the commands (sweep, preflight, ingest, gpucheck) stand on all of them.

Orchestration reaches the workers (trainer, nccl.probe) only through their command lines. Every import is
read from the source, function-level ones included, so a cycle hidden in a function fails here too.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "trainer", "nccl", "analysis")
ALLOWED = {"bench.core": set(), "trainer": {"bench.core"}, "nccl": {"bench.core", "bench"},
           "bench": {"bench.core"}, "analysis": {"bench.core", "bench"}}
WORKERS = ("trainer", "nccl.probe")  # started by command line, imported by nobody else
BENCH_PARTS = ("bench.core", "bench.probes", "bench.launchers", "bench.predict", "bench.study", "bench.run")


def layer(module: str) -> str | None:
    """The layer a module belongs to, or None for third-party and standard-library modules."""
    if module == "bench.core" or module.startswith("bench.core."):
        return "bench.core"
    top = module.split(".")[0]
    return top if top in PACKAGES else None


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (`from bench import rundir` is bench.core.rundir)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def source_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
            if not p.name.startswith("test_") and p.name != "conftest.py"]


def edges() -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) -> the imports that make the edge, as 'module -> module'."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in source_files():
        src = module_name(path)
        for target in imports(path):
            a, b = layer(src), layer(target)
            if a and b and a != b:
                out.setdefault((a, b), []).append(f"{src} -> {target}")
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one() -> None:
    assert find_cycle({"bench": {"nccl"}, "nccl": {"bench.core"}, "bench.core": set()}) is None
    assert find_cycle({"bench": {"nccl"}, "nccl": {"trainer"}, "trainer": {"bench"}}) == \
        ["bench", "nccl", "trainer", "bench"]


def test_the_layers_import_one_way_only() -> None:
    found = edges()
    assert found, "no imports between layers were read: the walker is broken"
    wrong = {f"{a} -> {b}": sources for (a, b), sources in found.items() if b not in ALLOWED[a]}
    assert not wrong, f"imports against the layering: {wrong}"
    graph: dict[str, set[str]] = {}
    for a, b in found:
        graph.setdefault(a, set()).add(b)
    assert find_cycle(graph) is None


def test_workers_are_reached_only_through_their_command_lines() -> None:
    for path in source_files():
        src = module_name(path)
        for target in imports(path):
            for worker in WORKERS:
                inside = src == worker or src.startswith(worker + ".")
                if not inside and (target == worker or target.startswith(worker + ".")):
                    raise AssertionError(f"{src} imports the worker {target}: start it by its command line")


def bench_part(module: str) -> str | None:
    """The part of bench a module belongs to (BENCH_PARTS), or None for the commands and everything else."""
    return next((p for p in BENCH_PARTS if module == p or module.startswith(p + ".")), None)


def test_bench_parts_import_only_the_parts_below_them() -> None:
    wrong: list[str] = []
    read = 0
    for path in source_files():
        src = module_name(path)
        if (a := bench_part(src)) is None:
            continue
        for target in imports(path):
            if target.split(".")[0] != "bench":
                continue
            read += 1
            b = bench_part(target)
            if b is None or BENCH_PARTS.index(b) > BENCH_PARTS.index(a):
                wrong.append(f"{src} -> {target}")
    assert read, "no imports within bench were read: the walker is broken"
    assert not wrong, f"bench's parts import upwards or a command: {wrong}"
