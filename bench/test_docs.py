"""The docs name only what exists: every file path in backticks in docs/*.md and README.md is in the
checkout, every `path.py Name` names a definition of that file, every dotted module name
(`bench.run.runner`, `trainer.memory`) is a module of the project (its attribute, where one follows, defined
there), and every section a doc or the code points to (`docs/trace.md, "Waiting"`) is a heading of that
page. A rename that leaves the docs behind fails here.

And each page of docs/ reads in one sitting: docs/architecture.md, the map, at most MAP_LINES lines; on every
page a heading at least every HEADING_EVERY lines, and no paragraph or list item longer than BLOCK_LINES
(tables and code blocks are exempt: they are read by row); the README's documentation list links every
page."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "trainer", "nccl", "analysis", "benchmarks")
TICKED = re.compile(r"`([^`]+)`")  # a code span, which may wrap onto the next line
FENCED = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
TOP = ("bench", "trainer", "nccl", "analysis", "benchmarks", "docs", "sweeps", "scripts", "results", ".ci",
       ".github", "conftest.py", "pyproject.toml", "Dockerfile", "README.md")
PATH = re.compile(r"^(?:" + "|".join(re.escape(t) for t in TOP) + r")(?:/[\w.*<>-]+)*/?$")
MADE_LATER = ("results/", ".github/baseline/")  # written by a study or by its user: in no checkout
PATH_AND_NAME = re.compile(r"^([\w/.-]+\.py) ([A-Za-z_][\w.]*)$")
MODULE = re.compile(r"^(?:python -m )?((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)(?:\s.*)?$")
MAP_LINES = 200  # docs/architecture.md: data flow, layers, where things are, the glossary; the rest is pages
HEADING_EVERY = 40  # lines at most from a page's start to its first heading, between two, and after the last
BLOCK_LINES = 15  # lines at most in one paragraph or one list item
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)]) ")
# a page and one of its sections, as prose names them: docs/trace.md, "Waiting" (or [trace.md](trace.md), ...)
SECTION_REF = re.compile(r'(?<![\w:./-])([\w./-]+\.md)[`)]?,\s+"([^"]{1,120})"')


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/evidence/README.md",
            ROOT / "benchmarks/published/fsdp/README.md", ROOT / "benchmarks/published/nccl-tests/README.md"]


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
    for ref in TICKED.findall(FENCED.sub("", doc.read_text())):
        ref = " ".join(ref.split())
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


def blocks(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """The page's runs of non-blank lines outside fenced code, each with the index of its first line."""
    fenced, start = False, None
    for i, line in enumerate([*lines, ""]):
        if FENCE.match(line):
            fenced = not fenced
        if fenced or FENCE.match(line) or not line.strip():
            if start is not None:
                yield start, lines[start:i]
            start = None
        elif start is None:
            start = i


def shape_problems(doc: Path) -> list[str]:
    """Where a page is not read in one sitting: too long (the map), too long without a heading, or a
    paragraph or list item too long. A table (lines from `|`), an indented code block and a comment are
    read by line, not as prose."""
    lines, name = doc.read_text().splitlines(), doc.name
    found = []
    if name == "architecture.md" and len(lines) > MAP_LINES:
        found.append(f"{name}: {len(lines)} lines, the map holds at most {MAP_LINES}")
    headings: list[int] = []
    for start, run in blocks(lines):
        if run[0].startswith("    ") or run[0].lstrip().startswith(("|", "<!--")):
            continue
        pieces: list[tuple[int, int]] = []  # (first line, lines) of each paragraph or list item
        for i, line in enumerate(run, start):
            if HEADING.match(line):
                headings.append(i)
            elif ITEM.match(line) or not pieces or HEADING.match(lines[i - 1]):
                pieces.append((i, 1))
            else:
                pieces[-1] = (pieces[-1][0], pieces[-1][1] + 1)
        found += [f"{name}:{first + 1}: {'a list item' if ITEM.match(lines[first]) else 'a paragraph'} of "
                  f"{n} lines (at most {BLOCK_LINES})" for first, n in pieces if n > BLOCK_LINES]
    marks = [0, *headings, len(lines)]
    found += [f"{name}:{a + 1}-{b}: {b - a} lines without a heading (at most {HEADING_EVERY})"
              for a, b in zip(marks, marks[1:]) if b - a > HEADING_EVERY]
    return found


def headings(page: Path) -> set[str]:
    """The text of every heading of a Markdown page (outside fenced code)."""
    lines = page.read_text().splitlines()
    return {m.group(2) for _, run in blocks(lines) for line in run if (m := HEADING.match(line))}


def referring_files() -> list[Path]:
    """Every file that may name a page's section: the docs, and the code and configs beside them."""
    code = [p for top in (*PACKAGES, "scripts", "sweeps") for p in sorted((ROOT / top).rglob("*"))
            if p.suffix in (".py", ".yaml", ".sh") and "testdata" not in p.parts]
    return [*doc_files(), ROOT / "benchmarks/evidence/smoke_studies/README.md",
            *(p for p in code if p != Path(__file__).resolve())]  # this file's examples name no real page


def section_problems(path: Path) -> list[str]:
    """Each `page.md, "Heading"` the file writes names a heading of that page (a bare name: of the file's
    own folder, else docs/; a comment's text read across its lines)."""
    found = []
    for page, heading in SECTION_REF.findall(path.read_text()):
        heading = " ".join(re.sub(r"\n\s*#", "\n", heading).split())
        places = (ROOT / page, path.parent / page, ROOT / "docs" / page)
        target = next((c for c in places if c.is_file()), None)
        if target is None:
            found.append(f'{page}, "{heading}": no page {page}')
        elif heading not in headings(target):
            found.append(f'{page}, "{heading}": {page} has no such heading')
    return found


def test_the_checker_catches_a_stale_name(tmp_path: Path) -> None:
    doc = tmp_path / "stale.md"
    doc.write_text("`bench/run/runner.py\n_Clock`, `bench/run/watch.py Clock`, `bench/runner.py`, "
                   "`bench.run.watch.Clock`, `bench.run.nothing`, `python -m bench.sweep`, "
                   "`nccl.collectives`, `bench.probes.parse.nothing`")
    assert problems(doc) == ["bench/run/runner.py _Clock: bench/run/runner.py defines no _Clock",
                             "bench/runner.py: no such file",
                             "bench.run.nothing: no module bench.run.nothing",
                             "bench.probes.parse.nothing: bench/probes/parse.py defines no nothing"]


def test_the_docs_name_only_files_classes_and_modules_that_exist() -> None:
    found = {str(doc.relative_to(ROOT)): p for doc in doc_files() if (p := problems(doc))}
    assert not found, found


def test_the_shape_checker_catches_each_limit(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    long_item = ["- an item"] + ["  that goes on"] * BLOCK_LINES
    table = ["| a | b |", "|---|---|"] + ["| 1 | 2 |"] * 30
    code = ["```", *(["# not a heading"] * 3), *(["x = 1"] * 20), "```"]
    page.write_text("\n".join(["# Title", "", *long_item, "", "a paragraph", "", "## Next", "", *table, "",
                               *code, "", "    indented code", *["    more"] * 20, "", "## Last", "",
                               *["a paragraph line"] * BLOCK_LINES, "", "- short", "- items", "",
                               "## End"]) + "\n")
    assert shape_problems(page) == ["page.md:3: a list item of 16 lines (at most 15)",
                                    "page.md:22-104: 83 lines without a heading (at most 40)"]
    page.write_text("\n".join(["intro"] * 16 + ["", "## A"]) + "\n")
    assert shape_problems(page) == ["page.md:1: a paragraph of 16 lines (at most 15)"]
    the_map = tmp_path / "architecture.md"
    the_map.write_text("\n".join(f"## {n}\n\ntext" for n in range(70)) + "\n")
    assert shape_problems(the_map) == ["architecture.md: 210 lines, the map holds at most 200"]


def test_every_page_reads_in_one_sitting() -> None:
    found = [p for doc in sorted((ROOT / "docs").glob("*.md")) for p in shape_problems(doc)]
    assert not found, "\n".join(found)


def test_the_section_checker_catches_a_heading_that_moved(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text("# Page\n\n## Waiting\n\n## Where it went\n\n```\n# Not a heading\n"
                                      "```\n")
    code = tmp_path / "mod.py"
    code.write_text('"""See page.md, "Waiting", `page.md`, "Waiting" and page.md, "Not a heading".\n'
                    '"""  # docs/nowhere.md, "Gone"; [page](page.md), "Where it\n'
                    '# went"; git show 97c34a9:page.md, "Older" is history\n')
    assert section_problems(code) == ['page.md, "Not a heading": page.md has no such heading',
                                      'docs/nowhere.md, "Gone": no page docs/nowhere.md']


def test_every_section_named_is_a_heading_of_its_page() -> None:
    found = [p for path in referring_files() for p in section_problems(path)]
    assert not found, "\n".join(found)


def test_the_readme_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    listed = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", listed))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert linked == pages, f"unlinked: {sorted(pages - linked)}; no such page: {sorted(linked - pages)}"


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
