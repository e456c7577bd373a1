"""`python -m analysis.report PATH [--out DIR]`: tables and charts from a results root or one sweep dir.

Writes report.md, report.html (tables and charts together), one CSV per table and PNG+SVG charts to
DIR (default PATH/report). Missing or broken input gives one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from analysis.columns import Columns
from analysis.cost import parse_price_overrides
from analysis.inputs import ReportInputs, report_inputs
from analysis.load import Loaded, NoResults, load
from analysis.render import Chart, Part, markdown, page_html
from analysis.sections import SECTIONS, Section
from bench.predict.budget import DEFAULT_KNEE_SHARE, DEFAULT_TRAIN_TOKENS, check_knee_share

TRAIN_TOKENS = DEFAULT_TRAIN_TOKENS


def build(loaded: Loaded, out: Path, prices: dict[str, float] | None = None,
          train_tokens: float | None = None, knee_share: float | None = None) -> Path:
    """Write every section's files and the two report pages; returns the Markdown path.

    prices override the sweeps' own price_per_hour by cluster name; train_tokens the study's
    study.train_tokens (default TRAIN_TOKENS); knee_share its study.knee_share.
    """
    pages(loaded, out, prices, train_tokens, knee_share)
    return out / "report.md"


def pages(loaded: Loaded, out: Path, prices: dict[str, float] | None = None,
          train_tokens: float | None = None, knee_share: float | None = None) -> dict[str, Part]:
    """build(), returning what the pages show by section id (a table per sweep: <id>_<sweep>): what a
    test reads a section's figures from."""
    out.mkdir(parents=True, exist_ok=True)
    parts = report_parts(report_inputs(loaded, prices, train_tokens, knee_share), out)
    (out / "report.md").write_text(markdown(parts))
    (out / "report.html").write_text(page_html(parts, out))
    return {part.id: part for part in parts}


def report_parts(inputs: ReportInputs, out: Path) -> list[Part]:
    """Every section built, its files written to `out`, as the pages show it (analysis/sections.py)."""
    return [part for section in SECTIONS for part in _parts(section, inputs, out)]


def _parts(section: Section, inputs: ReportInputs, out: Path) -> list[Part]:
    """A section's parts: none where it has nothing to show, one for each sweep's table where it has one
    per sweep."""
    body = section.build(inputs)
    if isinstance(body, dict):
        return [p for sweep, table in body.items() for p in _table(section, table, inputs, out, sweep)]
    if isinstance(body, pd.DataFrame):
        return _table(section, body, inputs, out)
    if isinstance(body, Figure):
        _save(body, out / section.stem)
        return [_part(section, Chart(section.stem), files=(f"{section.stem}.png",))]
    return [_part(section, body)] if body is not None and body != [] else []


def _part(section: Section, body: object, **kw: object) -> Part:
    return Part(section.id, section.title, body, definition=section.definition,  # type: ignore[arg-type]
                detail=section.detail, term=section.title, **kw)  # type: ignore[arg-type]


def _table(section: Section, built: pd.DataFrame, inputs: ReportInputs, out: Path,
           sweep: str | None = None) -> list[Part]:
    """Its CSV (even an empty one) and, where the page words or narrows it, the page's table as
    <file>_short.csv; on the page where it has rows or a note."""
    stem = f"{section.stem}_{sweep}" if sweep else section.stem
    columns = section.columns or Columns(None)
    csv = columns.csv(built, inputs.budget)
    csv.to_csv(out / f"{stem}.csv", index=False)
    page, full = csv, None
    if section.page or columns.short:
        page = columns.page(section.page(built, inputs) if section.page else built, inputs.budget)
        page.to_csv(out / f"{stem}_short.csv", index=False)
        full = None if csv.columns.equals(page.columns) and len(csv) == len(page) else csv
    note = section.note(inputs) if section.note else None
    if page.empty and not note:
        return []
    part = _part(section, page, note=note, full=full, files=(f"{stem}.csv",))
    return [replace(part, id=stem, title=f"{section.title}: {sweep}")] if sweep else [part]


def _save(fig: Figure, stem: Path) -> None:
    """PNG and SVG; the SVG keeps the PNG's layout and its text as text (searchable, selectable)."""
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    fig.set_layout_engine("none")
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(stem.with_suffix(".svg"), dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__)
    parser.add_argument("path", type=Path, help="results root (results/) or one sweep dir")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default PATH/report)")
    parser.add_argument("--price", action="append", default=[], metavar="[CLUSTER=]USD",
                        help="price per instance-hour, overriding the sweeps' (repeatable)")
    parser.add_argument("--train-tokens", type=float, default=None,
                        help="token budget for the time/cost-to-train columns (default: the study's "
                             f"study.train_tokens, else {TRAIN_TOKENS:.0e})")
    parser.add_argument("--knee-share", type=float, default=None,
                        help="the knee: where the next node count buys less than this share of a linear "
                             "gain, in (0, 1] (default: the study's study.knee_share, else "
                             f"{DEFAULT_KNEE_SHARE:g})")
    args = parser.parse_args(argv)
    try:
        if args.train_tokens is not None and not 0 < args.train_tokens < float("inf"):
            raise ValueError(f"--train-tokens must be a positive number of tokens, got {args.train_tokens:g}")
        if args.knee_share is not None:
            check_knee_share(args.knee_share)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        loaded = load(args.path)
        planned = loaded.plan["cluster"] if "cluster" in loaded.plan else pd.Series(dtype=str)
        clusters = sorted(set(map(str, pd.concat([loaded.frame["cluster"], planned]).dropna().unique())))
        prices = parse_price_overrides(args.price, clusters)
    except NoResults as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: bad --price: {e}", file=sys.stderr)
        return 2
    md = build(loaded, args.out or args.path / "report", prices, args.train_tokens, args.knee_share)
    print(f"report: {md} and {md.with_suffix('.html')} ({len(loaded.frame)} runs from "
          f"{len(loaded.sweeps)} sweep(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
