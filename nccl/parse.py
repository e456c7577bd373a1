"""The one parser of nccl-tests output: text tables of every version, and the `-J` JSON file.

Text layouts seen in the wild (fixtures in ../shared/data/nccl-tests):
  before 2.13   size count type redop time algbw busbw error  (x2: out-of-place, in-place)
  2.13+         size count type redop root time algbw busbw #wrong  (x2)
  2.17+         the same with a version header and wider columns
The column layout is read from the table's own header line, so a new column order needs no new code;
an excerpt without a header falls back to the layout its token count implies. Lines may carry
`mpirun --tag-output` ([1,0]<stdout>:), `srun -l` (0: ), timestamp or ANSI prefixes, and NCCL INFO lines
may sit inside the table. A stream may hold several runs (concatenated logs): `parse_all` splits them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

STATUSES = ("ok", "wrong_results", "truncated", "failed")
PLACEMENTS = ("out-of-place", "in-place")
_AVG_TOLERANCE_ABS = 0.011  # busbw is printed with 2 decimals; the Avg line with more
_AVG_TOLERANCE_REL = 0.002

_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")  # mpirun --tag-output
_SRUN = re.compile(r"^\s*\d+: ")  # srun -l
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? ")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONFIG = re.compile(r"(nThread|nGpus|minBytes|maxBytes|step|warmup iters|agg iters|iters|validation|graph)"
                     r":? (\S+)")
_FALLBACK_LAYOUTS = {  # token count of a full row -> header columns
    13: "size count type redop root time algbw busbw #wrong time algbw busbw #wrong",
    12: "size count type redop time algbw busbw error time algbw busbw error",
    11: "size count type time algbw busbw error time algbw busbw error",
}


class NcclRow(NamedTuple):
    size: int  # bytes
    count: int  # elements
    dtype: str
    redop: str | None
    root: int | None
    placement: str
    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: float | None  # #wrong elements (2.13+); None where the table has no such column or N/A
    error: float | None = None  # max error (before 2.13)


@dataclass
class NcclResult:
    rows: list[NcclRow] = field(default_factory=list)
    avg_busbw_printed: float | None = None
    out_of_bounds: int | None = None
    ranks: int | None = None
    tests_version: str | None = None
    nccl_version: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    network: str | None = None  # NCCL's "Using network X"
    transport_evidence: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def avg_busbw(self) -> float | None:
        """Mean busbw over every size and placement: nccl-tests' definition of its Avg line."""
        return sum(r.busbw for r in self.rows) / len(self.rows) if self.rows else None

    @property
    def busbw_max(self) -> float | None:
        return max((r.busbw for r in self.rows), default=None)

    @property
    def algbw_max(self) -> float | None:
        return max((r.algbw for r in self.rows), default=None)

    @property
    def wrong_total(self) -> float:
        return sum(r.wrong or 0 for r in self.rows)

    @property
    def complete(self) -> bool:
        """The footer was printed and the rows reproduce its Avg (no rows missing from an excerpt)."""
        if self.avg_busbw_printed is None or not self.rows:
            return False
        diff = abs(self.avg_busbw - self.avg_busbw_printed)
        return diff <= _AVG_TOLERANCE_ABS + _AVG_TOLERANCE_REL * self.avg_busbw_printed

    @property
    def status(self) -> str:
        if not self.rows:
            return "failed"
        if self.wrong_total > 0 or (self.out_of_bounds or 0) > 0:
            return "wrong_results"
        if self.errors and self.avg_busbw_printed is None:
            return "failed"
        return "ok" if self.complete else "truncated"

    def inferred_ranks(self) -> int | None:
        """Ranks from the device list, else from busbw/algbw = 2(n-1)/n on the largest message."""
        if self.ranks:
            return self.ranks
        big = max((r for r in self.rows if r.algbw > 0), key=lambda r: r.size, default=None)
        if big is None:
            return None
        ratio = big.busbw / big.algbw
        return round(2 / (2 - ratio)) if ratio < 1.999 else None


def strip_prefix(line: str) -> str:
    """Remove launcher prefixes (mpirun tag, srun label, timestamps, ANSI) from one log line."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if line.startswith("["):
        m = _TAG.match(line)
        if m:
            return line[m.end():]
    if line[:4].isdigit():
        m = _STAMP.match(line)
        if m:
            line = line[m.end():]
    m = _SRUN.match(line)
    return line[m.end():] if m else line


@dataclass(frozen=True)
class _Layout:
    """Column positions of a data row, computed once per table header."""

    prefix: dict[str, int]
    groups: tuple[tuple[int, int, int, int | None, int | None], ...]  # time, algbw, busbw, #wrong, error
    group_len: int

    @classmethod
    def from_columns(cls, columns: list[str]) -> _Layout | None:
        if "time" not in columns and "cputime" not in columns:
            return None
        first = next(i for i, c in enumerate(columns) if c in ("time", "cputime"))
        rest = columns[first:]
        half = len(rest) // 2
        groups = []
        for offset in (first, first + half):
            cols = columns[offset:offset + half]
            if "algbw" not in cols or "busbw" not in cols:
                return None
            pos = {c: offset + i for i, c in enumerate(cols)}
            groups.append((offset, pos["algbw"], pos["busbw"], pos.get("#wrong"), pos.get("error")))
        return cls({c: i for i, c in enumerate(columns[:first])}, tuple(groups), half)


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None  # "N/A"


def _rows(tokens: list[str], layout: _Layout) -> list[NcclRow]:
    """The out-of-place and in-place rows of one table line (none if the line is cut short)."""
    body = len(tokens) - len(layout.prefix)
    if body == 2 * layout.group_len:
        groups = zip(PLACEMENTS, layout.groups)
    elif body == layout.group_len:  # in-place only (trace replay): its columns sit where out-of-place's do
        groups = [("in-place", layout.groups[0])]
    else:
        return []
    pre = layout.prefix
    size, count = int(tokens[0]), int(tokens[1])
    dtype = tokens[pre["type"]] if "type" in pre else "?"
    redop = tokens[pre["redop"]] if "redop" in pre else None
    root = tokens[pre["root"]] if "root" in pre else None
    root_value = int(root) if root is not None and root.lstrip("-").isdigit() else None
    out = []
    for placement, (ti, ai, bi, wi, ei) in groups:
        try:
            time_us, algbw, busbw = float(tokens[ti]), float(tokens[ai]), float(tokens[bi])
        except ValueError:
            return []
        out.append(NcclRow(size, count, dtype, redop, root_value, placement, time_us, algbw, busbw,
                           _number(tokens[wi]) if wi is not None else None,
                           _number(tokens[ei]) if ei is not None else None))
    return out


_ERROR = re.compile(r"NCCL failure|Test NCCL failure|Test failure|CUDA failure|Segmentation fault|"
                    r"Bus error|noticed that process rank|srun: error|# error:|ncclInternalError|"
                    r"ncclSystemError|ncclRemoteError")
_NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$")
_TRANSPORT_HINT = re.compile(r"NCCL INFO (?:NET/OFI Selected [Pp]rovider is \S+|NET/Socket :|NET/IB :|"
                             r".* via (?:NET|P2P|SHM)/\S+|NET/OFI Using aws-ofi-nccl \S+)")


def _unprefixed(line: str) -> str:
    """The line without launcher prefixes, stripped; cheap string tests before any regex."""
    s = line.strip()
    if not s:
        return s
    c = s[0]
    if c == "[":
        j = s.find(">:")
        if j > 0 and _TAG.match(s):
            return s[j + 2:].strip()
    elif c.isdigit():
        if len(s) > 19 and s[4] == "-" and s[10] == "T":
            s = strip_prefix(s).strip()
        j = s.find(": ", 0, 8)
        if j > 0 and s[:j].isdigit():
            return s[j + 2:].strip()
    elif c == "\x1b":
        return strip_prefix(s).strip()
    return s


def _table_rows(lines: list[str], layout: _Layout | None) -> list[NcclRow]:
    """Convert the buffered data lines of one table in bulk: split, transpose, map(float)."""
    if not lines:
        return []
    split = [line.split() for line in lines]
    if layout is None:
        fallback = _FALLBACK_LAYOUTS.get(max(len(t) for t in split))
        layout = _Layout.from_columns(fallback.split()) if fallback else None
        if layout is None:
            return []
    width = len(layout.prefix) + 2 * layout.group_len
    full = [t for t in split if len(t) == width and t[0].isdigit() and t[1].isdigit()]
    rows: list[NcclRow] = []
    if len(full) != len(split):  # cut-off lines, in-place-only rows: one by one
        return [r for t in split if t[0].isdigit() and len(t) > 1 and t[1].isdigit() for r in _rows(t, layout)]
    columns = list(zip(*full))
    pre = layout.prefix
    size, count = list(map(int, columns[0])), list(map(int, columns[1]))
    dtype = columns[pre["type"]] if "type" in pre else ["?"] * len(full)
    redop = columns[pre["redop"]] if "redop" in pre else [None] * len(full)
    root = ([int(r) if r.lstrip("-").isdigit() else None for r in columns[pre["root"]]] if "root" in pre
            else [None] * len(full))
    per_placement = []
    for placement, (ti, ai, bi, wi, ei) in zip(PLACEMENTS, layout.groups):
        try:
            values = (list(map(float, columns[ti])), list(map(float, columns[ai])), list(map(float, columns[bi])))
        except ValueError:  # a non-numeric cell somewhere: fall back to the careful path
            return [r for t in full for r in _rows(t, layout)]
        wrong = list(map(_number, columns[wi])) if wi is not None else [None] * len(full)
        error = list(map(_number, columns[ei])) if ei is not None else [None] * len(full)
        per_placement.append(list(map(NcclRow._make, zip(size, count, dtype, redop, root, [placement] * len(full),
                                                           *values, wrong, error))))
    for out_row, in_row in zip(*per_placement):
        rows += (out_row, in_row)
    return rows


def parse_all(text: str) -> list[NcclResult]:
    """Every nccl-tests run in a text stream, in order."""
    results: list[NcclResult] = []
    current = NcclResult()
    layout: _Layout | None = None
    ranks_seen: set[int] = set()
    pending: list[str] = []  # data lines of the current table, converted in bulk

    def flush() -> None:
        current.rows.extend(_table_rows(pending, layout))
        pending.clear()

    def close() -> None:
        nonlocal current, ranks_seen
        flush()
        if current.rows or current.errors or current.config:
            current.ranks = current.ranks or (max(ranks_seen) + 1 if ranks_seen else None)
            results.append(current)
        current, ranks_seen = NcclResult(), set()

    append = pending.append
    for raw in text.splitlines():
        s = _unprefixed(raw)
        if not s:
            continue
        c = s[0]
        if c.isdigit():
            append(s)
            continue
        if c == "#":
            body = s.lstrip("#").strip()
            if body.startswith("size") and " count" in body:
                if current.rows or pending:  # a second table in the same stream
                    close()
                layout = _Layout.from_columns(body.split())
            elif body.startswith("Avg bus bandwidth"):
                flush()
                current.avg_busbw_printed = _number(body.split(":", 1)[1].split()[0])
            elif body.startswith("Out of bounds values"):
                current.out_of_bounds = int(body.split(":", 1)[1].split()[0])
            elif body.startswith("nThread"):
                if current.rows or pending or current.config:
                    close()
                current.config = dict(_CONFIG.findall(body))
            elif body.startswith("nccl-tests version"):
                if current.rows or pending:
                    close()
                current.tests_version = body.split()[2]
            elif body.startswith("Rank"):
                parts = body.split()
                if len(parts) > 1 and parts[1].isdigit():
                    ranks_seen.add(int(parts[1]))
            elif _ERROR.search(s):
                current.errors.append(s[:300])
            continue
        if "NCCL INFO" in s:
            if "Using network" in s:
                m = _NETWORK.search(s)
                if m:
                    current.network = m.group(1)
            if len(current.transport_evidence) < 8 and _TRANSPORT_HINT.search(s):
                current.transport_evidence.append(s[-200:])
            continue
        if s.startswith("NCCL version"):
            current.nccl_version = s.split()[2]
        elif _ERROR.search(s):
            current.errors.append(s[:300])
    close()
    return results


def parse(text: str) -> NcclResult:
    """The (last) nccl-tests run in a text; an empty result (status failed) if there is none."""
    results = parse_all(text)
    return results[-1] if results else NcclResult(errors=["no nccl-tests output found"])


def parse_json(data: str | dict[str, Any]) -> NcclResult:
    """The `-J file.json` output of nccl-tests 2.17+ (keys from its util.cu)."""
    doc = json.loads(data) if isinstance(data, str) else data
    result = NcclResult()
    config = doc.get("config") or {}
    result.config = {k: str(v) for k, v in config.items() if k != "devices"}
    devices = config.get("devices") or []
    result.ranks = len(devices) or None
    version = doc.get("nccl_version")
    if isinstance(version, int):  # NCCL_VERSION_CODE: major*10000 + minor*100 + patch (2.9+)
        result.nccl_version = f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    for entry in doc.get("results") or []:
        for placement, key in zip(PLACEMENTS, ("out_of_place", "in_place")):
            body = entry.get(key)
            if not body:
                continue
            time_us = body.get("time", body.get("cpu_time"))
            root = entry.get("root")
            result.rows.append(NcclRow(
                size=int(entry["size"]), count=int(entry["count"]), dtype=entry.get("type", "?"),
                redop=entry.get("redop"), root=int(root) if str(root).strip().lstrip("-").isdigit() else None,
                placement=placement, time_us=float(time_us), algbw=float(body["alg_bw"]),
                busbw=float(body["bus_bw"]), wrong=body.get("nwrong")))
    oob = doc.get("out_of_bounds") or {}
    result.out_of_bounds = oob.get("count")
    avg = doc.get("average_bus_bandwidth") or {}
    result.avg_busbw_printed = avg.get("bandwidth")
    result.errors = [e for e in doc.get("errors") or [] if e]
    return result
