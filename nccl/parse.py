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
prefixes, classifying lines and reading table cells are done over all lines at once: by the C scanner
(_fastscan.c, loaded with ctypes) where `pip install` built it and the text is plain ASCII, else by
pyarrow compute kernels, which define what the C scanner must do (the tests hold the two to the same
results). The lines that carry structure (headers, footers, config, versions, NCCL INFO, errors) are cut
into runs with numpy, only their values are read in Python, and table rows become NcclRow objects only
when someone reads `rows`. A large text is scanned in pieces on threads (one per core, up to 4): the C
scanner and the kernels release the GIL.
"""
from __future__ import annotations

import ctypes
import gc
import importlib.machinery
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise, repeat
from pathlib import Path
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
_PREFIX_PATTERN = rf"{_TAG_PATTERN}\s*(?:{_SRUN_PATTERN[1:]})?|{_SRUN_PATTERN}"  # either, or a tag then a label
_TAG = re.compile(_TAG_PATTERN)
_SRUN = re.compile(r"^\s*\d+: ")
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? ")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_RANK_PATTERN = r"^#+\s*Rank\s+(?P<rank>\d{1,18})(?:\s|$)"  # "#  Rank  3 Group  0 Pid ..." device lines
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

    def __add__(self, other: _Stats) -> _Stats:  # type: ignore[override]
        return _Stats(self.rows + other.rows, self.busbw_sum + other.busbw_sum,
                      max(self.busbw_max, other.busbw_max), max(self.algbw_max, other.algbw_max),
                      self.wrong_sum + other.wrong_sum)


_NO_ROWS = _Stats.of([])


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


@dataclass(slots=True)  # tens of thousands per 100 MB: no per-instance dict to build or for the GC to walk
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
    _parts: list[list[NcclRow] | _Block] = field(default_factory=list, repr=False, compare=False)
    _stats: _Stats = field(default=_NO_ROWS, repr=False, compare=False)  # of all parts, for the summary
    _rows: list[NcclRow] | None = field(default=None, repr=False, compare=False)

    def add_rows(self, rows: list[NcclRow]) -> None:
        if rows:
            self._add(_Stats.of(rows), rows)

    def _add(self, stats: _Stats, part: list[NcclRow] | _Block) -> None:
        self._parts.append(part)
        self._stats = stats if self._stats is _NO_ROWS else self._stats + stats
        self._rows = None

    @property
    def rows(self) -> list[NcclRow]:
        """One row per message size and placement, in table order (built on first use)."""
        if self._rows is None:
            self._rows = [r for part in self._parts for r in (part if isinstance(part, list) else part.rows())]
        return self._rows

    @property
    def _n(self) -> int:
        return self._stats.rows

    @property
    def avg_busbw(self) -> float | None:
        """Mean busbw over every size and placement: nccl-tests' definition of its Avg line."""
        return self._stats.busbw_sum / self._n if self._n else None

    @property
    def busbw_max(self) -> float | None:
        return float(self._stats.busbw_max) if self._n else None

    @property
    def algbw_max(self) -> float | None:
        return float(self._stats.algbw_max) if self._n else None

    @property
    def wrong_total(self) -> float:
        return self._stats.wrong_sum

    @property
    def complete(self) -> bool:
        """The footer was printed and the rows reproduce its Avg (no rows missing from an excerpt)."""
        printed, mean = self.avg_busbw_printed, self.avg_busbw
        if printed is None or mean is None:
            return False
        return abs(mean - printed) <= _AVG_TOLERANCE_ABS + _AVG_TOLERANCE_REL * printed

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


def _word(line: str, i: int) -> str | None:
    """The i-th word of a line (None when a cut log lost it)."""
    words = line.split()
    return words[i] if len(words) > i else None


def _root(token: str) -> int | None:
    """The root column: a rank, or -1 for collectives without one; None for anything else."""
    return int(token) if token.lstrip("-").isdecimal() else None  # isdigit() takes "²", which int() does not


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
    return [r for t in split if len(t) > 1 and t[0].isdecimal() and t[1].isdecimal() for r in _rows(t, layout)]


# ---- whole-text passes (pyarrow kernels) -------------------------------------------------------------

def _split_lines(data: bytes | memoryview) -> pa.LargeStringArray:
    """The lines of UTF-8 text, each with its "\\n" (the whitespace strip takes it), cut with one numpy search."""
    ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1
    offsets = np.concatenate([[0], ends, [len(data)] if len(ends) == 0 or ends[-1] < len(data) else []])
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int64)),
                                            pa.py_buffer(data))


def _heads(lines: pa.LargeStringArray) -> np.ndarray:
    """The first 8 bytes of every line (0 past its end) as an (n, 8) byte matrix: one gather of 8-byte
    words from an overlapping view of the Arrow data buffer, masked to each line's length."""
    _, offsets_buffer, data_buffer = lines.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64)[lines.offset:lines.offset + len(lines) + 1]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    if len(data) < 8:
        data = np.concatenate([data, np.zeros(8, np.uint8)])
    words = np.ndarray((len(data) - 7,), "<u8", data, strides=(1,))  # words[i]: the 8 bytes from byte i
    starts = offsets[:-1]
    at = np.minimum(starts, len(data) - 8)
    head = words[at] >> (8 * (starts - at)).astype(np.uint64)  # the last lines read from a word before them
    length = np.minimum(np.diff(offsets), 8).astype(np.uint64)
    mask = np.where(length == 8, np.uint64(2**64 - 1), (np.uint64(1) << (8 * length)) - np.uint64(1))
    return (head & mask).astype("<u8").view(np.uint8).reshape(len(starts), 8)


def _where(lines: pa.LargeStringArray, mask: np.ndarray,
           fix: Callable[[pa.LargeStringArray], pa.Array]) -> tuple[pa.LargeStringArray, pa.Array]:
    """`lines` with the masked entries replaced by `fix` of them, and those fixed entries."""
    mask_array = pa.array(mask)
    fixed = fix(lines.filter(mask_array)).cast(lines.type)
    return pc.replace_with_mask(lines, mask_array, fixed), fixed


def _is_digit(byte: np.ndarray) -> np.ndarray:
    return (byte >= 48) & (byte <= 57)


def _clean_lines(data: bytes | memoryview) -> tuple[pa.LargeStringArray, np.ndarray]:
    """Every line stripped of whitespace and launcher prefixes (mpirun tags and srun labels by one kernel,
    the rare timestamps and ANSI codes by `_unprefixed`), and the first byte of each (0 for an empty line).
    Lines are read by their first 8 bytes, so only the prefixed ones are copied."""
    lines = pc.utf8_trim_whitespace(_split_lines(data))
    head = _heads(lines)
    digit = _is_digit(head[:, 0])
    stamp = digit & (head[:, 4] == ord("-"))
    prefixed = (head[:, 0] == ord("[")) | (digit & ~stamp & (head[:, 1:7] == ord(":")).any(axis=1))
    if prefixed.any():
        lines, stripped = _where(lines, prefixed, lambda sub: pc.utf8_ltrim_whitespace(
            pc.replace_substring_regex(sub, _PREFIX_PATTERN, "")))
        head[prefixed] = _heads(stripped)
        digit = _is_digit(head[:, 0])
        stamp = digit & (head[:, 4] == ord("-"))
    odd = (head[:, 0] == 0x1B) | stamp  # ANSI colours, timestamps: rare, left to Python
    if odd.any():
        lines, unprefixed = _where(lines, odd, lambda sub: pa.array(list(map(_unprefixed, sub.to_pylist()))))
        head[odd] = _heads(unprefixed)
    return lines, head[:, 0]


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


def _body(lines: pa.Array) -> pa.Array:
    """The text after a line's leading #s (the whole line if it has none)."""
    return pc.utf8_ltrim_whitespace(pc.utf8_ltrim(lines, "#"))


def _kinds(lines: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
    """The kind of each candidate structural line, and whether it tells the transport (_TRANSPORT_HINT).
    A comment line is tried as header, footer, config and version, then as an error; any other line as
    a transport-telling NCCL INFO line, the NCCL version line, then an error. Each kernel runs only over
    the lines it can still decide, which is what keeps this cheap on INFO-heavy logs."""
    kind = np.full(len(lines), _NONE)
    hashed = _bools(pc.starts_with(lines, "#"))
    at = np.flatnonzero(hashed)
    body = _body(lines.take(pa.array(at)))
    for k, start in ((AVG, "Avg bus bandwidth"), (OUT_OF_BOUNDS, "Out of bounds values"), (CONFIG, "nThread"),
                     (TESTS_VERSION, "nccl-tests version"), (HEADER, "size")):
        hit = _bools(pc.starts_with(body, start)) & (kind[at] == _NONE)
        kind[at[hit]] = k
    size = np.flatnonzero(kind[at] == HEADER)
    kind[at[size[~_bools(pc.match_substring(body.take(pa.array(size)), " count"))]]] = _NONE
    plain = np.flatnonzero(~hashed)
    info = _bools(pc.match_substring(lines.take(pa.array(plain)), "NCCL INFO"))
    said = plain[info]
    said_lines = lines.take(pa.array(said))
    hint = _bools(pc.match_substring_regex(said_lines, _TRANSPORT_HINT.pattern))
    kind[said[hint | _bools(pc.match_substring(said_lines, "Using network"))]] = INFO
    told = np.zeros(len(lines), bool)
    told[said[hint]] = True
    quiet = plain[~info]
    kind[quiet[_bools(pc.starts_with(lines.take(pa.array(quiet)), "NCCL version"))]] = NCCL_VERSION
    may_fail = hashed.copy()
    may_fail[quiet] = True
    open_ = np.flatnonzero((kind == _NONE) & may_fail)
    kind[open_[_bools(pc.match_substring_regex(lines.take(pa.array(open_)), _ERROR.pattern))]] = ERROR
    return kind, told


def _first_word_after_colon(body: str) -> str:
    """The first word after the colon of a footer line ("" when a cut log lost it)."""
    words = body.partition(":")[2].split(None, 1)
    return words[0] if words else ""


def _info(line: str, told: bool) -> tuple[str | None, str | None]:
    """An INFO line's network ("Using network X") and transport evidence (`told`: it matched
    _TRANSPORT_HINT)."""
    network = _NETWORK.search(line) if "Using network" in line else None
    return network and network.group(1), line[-200:] if told else None


# What a structural line says, per kind: read from its body (the text after its #s) or its whole line,
# all lines of a kind at once. `told` is for INFO lines.
_READ_BODY = {
    HEADER: lambda bodies, told: bodies,  # the columns, split when the layout is read
    AVG: lambda bodies, told: [_number(_first_word_after_colon(b)) for b in bodies],
    OUT_OF_BOUNDS: lambda bodies, told: [int(v) if (v := _first_word_after_colon(b)).isdecimal() else None
                                         for b in bodies],
    CONFIG: lambda bodies, told: [dict(_CONFIG.findall(b)) for b in bodies],
    TESTS_VERSION: lambda bodies, told: [_word(b, 2) for b in bodies],
}
_READ_LINE = {
    NCCL_VERSION: lambda lines, told: [_word(line, 2) for line in lines],
    INFO: lambda lines, told: list(map(_info, lines, told)),
    ERROR: lambda lines, told: [line[:300] for line in lines],
}


def _values(lines: pa.LargeStringArray, kind: np.ndarray, told: np.ndarray) -> list[Any]:
    """What each structural line says, read once, kind by kind: the footer's number, the config, a version,
    an INFO line's network and transport evidence, an error's text, a header's columns."""
    value: list[Any] = [None] * len(kind)
    for k in np.unique(kind).tolist():
        at = np.flatnonzero(kind == k)
        some = lines.take(_int64_array(at))
        read = _READ_BODY.get(k) or _READ_LINE[k]
        texts = (_body(some) if k in _READ_BODY else some).to_pylist()
        for i, v in zip(at.tolist(), read(texts, told[at].tolist())):
            value[i] = v
    return value


class _Structure(NamedTuple):
    """The lines around the table rows of a text: device-list ranks and the structural lines."""

    rank: np.ndarray  # the ranks of the "Rank N" device lines, in order
    kind: np.ndarray  # per structural line, in order
    value: list[Any]  # what each says (_values)
    rows_before: np.ndarray  # per structural line (and one past the last): data rows before it
    ranks_before: np.ndarray  # the same for rank lines

    @classmethod
    def read(cls, lines: pa.LargeStringArray, kind: np.ndarray, told: np.ndarray, rows_before: np.ndarray,
             rank: np.ndarray, ranks_before: np.ndarray) -> _Structure:
        """The structure from its lines, classified (`told`: an INFO line tells the transport;
        `rows_before`, `ranks_before`: the rows and device lines before each line and, last, all of them),
        with what each line says. Read last in a piece's scan: Python work in one thread slows the many
        short kernel calls of another (each waits for the GIL)."""
        return cls(rank, kind, _values(lines, kind, told), rows_before, ranks_before)

    @classmethod
    def join(cls, parts: list[_Structure]) -> _Structure:
        """Consecutive pieces' structures as one: indices shifted past the pieces before (a piece's last
        rows_before is all its rows)."""
        row_base = np.cumsum([0] + [p.rows_before[-1] for p in parts])
        rank_base = np.cumsum([0] + [len(p.rank) for p in parts])
        last = len(parts) - 1
        return cls(np.concatenate([p.rank for p in parts]), np.concatenate([p.kind for p in parts]),
                   [v for p in parts for v in p.value],
                   np.concatenate([p.rows_before[:None if i == last else -1] + r
                                   for i, (p, r) in enumerate(zip(parts, row_base))]),
                   np.concatenate([p.ranks_before[:None if i == last else -1] + r
                                   for i, (p, r) in enumerate(zip(parts, rank_base))]))


@dataclass
class _ArrowRows:
    """Table rows tokenized by pyarrow kernels: every token kept as text, converted per column later."""

    data: pa.LargeStringArray | pa.ChunkedArray  # the table rows
    tokens: list[pa.Array]  # per piece of the text: all tokens of its rows, flat
    token_bases: np.ndarray  # per piece: the tokens in the pieces before it
    starts: np.ndarray  # first token of each row (counted over all pieces)
    lengths: np.ndarray  # tokens per row

    @classmethod
    def join(cls, parts: list[_ArrowRows]) -> _ArrowRows:
        """Consecutive pieces' rows; their token arrays are kept apart (copying them would cost more than
        taking from each)."""
        tokens = np.cumsum([0] + [len(p.tokens[0]) for p in parts])
        return cls(pa.chunked_array([p.data for p in parts]), [p.tokens[0] for p in parts], tokens[:-1],
                   np.concatenate([p.starts + t for p, t in zip(parts, tokens)]),
                   np.concatenate([p.lengths for p in parts]))

    def lines(self, lo: int, hi: int) -> list[str]:
        return self.data.slice(lo, hi - lo).to_pylist()

    def column(self, rows: np.ndarray, i: int) -> pa.Array:
        """Token i of the given rows (ascending), taken piece by piece."""
        at = self.starts[rows] + i
        taken = [pc.take(tokens, pa.array(idx - base)) for tokens, base, idx
                 in zip(self.tokens, self.token_bases, np.split(at, np.searchsorted(at, self.token_bases[1:])))
                 if len(idx)]
        return taken[0] if len(taken) == 1 else pa.concat_arrays(taken)

    def convert(self, rows: np.ndarray, jobs: list[tuple[int, str]], workers: int) -> list[Any]:
        """Each (token, how) column of the given rows, as _convert makes it (side by side on threads)."""
        return _map(lambda job: _convert(self.column(rows, job[0]), job[1]), jobs, workers)


@dataclass
class _NativeRows:
    """Table rows found by the C scanner: their bounds in the text, read column by column in C later."""

    text: str  # the whole text (ASCII: byte offsets are character offsets)
    address: int  # where its bytes are (_address)
    start: np.ndarray  # byte offset of each row
    end: np.ndarray
    lengths: np.ndarray  # tokens per row

    @classmethod
    def join(cls, parts: list[_NativeRows]) -> _NativeRows:
        return cls(parts[0].text, parts[0].address, *(np.concatenate([getattr(p, f) for p in parts])
                                                       for f in ("start", "end", "lengths")))

    def lines(self, lo: int, hi: int) -> list[str]:
        return [self.text[a:b] for a, b in zip(self.start[lo:hi].tolist(), self.end[lo:hi].tolist())]

    def _take(self, rows: np.ndarray, jobs: list[tuple[int, int, np.ndarray]], workers: int) -> list[bool]:
        """Tokens of the given rows into arrays, one (token, kind, out) per column, in one C pass over the
        rows (split among `workers` threads); for each column, whether all its tokens had the kind's form."""
        start, end = self.start[rows], self.end[rows]
        col, kind = (np.array([job[k] for job in jobs], np.int64) for k in (0, 1))
        per_row = [2 if k == 2 else 1 for _, k, _ in jobs]  # kind 2 writes a (start, end) pair per row

        def run(chunk: tuple[int, int]) -> np.ndarray:
            a, b = chunk
            outs = np.array([_ptr(out) + a * n * out.itemsize for (_, _, out), n in zip(jobs, per_row)],
                            np.uint64)
            ok = np.ones(len(jobs), np.int64)
            _NATIVE.take_columns(self.address, _ptr(start) + a * start.itemsize, _ptr(end) + a * end.itemsize,
                                 b - a, len(jobs), _ptr(col), _ptr(kind), _ptr(outs), _ptr(ok))
            return ok

        oks = _map(run, _pieces_of(len(rows), workers), workers)
        return np.logical_and.reduce([np.ones(len(jobs), bool)] + oks).tolist()

    def _text(self, rows: np.ndarray, bounds: np.ndarray) -> pa.LargeStringArray:
        """The tokens with these bounds (start/end pairs) as a string array."""
        offsets = np.empty(len(rows) + 1, np.int64)
        buf = np.empty(int((bounds[1::2] - bounds[::2]).sum()), np.uint8)
        _NATIVE.gather(self.address, _ptr(bounds), len(rows), _ptr(offsets), _ptr(buf))
        return pa.LargeStringArray.from_buffers(len(rows), pa.py_buffer(offsets), pa.py_buffer(buf))

    def convert(self, rows: np.ndarray, jobs: list[tuple[int, str]], workers: int) -> list[Any]:
        """As _convert of each (token, how) column's text: numbers of the plain form are read in C, and a
        column with any other form (N/A, nan, +1) goes through _convert itself."""
        rows = np.ascontiguousarray(rows)
        kinds = [2 if how == "text" else 1 if how in ("int", "root") else 0 for _, how in jobs]
        outs = [np.empty(len(rows), (np.float64, np.int64)[k]) if k < 2 else np.empty(2 * len(rows), np.int64)
                for k in kinds]
        ok = self._take(rows, [(i, k, out) for (i, _), k, out in zip(jobs, kinds, outs)], workers)
        got = []
        for (i, how), k, out, fine in zip(jobs, kinds, outs, ok):
            if k == 2:
                got.append(self._text(rows, out))
            elif fine:
                got.append(_int64_array(out) if how == "root" else out)
            else:
                bounds = np.empty(2 * len(rows), np.int64)
                self._take(rows, [(i, 2, bounds)], workers)
                got.append(_convert(self._text(rows, bounds), how))
        return got


def _int64_array(values: np.ndarray) -> pa.Array:
    """An int64 numpy array as an Arrow one, zero-copy (pa.array would first import pandas to check for
    its types: half a second on a first parse)."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _pieces_of(n: int, pieces: int) -> list[tuple[int, int]]:
    """0..n cut into `pieces` about equal, non-empty ranges."""
    cuts = sorted({n * k // max(1, pieces) for k in range(pieces)} | {n})
    return list(pairwise(cuts)) or [(0, 0)]


@dataclass
class _Scan:
    """The classified lines of a text: table rows (tokenized) and the structure around them."""

    rows: _ArrowRows | _NativeRows
    structure: _Structure

    @classmethod
    def of(cls, data: bytes | memoryview) -> _Scan:
        """Scan one piece with pyarrow kernels."""
        lines, first = _clean_lines(data)
        is_data = _is_digit(first)
        other = np.flatnonzero(~is_data & (first != 0))
        rows = lines.filter(pa.array(is_data))
        split = pc.ascii_split_whitespace(rows)
        offsets = split.offsets.to_numpy()
        hashed = np.flatnonzero(first[other] == ord("#"))
        rank = pc.struct_field(pc.extract_regex(lines.take(pa.array(other[hashed])), _RANK_PATTERN), 0)
        is_rank = np.zeros(len(other), bool)
        is_rank[hashed[_bools(rank.is_valid())]] = True
        candidates = other[~is_rank]
        kind, told = _kinds(lines.take(pa.array(candidates)))
        keep = kind != _NONE
        kept = candidates[keep]
        before = np.cumsum(is_data)
        structure = _Structure.read(lines.take(pa.array(kept)), kind[keep], told[keep],
                                    np.append(before[kept], before[-1] if len(before) else 0),
                                    pc.cast(rank.drop_null(), pa.int64()).to_numpy(),
                                    np.searchsorted(other[is_rank], np.append(kept, len(lines))))
        return cls(_ArrowRows(rows, [split.flatten()], np.zeros(1, np.int64), offsets[:-1] - offsets[0],
                              np.diff(offsets)), structure)

    @classmethod
    def native(cls, text: str, address: int, a: int, b: int) -> _Scan | None:
        """Scan text[a:b] with the C scanner (None where the text is not plain ASCII, or has timestamps).
        `address`: where the ASCII text's bytes are."""
        most = _NATIVE.count_lines(address, a, b) + 1
        other_off = np.empty(most + 1, np.int64)
        other_buf = np.empty(b - a, np.uint8)
        kind, told, rows, ranks, start, end, lengths, rank = (np.empty(most, np.int64) for _ in range(8))
        counts = np.empty(3, np.int64)
        if _NATIVE.scan_lines(address, a, b, *map(_ptr, (other_off, other_buf, kind, told, rows, ranks, start,
                                                        end, lengths, rank, counts))) < 0:
            return None
        n, n_rows, n_ranks = counts.tolist()
        offsets = other_off[:n + 1]
        lines = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(other_buf[:offsets[-1]]))
        structure = _Structure.read(lines, kind[:n], told[:n] != 0, np.append(rows[:n], n_rows),
                                    rank[:n_ranks], np.append(ranks[:n], n_ranks))
        return cls(_NativeRows(text, address, start[:n_rows], end[:n_rows], lengths[:n_rows]), structure)

    @classmethod
    def join(cls, parts: list[_Scan]) -> _Scan:
        """One scan of consecutive pieces of a text."""
        rows = type(parts[0].rows).join([p.rows for p in parts])  # type: ignore[arg-type]
        return cls(rows, _Structure.join([p.structure for p in parts]))


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def _load_native() -> ctypes.CDLL | None:
    """The C scanner (_fastscan.c) that `pip install` builds beside this file; None where it was not built
    (no compiler): the pyarrow scan then does all the work."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = Path(__file__).with_name("_fastscan" + suffix)
        if path.exists():
            lib = ctypes.CDLL(str(path))
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            lib.count_lines.argtypes = [ptr, i64, i64]
            lib.count_lines.restype = i64
            lib.scan_lines.argtypes = [ptr, i64, i64] + [ptr] * 11
            lib.scan_lines.restype = i64
            lib.take_columns.argtypes = [ptr, ptr, ptr, i64, i64, ptr, ptr, ptr, ptr]
            lib.take_columns.restype = None
            lib.gather.argtypes = [ptr, ptr, i64, ptr, ptr]
            lib.gather.restype = None
            return lib
    return None


_NATIVE = _load_native()
_AS_UTF8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize if sys.implementation.name == "cpython" else None
if _AS_UTF8 is not None:
    _AS_UTF8.argtypes = [ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t)]
    _AS_UTF8.restype = ctypes.c_void_p
_PIECE_BYTES = 8 << 20  # below this a thread costs more than it saves


def _pieces(data: str | bytes, pieces: int) -> list[tuple[int, int]]:
    """The bounds of `data` cut at line ends into `pieces` about equal parts (fewer where it has too few
    lines)."""
    newline = "\n" if isinstance(data, str) else b"\n"
    cuts = [0]
    for k in range(1, pieces):
        end = data.find(newline, max(cuts[-1], len(data) * k // pieces))  # type: ignore[arg-type]
        if end < 0:
            break
        cuts.append(end + 1)
    cuts.append(len(data))
    return [(a, b) for a, b in pairwise(cuts) if b > a] or [(0, len(data))]


def _workers(size: int) -> int:
    """One thread per core (up to 4) that has 8 MB of text to work on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores, size // _PIECE_BYTES))


def _scan(text: str, workers: int) -> _Scan:
    """Scan a text in pieces, one thread each (the C scanner and the kernels release the GIL, so the
    pieces run side by side): ASCII text with the C scanner where it is built and takes the text, in place;
    anything else encoded and scanned with pyarrow's kernels."""
    if _NATIVE is not None and text.isascii() and (address := _address(text)):
        scans = _map(lambda bounds: _Scan.native(text, address, *bounds), _pieces(text, workers), workers)
        if all(s is not None for s in scans):
            return scans[0] if len(scans) == 1 else _Scan.join(scans)  # type: ignore[arg-type]
    data = text.encode("utf-8", "replace")  # a lone surrogate (from errors="surrogateescape") becomes "?"
    view = memoryview(data)
    parsed = _map(lambda bounds: _Scan.of(view[bounds[0]:bounds[1]]), _pieces(data, workers), workers)
    return parsed[0] if len(parsed) == 1 else _Scan.join(parsed)


def _address(text: str) -> int | None:
    """Where an ASCII str keeps its bytes, read in place (CPython: the UTF-8 form of a compact ASCII str
    is its own buffer, so nothing is copied; encoding 100 MB would take a tenth of the parse). None
    elsewhere."""
    return _AS_UTF8(text, ctypes.byref(ctypes.c_ssize_t())) if _AS_UTF8 is not None else None


# ---- table rows: from token columns to arrays ------------------------------------------------------

@dataclass
class _Tables:
    """The tables of a scan, in order; they tile its data rows (table k is rows lo[k]:hi[k])."""

    run: np.ndarray  # the run each table belongs to
    layout: np.ndarray  # index into `layouts` (-1: no header before it, or one that could not be read)
    layouts: list[_Layout | None]
    lo: np.ndarray
    hi: np.ndarray


def _floats(cells: pa.Array, optional: bool) -> np.ndarray | None:
    """Cells as float64; an optional column (#wrong, error) gives NaN for N/A, a required one None."""
    try:
        return pc.cast(cells, pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        if not optional:
            return None
        return np.array([np.nan if v is None else v for v in map(_number, cells.to_pylist())], np.float64)


def _convert(cells: pa.Array, how: str) -> Any:
    """One column of cells as `how` says: "int" and "float" (None if a cell is not a number), "optional"
    (float, NaN for N/A), "root" (int, None for a non-rank cell) or "text" (as it is)."""
    if how == "text":
        return cells
    if how == "optional" or how == "float":
        return _floats(cells, optional=how == "optional")
    try:
        cast = pc.cast(cells, pa.int64())
    except pa.ArrowInvalid:
        return None if how == "int" else pa.array([_root(t) for t in cells.to_pylist()], pa.int64())
    return cast.to_numpy() if how == "int" else cast


def _map(fn: Callable[[Any], Any], items: list[Any], workers: int) -> list[Any]:
    """`fn` over `items`, on `workers` threads where there is more than one (for kernels, which release the
    GIL)."""
    if workers < 2 or len(items) < 2:
        return list(map(fn, items))
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def _to_columns(scan: _Scan, rows: np.ndarray, layout: _Layout, workers: int) -> _Columns | None:
    """Convert full-width rows column by column (the columns side by side on `workers` threads); None if a
    required cell is not a number."""
    text = [(c, layout.prefix.index(c)) for c in ("type", "redop", "root") if c in layout.prefix]
    jobs = [(0, "int"), (1, "int")] + [(i, "root" if c == "root" else "text") for c, i in text]
    for group in layout.groups:
        jobs += [(i, "float") for i in group[:3]] + [(i, "optional") for i in group[3:] if i is not None]
    got = dict(zip(jobs, scan.rows.convert(rows, jobs, workers)))
    if any(v is None for v in got.values()):
        return None
    none = np.full(len(rows), np.nan)
    values = [got[(i, "float")] if k < 3 else none if i is None else got[(i, "optional")]
              for group in layout.groups for k, i in enumerate(group)]
    return _Columns(got[(0, "int")], got[(1, "int")], {c: got[(i, "root" if c == "root" else "text")]
                                                        for c, i in text}, tuple(values))


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


def _fill(tables: _Tables, scan: _Scan, results: list[NcclResult], workers: int) -> None:
    """Give every table its rows, in table order: full-width tables converted in bulk per layout, the
    others (cut-off or in-place-only lines, non-numeric cells) line by line."""
    if not len(tables.lo):
        return
    shortest = np.minimum.reduceat(scan.rows.lengths, tables.lo)
    longest = np.maximum.reduceat(scan.rows.lengths, tables.lo)
    layouts, layout = list(tables.layouts), tables.layout.copy()
    for tokens in np.unique(longest[layout < 0]).tolist():  # no header: the layout a row's width implies
        layout[(layout < 0) & (longest == tokens)] = len(layouts)
        layouts.append(_fallback_layout(tokens))
    width = np.array([-1 if lay is None else lay.width for lay in layouts])[layout]
    bulk = (shortest == longest) & (longest == width)
    parts: list[tuple[_Stats, list[NcclRow] | _Block] | None] = [None] * len(layout)
    careful = np.flatnonzero(~bulk & (width > 0)).tolist()
    row_layout = np.repeat(np.where(bulk, layout, -1), tables.hi - tables.lo)
    for g in np.unique(layout[bulk]).tolist():
        members = np.flatnonzero(bulk & (layout == g))
        columns = _to_columns(scan, np.flatnonzero(row_layout == g), layouts[g], workers)
        if columns is None:  # a non-numeric cell somewhere: these tables go the careful way
            careful += members.tolist()
            continue
        bounds = np.concatenate([[0], np.cumsum(tables.hi[members] - tables.lo[members])])
        edges = bounds.tolist()
        for k, stats, a, b in zip(members.tolist(), _stats(columns, bounds), edges[:-1], edges[1:]):
            parts[k] = (stats, _Block(columns, a, b))
    for k in careful:
        parts[k] = _careful(layouts[layout[k]], scan.rows.lines(tables.lo[k], tables.hi[k]))
    for j, part in zip(tables.run.tolist(), parts):
        if part is not None and part[0].rows:
            results[j]._add(*part)


def _careful(layout: _Layout, lines: list[str]) -> tuple[_Stats, list[NcclRow]]:
    rows = _rows_one_by_one(lines, layout)
    return _Stats.of(rows), rows


def _fallback_layout(tokens: int) -> _Layout | None:
    header = _FALLBACK_LAYOUTS.get(tokens)
    return _Layout.from_columns(tuple(header.split())) if header else None


# ---- runs: the structural lines cut into nccl-tests runs -------------------------------------------

def _run_starts(scan: _Structure) -> np.ndarray:
    """The structural line each run starts at (run 0 at line 0, and it also owns the rows before it).
    A table header, config or version line starts a new run once the current run has data rows (that is,
    rows came after the opening line before it); a config line also does when the run already has a
    (non-empty) config: the config line before it had values and no run started in between."""
    opening = np.flatnonzero(np.isin(scan.kind, (HEADER, CONFIG, TESTS_VERSION)))
    by_rows = np.diff(scan.rows_before[opening], prepend=0) > 0
    config = np.flatnonzero(scan.kind[opening] == CONFIG)
    started = np.cumsum(by_rows)
    had_values = np.array([bool(scan.value[k]) for k in opening[config[:-1]].tolist()], bool)
    by_config = np.zeros(len(opening), bool)
    by_config[config[1:]] = had_values & (started[config[1:] - 1] == started[config[:-1]])
    return np.concatenate([[0], opening[by_rows | by_config]])


def _ranks(scan: _Structure, starts: np.ndarray) -> list[int | None]:
    """Per run: one more than the highest rank its device list names (None without a device list)."""
    bounds = np.append(scan.ranks_before[starts], scan.ranks_before[-1])
    bounds[0] = 0
    ranks: list[int | None] = [None] * len(starts)
    listed = np.flatnonzero(np.diff(bounds) > 0)
    if len(listed):
        for j, top in zip(listed.tolist(), np.maximum.reduceat(scan.rank, bounds[listed]).tolist()):
            ranks[j] = top + 1
    return ranks


def _tables(scan: _Structure, starts: np.ndarray, run_of: np.ndarray) -> _Tables:
    """The data rows cut at every header, footer and run start: each piece is one table of the run it
    falls in, read with the layout of the last header before it."""
    kind = scan.kind
    cuts = np.union1d(np.flatnonzero((kind == HEADER) | (kind == AVG)), starts[1:])
    edges = np.concatenate([[0], scan.rows_before[cuts], scan.rows_before[-1:]])
    headers = np.flatnonzero(kind == HEADER).tolist()
    read = {text: _Layout.from_columns(tuple(text.split())) for text in {scan.value[k] for k in headers}}
    layouts = list({lay: None for lay in read.values() if lay is not None})
    number = {lay: i for i, lay in enumerate(layouts)}
    index = {text: number.get(lay, -1) for text, lay in read.items()}  # header text -> layout (hashed once)
    header_layout = np.array([index[scan.value[k]] for k in headers] + [-1], dtype=np.int64)
    layout = header_layout[np.concatenate([[-1], np.searchsorted(headers, cuts, "right") - 1])]
    some = np.diff(edges) > 0
    return _Tables(np.concatenate([[0], run_of[cuts]])[some], layout[some], layouts, edges[:-1][some],
                   edges[1:][some])


def _assemble(scan: _Scan, workers: int) -> list[NcclResult]:
    """Every run with its fields, footer values and tables; the last of several lines of a kind wins."""
    structure = scan.structure
    kind, value = structure.kind, structure.value
    starts = _run_starts(structure)
    run_of = np.searchsorted(starts, np.arange(len(kind)), "right") - 1

    runs = len(starts)

    def said(k: int) -> zip[tuple[int, Any]]:
        at = np.flatnonzero(kind == k).tolist()
        return zip(run_of[at].tolist(), [value[i] for i in at])

    def last(k: int, keep: Callable[[Any], bool] = lambda v: True) -> list[Any]:
        """Per run, what its last line of kind k that `keep`s says (None if none)."""
        out = [None] * runs
        for j, v in said(k):
            if keep(v):
                out[j] = v
        return out

    config = [c if c is not None else {} for c in last(CONFIG)]
    network: list[str | None] = [None] * runs
    evidence: list[list[str]] = [[] for _ in range(runs)]
    for j, (net, told) in said(INFO):
        if net:
            network[j] = net
        if told and len(evidence[j]) < 8:
            evidence[j].append(told)
    errors: list[list[str]] = [[] for _ in range(runs)]
    for j, error in said(ERROR):
        errors[j].append(error)
    results = list(map(NcclResult, last(AVG), last(OUT_OF_BOUNDS), _ranks(structure, starts),
                       last(TESTS_VERSION, bool), last(NCCL_VERSION, bool), config, network, evidence, errors))
    _fill(_tables(structure, starts, run_of), scan, results, workers)
    return [r for r in results if r._parts or r.errors or r.config]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Parsing allocates ~300k small containers per 100 MB (what the structural lines say, the results)
    and no cycles; with the cyclic collector on, it walks the growing heap again and again (~60 passes,
    a tenth of the parse)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_all(text: str, workers: int | None = None) -> list[NcclResult]:
    """Every nccl-tests run in a text stream, in order. `workers`: threads for the kernels (default: one
    per core, up to 4, with 8 MB of text each; the tests force several on small texts)."""
    workers = workers or _workers(len(text))
    with _gc_paused():
        return _assemble(_scan(text, workers), workers)


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
