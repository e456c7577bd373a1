"""The one parser of nccl-tests output: text tables of every version, and the `-J` JSON file.

Text layouts seen in the wild (fixtures in ../shared/data/nccl-tests):
  before 2.13   size count type redop time algbw busbw error  (x2: out-of-place, in-place)
  2.13+         size count type redop root time algbw busbw #wrong  (x2)
  2.17+         the same with a version header and wider columns
The column layout is read from the table's own header line, so a new column order needs no new code;
an excerpt without a header falls back to the layout its token count implies. Lines may carry
`mpirun --tag-output` ([1,0]<stdout>:), `srun -l` (0: ), timestamp or ANSI prefixes, and NCCL INFO lines
may sit inside the table. A stream may hold several runs (concatenated logs): `parse_all` splits them.

Why it is built the way it is: 100 MB of logs must parse in seconds. Cutting lines, stripping launcher
prefixes, classifying lines and converting table cells are pyarrow compute kernels over all lines at once;
only the lines that carry structure (headers, footers, config, versions, NCCL INFO, errors) pass through the
Python state machine, already classified by kernels, and table rows become NcclRow objects only when someone
reads `rows`.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

STATUSES = ("ok", "wrong_results", "truncated", "failed")
PLACEMENTS = ("out-of-place", "in-place")
_AVG_TOLERANCE_ABS = 0.011  # busbw is printed with 2 decimals; the Avg line with more
_AVG_TOLERANCE_REL = 0.002

_TAG_PATTERN = r"^\[\d+,\d+\]<std(?:out|err)>:"  # mpirun --tag-output
_SRUN_PATTERN = r"^\d{1,6}: "  # srun -l
_TAG = re.compile(_TAG_PATTERN)
_SRUN = re.compile(r"^\s*\d+: ")
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? ")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_RANK_PATTERN = r"^#+\s*Rank\s+(?P<rank>\d+)(?:\s|$)"  # "#  Rank  3 Group  0 Pid ..." device lines
_CONFIG = re.compile(r"(nThread|nGpus|minBytes|maxBytes|step|warmup iters|agg iters|iters|validation|graph)"
                     r":? (\S+)")
_ERROR = re.compile(r"NCCL failure|Test NCCL failure|Test failure|CUDA failure|Segmentation fault|"
                    r"Bus error|noticed that process rank|srun: error|# error:|ncclInternalError|"
                    r"ncclSystemError|ncclRemoteError")
_NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$")
_TRANSPORT_HINT = re.compile(r"NCCL INFO (?:NET/OFI Selected [Pp]rovider is \S+|NET/Socket :|NET/IB :|"
                             r".* via (?:NET|P2P|SHM)/\S+|NET/OFI Using aws-ofi-nccl \S+)")
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


class _Stats(NamedTuple):
    """What status and the summary need from a block of rows, so that they need no row objects."""

    rows: int
    busbw_sum: float
    busbw_max: float
    algbw_max: float
    wrong_sum: float

    @classmethod
    def of(cls, rows: list[NcclRow]) -> _Stats:
        if not rows:
            return cls(0, 0.0, -np.inf, -np.inf, 0.0)
        return cls(len(rows), sum(r.busbw for r in rows), max(r.busbw for r in rows),
                   max(r.algbw for r in rows), sum(r.wrong or 0 for r in rows))


@dataclass
class _Columns:
    """Rows of one table, one array per field; rows are built from them only when asked for."""

    size: np.ndarray
    count: np.ndarray
    text: dict[str, pa.Array]  # type, redop, root: where the table has them
    values: tuple[np.ndarray, ...]  # per placement: time, algbw, busbw, wrong, error (NaN: none)

    def __len__(self) -> int:
        return len(self.size)

    def cells(self, column: str, default: Any) -> list[Any]:
        return self.text[column].to_pylist() if column in self.text else [default] * len(self)

    def slice(self, a: int, b: int) -> _Columns:
        return _Columns(self.size[a:b], self.count[a:b], {k: v.slice(a, b - a) for k, v in self.text.items()},
                        tuple(v[a:b] for v in self.values))

    def rows(self) -> list[NcclRow]:
        """NcclRows, out-of-place then in-place for each line, as the table prints them."""
        fixed = (self.size.tolist(), self.count.tolist(), self.cells("type", "?"), self.cells("redop", None),
                 self.cells("root", None))
        per_placement = []
        for k, placement in enumerate(PLACEMENTS):
            time_us, algbw, busbw, wrong, error = self.values[5 * k:5 * k + 5]
            per_placement.append(list(map(NcclRow._make, zip(
                *fixed, repeat(placement), time_us.tolist(), algbw.tolist(), busbw.tolist(), _nullable(wrong),
                _nullable(error)))))
        return [row for rows in zip(*per_placement) for row in rows]


def _nullable(values: np.ndarray) -> list[float | None]:
    """NaN (no such cell, or N/A) as None."""
    if np.isnan(values).all():
        return [None] * len(values)
    return [None if math.isnan(v) else v for v in values.tolist()]


class _Block(NamedTuple):
    """Rows a:b of a bulk-converted column set: one table's share."""

    columns: _Columns
    a: int
    b: int

    def rows(self) -> list[NcclRow]:
        return self.columns.slice(self.a, self.b).rows()


@dataclass
class NcclResult:
    avg_busbw_printed: float | None = None
    out_of_bounds: int | None = None
    ranks: int | None = None
    tests_version: str | None = None
    nccl_version: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    network: str | None = None  # NCCL's "Using network X"
    transport_evidence: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _parts: list[tuple[_Stats, list[NcclRow] | _Block]] = field(default_factory=list, repr=False,
                                                                   compare=False)
    _rows: list[NcclRow] | None = field(default=None, repr=False, compare=False)

    def add_rows(self, rows: list[NcclRow]) -> None:
        if rows:
            self._parts.append((_Stats.of(rows), rows))
            self._rows = None

    @property
    def rows(self) -> list[NcclRow]:
        """One row per message size and placement, in table order (built on first use)."""
        if self._rows is None:
            self._rows = [r for _, part in self._parts
                          for r in (part if isinstance(part, list) else part.rows())]
        return self._rows

    @property
    def _n(self) -> int:
        return sum(s.rows for s, _ in self._parts)

    @property
    def avg_busbw(self) -> float | None:
        """Mean busbw over every size and placement: nccl-tests' definition of its Avg line."""
        n = self._n
        return sum(s.busbw_sum for s, _ in self._parts) / n if n else None

    @property
    def busbw_max(self) -> float | None:
        return float(max(s.busbw_max for s, _ in self._parts)) if self._n else None

    @property
    def algbw_max(self) -> float | None:
        return float(max(s.algbw_max for s, _ in self._parts)) if self._n else None

    @property
    def wrong_total(self) -> float:
        return sum(s.wrong_sum for s, _ in self._parts)

    @property
    def complete(self) -> bool:
        """The footer was printed and the rows reproduce its Avg (no rows missing from an excerpt)."""
        if self.avg_busbw_printed is None or not self._n:
            return False
        diff = abs(self.avg_busbw - self.avg_busbw_printed)
        return diff <= _AVG_TOLERANCE_ABS + _AVG_TOLERANCE_REL * self.avg_busbw_printed

    @property
    def status(self) -> str:
        if not self._n:
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
    """Column positions of a data row, computed once per distinct table header."""

    prefix: tuple[str, ...]  # the columns before the first time column, in order
    groups: tuple[tuple[int, int, int, int | None, int | None], ...]  # time, algbw, busbw, #wrong, error
    group_len: int

    @property
    def width(self) -> int:
        return len(self.prefix) + 2 * self.group_len

    @staticmethod
    @lru_cache(maxsize=64)
    def from_columns(columns: tuple[str, ...]) -> _Layout | None:
        if "time" not in columns and "cputime" not in columns:
            return None
        first = next(i for i, c in enumerate(columns) if c in ("time", "cputime"))
        half = len(columns[first:]) // 2
        groups = []
        for offset in (first, first + half):
            cols = columns[offset:offset + half]
            if "algbw" not in cols or "busbw" not in cols:
                return None
            pos = {c: offset + i for i, c in enumerate(cols)}
            groups.append((offset, pos["algbw"], pos["busbw"], pos.get("#wrong"), pos.get("error")))
        return _Layout(tuple(columns[:first]), tuple(groups), half)


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None  # "N/A"


def _value(line: str) -> str:
    """The first token after the colon of a footer line ("" when a cut log lost it)."""
    return _word(line.partition(":")[2], 0) or ""


def _word(line: str, i: int) -> str | None:
    """The i-th word of a line (None when a cut log lost it)."""
    words = line.split()
    return words[i] if len(words) > i else None


def _root(token: str) -> int | None:
    """The root column: a rank, or -1 for collectives without one; None for anything else."""
    return int(token) if token.lstrip("-").isdigit() else None


def _rows(tokens: list[str], layout: _Layout) -> list[NcclRow]:
    """The out-of-place and in-place rows of one table line (none if the line is cut short)."""
    body = len(tokens) - len(layout.prefix)
    if body == 2 * layout.group_len:
        groups = zip(PLACEMENTS, layout.groups)
    elif body == layout.group_len:  # in-place only (trace replay): its columns sit where out-of-place's do
        groups = [("in-place", layout.groups[0])]
    else:
        return []
    size, count = int(tokens[0]), int(tokens[1])
    cell = {c: tokens[i] for i, c in enumerate(layout.prefix)}
    root = _root(cell["root"]) if "root" in cell else None
    out = []
    for placement, (ti, ai, bi, wi, ei) in groups:
        try:
            time_us, algbw, busbw = float(tokens[ti]), float(tokens[ai]), float(tokens[bi])
        except ValueError:
            return []
        out.append(NcclRow(size, count, cell.get("type", "?"), cell.get("redop"), root, placement, time_us,
                           algbw, busbw, _number(tokens[wi]) if wi is not None else None,
                           _number(tokens[ei]) if ei is not None else None))
    return out


def _rows_one_by_one(lines: list[str], layout: _Layout) -> list[NcclRow]:
    """The careful path for a table with cut-off, in-place-only or non-numeric lines."""
    split = (line.split() for line in lines)
    return [r for t in split if len(t) > 1 and t[0].isdigit() and t[1].isdigit() for r in _rows(t, layout)]


# ---- whole-text passes (pyarrow kernels) -------------------------------------------------------------

def _split_lines(text: str) -> pa.LargeStringArray:
    """The text's lines, each with its "\\n" (the whitespace strip takes it), cut with one numpy search."""
    data = text.encode("utf-8", "replace")  # a lone surrogate (from errors="surrogateescape") becomes "?"
    ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1
    offsets = np.concatenate([[0], ends, [len(data)] if len(ends) == 0 or ends[-1] < len(data) else []])
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int64)),
                                            pa.py_buffer(data))


def _heads(lines: pa.LargeStringArray, width: int) -> np.ndarray:
    """The first `width` bytes of every line (0 past its end), read straight from the Arrow buffers."""
    _, offsets_buffer, data_buffer = lines.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64)[lines.offset:lines.offset + len(lines) + 1]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    if not len(data):
        return np.zeros((len(lines), width), np.uint8)
    at = offsets[:-1, None] + np.arange(width)
    out = data[np.minimum(at, len(data) - 1)]
    out[at >= offsets[1:, None]] = 0
    return out


def _where(lines: pa.LargeStringArray, mask: np.ndarray,
           fix: Callable[[pa.LargeStringArray], pa.Array]) -> pa.LargeStringArray:
    """`lines` with the masked entries replaced by `fix` of them."""
    if not mask.any():
        return lines
    mask_array = pa.array(mask)
    return pc.replace_with_mask(lines, mask_array, fix(lines.filter(mask_array)).cast(lines.type))


def _is_digit(byte: np.ndarray) -> np.ndarray:
    return (byte >= 48) & (byte <= 57)


def _clean_lines(text: str) -> tuple[pa.LargeStringArray, np.ndarray]:
    """Every line stripped of whitespace and launcher prefixes (mpirun tag and srun label by kernels, the
    rare timestamps and ANSI codes by `_unprefixed`), and the first byte of each (0 for an empty line)."""
    lines = pc.utf8_trim_whitespace(_split_lines(text))
    lines = _where(lines, _heads(lines, 1)[:, 0] == ord("["), lambda sub: pc.utf8_ltrim_whitespace(
        pc.replace_substring_regex(sub, _TAG_PATTERN, "")))
    head = _heads(lines, 8)
    digit = _is_digit(head[:, 0])
    odd = (head[:, 0] == 0x1B) | (digit & (head[:, 4] == ord("-")))  # ANSI colours, timestamps: rare
    srun = digit & ~odd & (head[:, 1:7] == ord(":")).any(axis=1)
    lines = _where(lines, odd, lambda sub: pa.array(list(map(_unprefixed, sub.to_pylist())), lines.type))
    lines = _where(lines, srun, lambda sub: pc.utf8_ltrim_whitespace(
        pc.replace_substring_regex(sub, _SRUN_PATTERN, "")))
    first = head[:, 0] if not (odd.any() or srun.any()) else _heads(lines, 1)[:, 0]
    return lines, first


def _unprefixed(line: str) -> str:
    """One line without launcher prefixes, stripped (the rare prefixes the kernels leave to Python)."""
    s = line.strip()
    if not s:
        return s
    c = s[0]  # the kernels stripped mpirun tags already: a line here starts with a digit or ESC
    if c.isdigit():
        if len(s) > 19 and s[4] == "-" and s[10] == "T":
            s = strip_prefix(s).strip()
        j = s.find(": ", 0, 8)
        if j > 0 and s[:j].isdigit():
            return s[j + 2:].strip()
    elif c == "\x1b":
        return strip_prefix(s).strip()
    return s


# What a structural line is, classified by kernels; the state machine dispatches on it. A line of no
# kind (_NONE) is dropped before the machine sees it.
HEADER, AVG, OUT_OF_BOUNDS, CONFIG, TESTS_VERSION, INFO, NCCL_VERSION, ERROR = range(8)
_NONE = -1


def _bools(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _kinds(lines: pa.LargeStringArray) -> tuple[np.ndarray, pa.Array]:
    """The kind of each candidate structural line, and its body (the text after its leading #s).
    A comment line is tried as header, footer, config and version, then as an error; any other line as
    a transport-telling NCCL INFO line, the NCCL version line, then an error."""
    hashed = _bools(pc.starts_with(lines, "#"))
    body = pc.utf8_ltrim_whitespace(pc.utf8_ltrim(lines, "#"))
    info = _bools(pc.match_substring(lines, "NCCL INFO"))
    telling = _bools(pc.or_(pc.match_substring(lines, "Using network"),
                            pc.match_substring_regex(lines, _TRANSPORT_HINT.pattern)))
    error = _bools(pc.match_substring_regex(lines, _ERROR.pattern))
    conditions = [
        hashed & _bools(pc.and_(pc.starts_with(body, "size"), pc.match_substring(body, " count"))),
        hashed & _bools(pc.starts_with(body, "Avg bus bandwidth")),
        hashed & _bools(pc.starts_with(body, "Out of bounds values")),
        hashed & _bools(pc.starts_with(body, "nThread")),
        hashed & _bools(pc.starts_with(body, "nccl-tests version")),
        ~hashed & info & telling,
        ~hashed & ~info & _bools(pc.starts_with(lines, "NCCL version")),
        (hashed | ~info) & error,
    ]
    kinds = [HEADER, AVG, OUT_OF_BOUNDS, CONFIG, TESTS_VERSION, INFO, NCCL_VERSION, ERROR]
    return np.select(conditions, kinds, _NONE), body


@dataclass
class _Scan:
    """The classified lines of a text: table data rows (tokenized), rank lines, and the structural lines."""

    data: pa.LargeStringArray
    tokens: pa.Array  # all tokens of all data rows, flat
    starts: np.ndarray  # first token of each data row
    lengths: np.ndarray  # tokens per data row
    rank: list[int]  # the ranks of the "Rank N" device lines, in order
    kind: list[int]  # per structural line, in order
    other: list[str]  # the structural lines
    body: list[str]  # their text after the leading #s
    rows_before: list[int]  # per structural line (and one past the last): data rows before it
    ranks_before: list[int]  # the same for rank lines

    @classmethod
    def of(cls, text: str) -> _Scan:
        lines, first = _clean_lines(text)
        is_data = _is_digit(first)
        hash_line = np.flatnonzero(first == ord("#"))
        hashed = lines.take(pa.array(hash_line))
        rank = pc.struct_field(pc.extract_regex(hashed, _RANK_PATTERN), 0)
        has_rank = _bools(rank.is_valid())
        candidate = ~is_data & (first != 0)
        candidate[hash_line[has_rank]] = False
        candidate_line = np.flatnonzero(candidate)
        kind, body = _kinds(lines.take(pa.array(candidate_line)))
        keep = kind != _NONE
        other_line = np.append(candidate_line[keep], len(lines))
        keep_array = pa.array(keep)
        data = lines.filter(pa.array(is_data))
        split = pc.ascii_split_whitespace(data)
        offsets = split.offsets.to_numpy()
        return cls(data, split.flatten(), offsets[:-1] - offsets[0], np.diff(offsets),
                   pc.cast(rank.drop_null(), pa.int64()).to_pylist(), kind[keep].tolist(),
                   lines.take(pa.array(other_line[:-1])).to_pylist(), body.filter(keep_array).to_pylist(),
                   np.searchsorted(np.flatnonzero(is_data), other_line).tolist(),
                   np.searchsorted(hash_line[has_rank], other_line).tolist())


# ---- table rows: from token columns to arrays ------------------------------------------------------

@dataclass
class _Table:
    """Data rows [lo, hi) of the scan that belong to one table of `result`, read with `layout`."""

    result: NcclResult
    layout: _Layout | None
    lo: int
    hi: int


def _column(tokens: pa.Array, starts: np.ndarray, i: int) -> pa.Array:
    return pc.take(tokens, pa.array(starts + i))


def _floats(cells: pa.Array, optional: bool) -> np.ndarray | None:
    """Cells as float64; an optional column (#wrong, error) gives NaN for N/A, a required one None."""
    try:
        return pc.cast(cells, pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        if not optional:
            return None
        return np.array([np.nan if v is None else v for v in map(_number, cells.to_pylist())], np.float64)


def _to_columns(scan: _Scan, rows: np.ndarray, layout: _Layout) -> _Columns | None:
    """Convert full-width rows column by column; None if a required cell is not a number."""
    starts = scan.starts[rows]
    try:
        size = pc.cast(_column(scan.tokens, starts, 0), pa.int64()).to_numpy()
        count = pc.cast(_column(scan.tokens, starts, 1), pa.int64()).to_numpy()
    except pa.ArrowInvalid:
        return None
    n = len(rows)
    text = {c: _column(scan.tokens, starts, layout.prefix.index(c)) for c in ("type", "redop", "root")
            if c in layout.prefix}
    if "root" in text:
        try:
            text["root"] = pc.cast(text["root"], pa.int64())
        except pa.ArrowInvalid:
            text["root"] = pa.array([_root(t) for t in text["root"].to_pylist()], pa.int64())
    values = []
    for ti, ai, bi, wi, ei in layout.groups:
        required = [_floats(_column(scan.tokens, starts, i), optional=False) for i in (ti, ai, bi)]
        if any(v is None for v in required):
            return None
        optional = [np.full(n, np.nan) if i is None else _floats(_column(scan.tokens, starts, i), True)
                    for i in (wi, ei)]
        values += required + optional
    return _Columns(size, count, text, tuple(values))


def _stats(columns: _Columns, bounds: np.ndarray) -> list[_Stats]:
    """Per-table stats of consecutive tables in `columns` (table k is rows bounds[k]:bounds[k+1])."""
    lines = np.diff(bounds)
    at = bounds[:-1]
    per = [columns.values[i:i + 5] for i in range(0, len(columns.values), 5)]
    busbw_sum = sum(np.add.reduceat(v[2], at) for v in per)
    busbw_max = np.maximum.reduce([np.maximum.reduceat(v[2], at) for v in per])
    algbw_max = np.maximum.reduce([np.maximum.reduceat(v[1], at) for v in per])
    wrong = sum(np.add.reduceat(np.nan_to_num(v[3]), at) for v in per)
    return [_Stats(*s) for s in zip((lines * len(per)).tolist(), busbw_sum.tolist(), busbw_max.tolist(),
                                     algbw_max.tolist(), wrong.tolist())]


def _fill(tables: list[_Table], scan: _Scan) -> None:
    """Give every table its rows, in table order: full-width tables converted in bulk per layout, the
    others (cut-off or in-place-only lines, non-numeric cells) line by line."""
    if not tables:
        return
    lo = np.array([t.lo for t in tables])
    shortest, longest = np.minimum.reduceat(scan.lengths, lo).tolist(), np.maximum.reduceat(scan.lengths, lo)
    parts: list[tuple[_Stats, list[NcclRow] | _Block] | None] = [None] * len(tables)
    bulk: dict[_Layout, list[int]] = {}
    for k, t in enumerate(tables):
        t.layout = t.layout or _fallback_layout(int(longest[k]))
        if t.layout is not None and shortest[k] == longest[k] == t.layout.width:
            bulk.setdefault(t.layout, []).append(k)
        elif t.layout is not None:
            parts[k] = _careful(t, scan)
    group_of_table = np.full(len(tables), -1)
    for g, members in enumerate(bulk.values()):
        group_of_table[members] = g
    owner = np.repeat(group_of_table, np.diff(np.append(lo, len(scan.lengths))))  # tables tile the data rows
    for g, (layout, members) in enumerate(bulk.items()):
        columns = _to_columns(scan, np.flatnonzero(owner == g), layout)
        if columns is None:  # a non-numeric cell somewhere: these tables go the careful way
            for k in members:
                parts[k] = _careful(tables[k], scan)
            continue
        bounds = np.concatenate([[0], np.cumsum([tables[k].hi - tables[k].lo for k in members])])
        edges = bounds.tolist()
        for k, stats, a, b in zip(members, _stats(columns, bounds), edges[:-1], edges[1:]):
            parts[k] = (stats, _Block(columns, a, b))
    for t, part in zip(tables, parts):
        if part is not None and part[0].rows:
            t.result._parts.append(part)


def _careful(table: _Table, scan: _Scan) -> tuple[_Stats, list[NcclRow]]:
    rows = _rows_one_by_one(scan.data.slice(table.lo, table.hi - table.lo).to_pylist(), table.layout)
    return _Stats.of(rows), rows


def _fallback_layout(tokens: int) -> _Layout | None:
    header = _FALLBACK_LAYOUTS.get(tokens)
    return _Layout.from_columns(tuple(header.split())) if header else None


# ---- the state machine over the structural lines --------------------------------------------------

class _Runs:
    """Walks the structural lines in order; the data rows between two of them are claimed by count.
    `k` is a structural line's index in scan.other (len(scan.other): the end of the text)."""

    def __init__(self, scan: _Scan) -> None:
        self.scan = scan
        self.results: list[NcclResult] = []
        self.tables: list[_Table] = []
        self.current = NcclResult()
        self.layout: _Layout | None = None
        self.rank_start = 0  # rank lines before the current run
        self.taken = 0  # data rows claimed so far

    def has_rows(self, k: int) -> bool:
        return bool(self.tables) and self.tables[-1].result is self.current or self.scan.rows_before[k] > self.taken

    def flush(self, k: int) -> None:
        hi = self.scan.rows_before[k]
        if hi > self.taken:
            self.tables.append(_Table(self.current, self.layout, self.taken, hi))
            self.taken = hi

    def close(self, k: int) -> None:
        self.flush(k)
        current = self.current
        lo, hi = self.rank_start, self.scan.ranks_before[k]
        if hi > lo:
            current.ranks = current.ranks or max(self.scan.rank[lo:hi]) + 1
        self.results.append(current)  # run() keeps those that end up with rows, errors or a config
        self.current, self.rank_start = NcclResult(), hi

    def line(self, k: int, kind: int, s: str, body: str) -> None:
        current = self.current
        if kind == HEADER:
            if self.has_rows(k):  # a second table in the same stream
                self.close(k)
            self.flush(k)
            self.layout = _Layout.from_columns(tuple(body.split()))
        elif kind == AVG:
            self.flush(k)
            current.avg_busbw_printed = _number(_value(body))
        elif kind == OUT_OF_BOUNDS:
            value = _value(body)
            current.out_of_bounds = int(value) if value.isdigit() else None
        elif kind == CONFIG:
            if self.has_rows(k) or current.config:
                self.close(k)
            self.current.config = dict(_CONFIG.findall(body))
        elif kind == TESTS_VERSION:
            if self.has_rows(k):
                self.close(k)
            self.current.tests_version = _word(body, 2) or self.current.tests_version
        elif kind == INFO:
            if "Using network" in s:
                m = _NETWORK.search(s)
                if m:
                    current.network = m.group(1)
            if len(current.transport_evidence) < 8 and _TRANSPORT_HINT.search(s):
                current.transport_evidence.append(s[-200:])
        elif kind == NCCL_VERSION:
            current.nccl_version = _word(s, 2) or current.nccl_version
        else:
            current.errors.append(s[:300])

    def run(self) -> list[NcclResult]:
        scan = self.scan
        for k, (kind, s, body) in enumerate(zip(scan.kind, scan.other, scan.body)):
            self.line(k, kind, s, body)
        self.close(len(scan.other))
        _fill(self.tables, scan)
        return [r for r in self.results if r._parts or r.errors or r.config]


def parse_all(text: str) -> list[NcclResult]:
    """Every nccl-tests run in a text stream, in order."""
    return _Runs(_Scan.of(text)).run()


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
    rows = []
    for entry in doc.get("results") or []:
        for placement, key in zip(PLACEMENTS, ("out_of_place", "in_place")):
            body = entry.get(key)
            if not body:
                continue
            time_us = body.get("time", body.get("cpu_time"))
            root = entry.get("root")
            rows.append(NcclRow(
                size=int(entry["size"]), count=int(entry["count"]), dtype=entry.get("type", "?"),
                redop=entry.get("redop"), root=_root(str(root).strip()),
                placement=placement, time_us=float(time_us), algbw=float(body["alg_bw"]),
                busbw=float(body["bus_bw"]), wrong=body.get("nwrong")))
    result.add_rows(rows)
    oob = doc.get("out_of_bounds") or {}
    result.out_of_bounds = oob.get("count")
    avg = doc.get("average_bus_bandwidth") or {}
    result.avg_busbw_printed = avg.get("bandwidth")
    result.errors = [e for e in doc.get("errors") or [] if e]
    return result
