"""The docs name only what exists: every file path in backticks in docs/*.md and README.md is in the
checkout, every `path.py Name` names a definition of that file, and every dotted module name
(`bench.run.runner`, `trainer.memory`) is a module of the project (its attribute, where one follows, defined
there). A rename that leaves the docs behind fails here."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "trainer", "nccl", "analysis", "benchmarks")
TICKED = re.compile(r"`([^`\n]+)`")
TOP = ("bench", "trainer", "nccl", "analysis", "benchmarks", "docs", "sweeps", "scripts", "results", ".ci",
       ".github", "conftest.py", "pyproject.toml", "Dockerfile", "README.md")
PATH = re.compile(r"^(?:" + "|".join(re.escape(t) for t in TOP) + r")(?:/[\w.*<>-]+)*/?$")
MADE_LATER = ("results/", ".github/baseline/")  # written by a study or by its user: in no checkout
PATH_AND_NAME = re.compile(r"^([\w/.-]+\.py) ([A-Za-z_][\w.]*)$")
MODULE = re.compile(r"^(?:python -m )?((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)(?:\s.*)?$")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/evidence/README.md",
            ROOT / "benchmarks/published/fsdp/README.md"]


@cache
def definitions(path: Path) -> set[str]:
    """Top-level and class-level names a Python file defines (functions, classes, assignments)."""
    names: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def exists(ref: str, base: Path) -> bool:
    """A path as docs write it: from the checkout's root (or the doc's folder), `../shared` beside it;
    a `*` or a <placeholder> matches anything."""
    pattern = re.sub(r"<[^>]+>", "*", ref.rstrip("/"))
    for root in (ROOT, base):
        if any(True for _ in root.glob(pattern)) if "*" in pattern else (root / pattern).exists():
            return True
    return ref.startswith(("../shared", "shared/")) or ref.startswith("/")


def module_file(dotted: str) -> tuple[Path, str | None] | None:
    """The file of the longest module prefix of a dotted name, and the attribute after it (if any)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                return candidate, parts[n] if n < len(parts) else None
    return None


def is_config_key(dotted: str) -> bool:
    """`nccl.collectives` is the sweep config's key, not a module: the config has a section named as the
    nccl package is, and a key of it is no module of that package."""
    section, _, rest = dotted.partition(".")
    return section == "nccl" and module_file(dotted) == (ROOT / "nccl" / "__init__.py", rest.split(".")[0])


def problems(doc: Path) -> list[str]:
    found: list[str] = []
    for ref in TICKED.findall(doc.read_text()):
        ref = ref.strip()
        if m := PATH_AND_NAME.match(ref):
            path, name = ROOT / m.group(1), m.group(2).split(".")[0]
            if not path.exists():
                found.append(f"{ref}: no file {m.group(1)}")
            elif name not in definitions(path):
                found.append(f"{ref}: {m.group(1)} defines no {name}")
        elif (m := MODULE.match(ref)) and not is_config_key(m.group(1)):
            located = module_file(m.group(1))
            if located is None:
                found.append(f"{ref}: no module {m.group(1)}")
            elif located[1] and located[1] not in definitions(located[0]):
                package = located[0].name == "__init__.py"
                found.append(f"{ref}: no module {m.group(1)}" if package
                             else f"{ref}: {located[0].relative_to(ROOT)} defines no {located[1]}")
        elif PATH.match(ref) and not ref.startswith(MADE_LATER) and not exists(ref, doc.parent):
            found.append(f"{ref}: no such file")
    return found


def test_the_checker_catches_a_stale_name(tmp_path: Path) -> None:
    doc = tmp_path / "stale.md"
    doc.write_text("`bench/run/runner.py _Clock`, `bench/run/watch.py Clock`, `bench/runner.py`, "
                   "`bench.run.watch.Clock`, `bench.run.nothing`, `python -m bench.sweep`, "
                   "`nccl.collectives`, `bench.probes.parse.nothing`")
    assert problems(doc) == ["bench/run/runner.py _Clock: bench/run/runner.py defines no _Clock",
                             "bench/runner.py: no such file",
                             "bench.run.nothing: no module bench.run.nothing",
                             "bench.probes.parse.nothing: bench/probes/parse.py defines no nothing"]


def test_the_docs_name_only_files_classes_and_modules_that_exist() -> None:
    found = {str(doc.relative_to(ROOT)): p for doc in doc_files() if (p := problems(doc))}
    assert not found, found


def test_the_configuration_reference_is_the_configs_own() -> None:
    """docs/study.md's reference is what bench/core/config.py and the built-in launchers' own sections say:
    every key, in both or in neither, with its type, range, default and docstring (python
    scripts/config_docs.py writes it)."""
    from bench.core.config_doc import in_page, sections
    from bench.launchers import BUILT_IN, launcher_sections
    built_in = launcher_sections(list(BUILT_IN))
    page = (ROOT / "docs" / "study.md").read_text()
    assert in_page(page, built_in) == page, \
        "docs/study.md differs from the config: run python scripts/config_docs.py"
    documented = set(re.findall(r"^- `([\w.\[\]]+)` \(", page, re.M))
    assert documented == {k.key for s in sections(built_in) for k in s.keys}
    assert "- `trace.steps` (`int`, >= 1, default `2`): Profiled steps per run" in page
    stale = page.replace("- `trace.steps` (`int`, >= 1, default `2`)", "- `trace.steps` (`int`, default `3`)")
    assert in_page(stale, built_in) == page  # the check sees a stale default, and the script repairs it


def test_help_lists_every_key_with_its_choices_and_default(capsys) -> None:
    from bench.core.config_doc import markdown, sections
    from bench.launchers import BUILT_IN, launcher_sections
    from bench.sweep import main
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("`python -m bench.sweep +sweep=NAME") and "sweeps: ablation, " in out
    for section in sections(launcher_sections()):
        assert all(f"  {k.key}: {k.type}" in out for k in section.keys), section.name
    sharding = "list[FULL_SHARD | SHARD_GRAD_OP | HYBRID_SHARD | NO_SHARD] = [FULL_SHARD]"
    assert f"  axes.sharding: {sharding}\n" in out
    assert "  launcher.slurm.admission: harness | slurm = harness\n      Who packs" in out
    assert "  launcher.name: str (required)\n" in out
    assert main(["--help-config", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown(launcher_sections(list(BUILT_IN)))
