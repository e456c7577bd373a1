"""The report's two pages from its parts (the sections as built, analysis/report.py): report.md, what a
reader needs first, each detail section one line naming its files; and report.html, one self-contained
file with the charts inline and every section, the details collapsed. A part's body is a table
(DataFrame), a chart, a list of sentences, or the glossary of the parts' definitions."""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Chart:
    """A chart written beside the pages as <file>.png and <file>.svg."""

    file: str


@dataclass(frozen=True)
class Glossary:
    """Where the page defines what its sections hold: each shown section's definition."""


@dataclass(frozen=True)
class Part:
    """A section as the pages show it: `full` is its CSV's table where the page shows less of it (the HTML
    keeps it, collapsed), `files` what it wrote beside the pages."""

    id: str
    title: str
    body: pd.DataFrame | Chart | list[str] | Glossary
    note: str | None = None
    full: pd.DataFrame | None = None
    files: tuple[str, ...] = ()
    definition: str = ""
    detail: bool = False
    term: str = ""  # what the Definitions call it: its section's title (a table per sweep: once)


def number(value: float) -> str:
    """A figure as the pages print it: four significant figures, thousands grouped from 10,000 on (days
    to train, tokens/s: never "1.151e+04")."""
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return number(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_none_\n"
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def _links(files: tuple[str, ...]) -> str:
    return ", ".join(f"[{f}]({f})" for f in files)


def _note(part: Part) -> str | None:
    """The line under a part: its own note, else where the rest of its table is."""
    if part.note:
        return part.note
    return f"Every column: {_links(part.files[:1])}" if part.full is not None else None


def _glossary(parts: list[Part]) -> list[str]:
    terms = dict.fromkeys((p.term or p.title, p.definition) for p in parts if p.definition)
    return [f"**{term}**: {definition}" for term, definition in terms]


def _md_body(part: Part, parts: list[Part]) -> str:
    body = part.body
    if isinstance(body, pd.DataFrame):
        return "" if body.empty and part.note else markdown_table(body)
    if isinstance(body, Chart):
        return f"![{part.title}]({body.file}.png)\n"
    lines = _glossary([p for p in parts if not p.detail]) if isinstance(body, Glossary) else body
    return "\n".join(f"- {line}" for line in lines) + "\n"


def _more(parts: list[Part]) -> list[str]:
    """The Markdown's one line per detail section: where its figures are."""
    lines = [f"- {p.title}: {_links(p.files) if p.files else 'report.html'}" for p in parts if p.detail]
    heading = "## More in report.html (collapsed) and in these files\n"
    return [heading, "\n".join(lines) + "\n"] if lines else []


def markdown(parts: list[Part]) -> str:
    out = ["# FSDP scaling report\n"]
    for part in parts:
        if part.detail:
            continue
        if isinstance(part.body, Glossary):
            out += _more(parts)
        note = _note(part)
        out += [f"## {part.title}\n", _md_body(part, parts), f"{note}\n" if note else ""]
    return "\n".join(text for text in out if text)


def _inline_svg(path: Path, title: str) -> str:
    """The chart itself in the page (one self-contained file, nothing to fetch), labelled for readers."""
    svg = path.read_text()
    svg = svg[svg.index("<svg"):]
    return f"<figure role='img' aria-label='{html.escape(title)}'>{svg}</figure>"


def _table_html(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, na_rep="", float_format=number) if not frame.empty \
        else "<p><i>none</i></p>"


def _html_body(part: Part, parts: list[Part], out: Path) -> str:
    from markdown_it import MarkdownIt
    body = part.body
    if isinstance(body, pd.DataFrame):
        return "" if body.empty and part.note else _table_html(body)
    if isinstance(body, Chart):
        return _inline_svg(out / f"{body.file}.svg", part.title)
    if isinstance(body, Glossary):
        return MarkdownIt().render("\n".join(f"- {line}" for line in _glossary(parts)))
    css = " class='answer'" if part.id == "answer" else ""
    return f"<ul{css}>" + "".join(f"<li>{html.escape(str(b))}</li>" for b in body) + "</ul>"


def _html_part(part: Part, parts: list[Part], out: Path) -> str:
    """A section, its note, and the rest of its table collapsed; a detail section collapsed whole."""
    from markdown_it import MarkdownIt
    inner = _html_body(part, parts, out)
    if note := _note(part):
        inner += f"<p class='note'>{MarkdownIt().renderInline(note)}</p>"
    if part.full is not None:
        inner += f"<details><summary>Every column ({html.escape(part.files[0])})</summary>" \
                 f"{_table_html(part.full)}</details>"
    title = f"<h2>{html.escape(part.title)}</h2>"
    if part.detail:
        return f"<details id='{part.id}' class='detail'><summary>{title}</summary>{inner}</details>"
    return f"<section id='{part.id}'>{title}{inner}</section>"


def page_html(parts: list[Part], out: Path) -> str:
    head = ["<!doctype html><html><head><meta charset='utf-8'><title>FSDP scaling report</title>",
            "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
            "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
            "th{background:#eee}figure{margin:0}figure svg{max-width:100%;height:auto}"
            ".answer li{font-size:1.15em;margin:.3em 0}summary h2{display:inline}.note{font-size:13px}"
            "details table{display:block;overflow-x:auto}"
            "</style></head><body><h1>FSDP scaling report</h1>"]
    return "\n".join(head + [_html_part(p, parts, out) for p in parts]) + "</body></html>\n"
