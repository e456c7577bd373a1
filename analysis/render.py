"""The report's two pages from its sections (title, body): Markdown, and one self-contained HTML file
with the charts inline. A body is a table (DataFrame), a chart ("chart", name), a list of sentences or
Markdown text."""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd


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


def markdown(sections: list[tuple[str, object]]) -> str:
    parts = ["# FSDP scaling report\n"]
    for title, body in sections:
        parts.append(f"## {title}\n")
        if isinstance(body, pd.DataFrame):
            parts.append(markdown_table(body))
        elif isinstance(body, tuple):
            parts.append(f"![{title}]({body[1]}.png)\n")
        elif isinstance(body, list):
            parts.append("\n".join(f"- {line}" for line in body) + "\n")
        else:
            parts.append(str(body))
    return "\n".join(parts)


def _inline_svg(path: Path, title: str) -> str:
    """The chart itself in the page (one self-contained file, nothing to fetch), labelled for readers."""
    svg = path.read_text()
    svg = svg[svg.index("<svg"):]
    return f"<figure role='img' aria-label='{html.escape(title)}'>{svg}</figure>"


def page_html(sections: list[tuple[str, object]], out: Path) -> str:
    from markdown_it import MarkdownIt
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>FSDP scaling report</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
             "th{background:#eee}figure{margin:0}figure svg{max-width:100%;height:auto}"
             ".answer li{font-size:1.15em;margin:.3em 0}</style></head><body><h1>FSDP scaling report</h1>"]
    for title, body in sections:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if isinstance(body, pd.DataFrame):
            parts.append(body.to_html(index=False, na_rep="", float_format=number)
                         if not body.empty else "<p><i>none</i></p>")
        elif isinstance(body, tuple):
            parts.append(_inline_svg(out / f"{body[1]}.svg", title))
        elif isinstance(body, list):
            css = " class='answer'" if title == "The answer" else ""
            parts.append(f"<ul{css}>" + "".join(f"<li>{html.escape(str(b))}</li>" for b in body) + "</ul>")
        else:
            parts.append(MarkdownIt().render(str(body)))
    return "\n".join(parts) + "</body></html>\n"
