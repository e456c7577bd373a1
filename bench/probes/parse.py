"""The one parser of nccl-tests output: text tables of every version, and the `-J` JSON file, each read into
NcclResult (bench/probes/result.py: the rows, and what they imply); and the versions a log printed.

Text layouts seen in the wild (fixtures in ../shared/data/nccl-tests):
  before 2.13   size count type redop time algbw busbw error  (x2: out-of-place, in-place)
  2.13+         size count type redop root time algbw busbw #wrong  (x2)
  2.17+         the same with a version header and wider columns

It reads line by line. Each line first loses its launcher prefix (`strip_prefix`), then its first
character decides its kind: `#` lines are headers, config, versions, device ("Rank") lines and footers;
a digit starts a table row; anything else may be an NCCL INFO line (network, transport, NIC count), the
NCCL version or an error. A table's column layout comes from its own header; an excerpt without one
falls back to the layout its token count implies. A prefix no launcher here writes (a log shipper's
timestamp and pod, any text) is read past too: a `#` line is found where its known text begins
(`comment_start`), and once a table header has given the layout, a row is its line's last tokens when
they make one (`_Reader.row_tokens`). A stream may hold several runs (concatenated logs):
a header, config or version line after table rows starts the next one. Real outputs are a few KB; this
parses a whole 8 B - 16 GiB sweep in well under a millisecond (benchmarks/parse_nccl.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from bench.probes.result import PLACEMENTS, NcclResult, NcclRow

# Launcher prefixes, any of them, in this order: ANSI colours anywhere, an `mpirun --tag-output` tag, a
# `kubectl logs --timestamps` stamp, an `srun -l` label of any width.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:)?"
                     r"(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? )?"
                     r"(?:\s*\d+: )?")
# mpirun tags each piece a rank's output arrives in, not each line: a row that came in two reads carries a
# second tag in its middle ("   134217728    [1,0]<stdout>:  33554432  float ...", seen under Open MPI 4.1).
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(r"^#+\s*Rank\s+(\d{1,18})(?:\s|$)")  # "#  Rank  3 Group  0 Pid ..." device lines
_GROUP = re.compile(r"\sGroup\s+(\d{1,9})\s")  # NCCL_TESTS_SPLIT: each group runs (and reports) its own
_CONFIG = re.compile(r"(nThread|nGpus|minBytes|maxBytes|step|warmup iters|agg iters|iters|validation|graph)"
                     r":? (\S+)")
_ERROR = re.compile(r"NCCL failure|Test NCCL failure|Test failure|CUDA failure|Segmentation fault|"
                    r"Bus error|noticed that process rank|srun: error|# error:|ncclInternalError|"
                    r"ncclSystemError|ncclRemoteError")
_NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$")
_TRANSPORT_HINT = re.compile(r"NCCL INFO (?:NET/OFI Selected [Pp]rovider is \S+|NET/Socket :|NET/IB :|"
                             r".* via (?:NET|P2P|SHM)/\S+|NET/OFI Using aws-ofi-nccl \S+)")
# 2.17+ names the binary before its table: "# Collective test starting: all_gather_perf"
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_NICS = re.compile(r"\(found (\d+) nics\)")  # aws-ofi-nccl: "Selected Provider is efa (found 4 nics)"
# What NCCL prints of itself with NCCL_DEBUG=INFO or VERSION ("NCCL version 2.12.7+cuda11.4" on its own line
# before 2.14 or so, "host:pid:tid [0] NCCL INFO NCCL version 2.26.2+cuda12.2" since), and the plugin's
# "NET/OFI Initializing aws-ofi-nccl 1.14.0" ("NET/OFI Using aws-ofi-nccl 1.5.0aws" before 1.7)
_NCCL_VERSION = re.compile(r"\bNCCL version (\d\S*)")
_OFI_VERSION = re.compile(r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\d\S*)")
# The comment lines the reader takes something from, as their text begins after "#" (comment_start)
_KNOWN_COMMENTS = re.compile(r"#+\s*(?:Rank\s|Avg bus bandwidth|Out of bounds values|nThread|"
                             r"nccl-tests version|Collective test starting|size\s+count\b)")
_FALLBACK_LAYOUTS = {  # token count of a full row -> header columns
    13: "size count type redop root time algbw busbw #wrong time algbw busbw #wrong",
    12: "size count type redop time algbw busbw error time algbw busbw error",
    11: "size count type time algbw busbw error time algbw busbw error",
}
_FALLBACK_WIDTHS = tuple(_FALLBACK_LAYOUTS)


def strip_prefix(line: str) -> str:
    """Remove launcher prefixes (mpirun tag, timestamp, srun label, ANSI colours) from one log line."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    line = line[_PREFIX.match(line).end():]
    return _TAG.sub("", line) if ">:" in line else line


def comment_start(line: str) -> int | None:
    """Where an nccl-tests comment line the reader knows begins inside a line with an unknown prefix (the
    first `#` that starts one: a `#` in the prefix is passed over); None if there is none."""
    at = line.find("#")
    while at >= 0:
        if _KNOWN_COMMENTS.match(line, at):
            return at
        at = line.find("#", at + 1)
    return None


def printed_versions(text: str) -> dict[str, list[str]]:
    """The NCCL and aws-ofi-nccl versions a log stream printed (every distinct one, in order: nodes that
    differ show as two)."""
    out: dict[str, list[str]] = {"nccl": [], "aws_ofi_nccl": []}
    for key, pattern in (("nccl", _NCCL_VERSION), ("aws_ofi_nccl", _OFI_VERSION)):
        for found in pattern.finditer(text):
            if found.group(1) not in out[key]:
                out[key].append(found.group(1))
    return out


@dataclass(frozen=True)
class _Layout:
    """Column positions of a data row, read once per distinct table header."""

    prefix: tuple[str, ...]  # the columns before the first time column, in order
    groups: tuple[tuple[int, int, int, int | None, int | None], ...]  # time, algbw, busbw, #wrong, error
    group_len: int

    def widths(self) -> tuple[int, int]:
        """A row's token count: both placements, and in-place only (trace replay)."""
        return len(self.prefix) + 2 * self.group_len, len(self.prefix) + self.group_len


@lru_cache(maxsize=64)
def _layout(columns: tuple[str, ...]) -> _Layout | None:
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


def _word(text: str, i: int) -> str | None:
    """The i-th word of a line (None when a cut log lost it)."""
    words = text.split()
    return words[i] if len(words) > i else None


def _after_colon(body: str) -> str:
    """The first word after the colon of a footer line ("" when a cut log lost it)."""
    words = body.partition(":")[2].split(None, 1)
    return words[0] if words else ""


def _root(token: str) -> int | None:
    """The root column: a rank, or -1 for collectives without one; None for anything else."""
    return int(token) if token.lstrip("-").isdecimal() else None  # isdigit() takes "²", which int() does not


def _rows(tokens: list[str], layout: _Layout) -> list[NcclRow]:
    """The out-of-place and in-place rows of one table line (none if the line is cut short or not numbers)."""
    if len(tokens) < 2 or not (tokens[0].isdecimal() and tokens[1].isdecimal()):
        return []
    body = len(tokens) - len(layout.prefix)
    if body == 2 * layout.group_len:
        groups = list(zip(PLACEMENTS, layout.groups))
    elif body == layout.group_len:  # in-place only (trace replay): its columns sit where out-of-place's do
        groups = [("in-place", layout.groups[0])]
    else:
        return []
    cell = dict(zip(layout.prefix, tokens))
    root = _root(cell["root"]) if "root" in cell else None
    out = []
    for placement, (ti, ai, bi, wi, ei) in groups:
        try:
            time_us, algbw, busbw = float(tokens[ti]), float(tokens[ai]), float(tokens[bi])
        except ValueError:
            return []
        out.append(NcclRow(int(tokens[0]), int(tokens[1]), cell.get("type", "?"), cell.get("redop"), root,
                           placement, time_us, algbw, busbw, _number(tokens[wi]) if wi is not None else None,
                           _number(tokens[ei]) if ei is not None else None))
    return out


class _Reader:
    """The state of one pass: the runs so far, the current table's lines and the layout they use."""

    def __init__(self) -> None:
        self.results = [NcclResult()]
        self.header: _Layout | None = None  # the last table header's layout, across runs (None: unreadable)
        self.table: list[list[str]] = []  # token lists of the current table's rows
        self.rows_since_opening = 0  # rows since the last header/config/version line
        self.last_config: dict[str, str] | None = None
        self.run_began_since_config = False
        self.top_rank: int | None = None

    @property
    def run(self) -> NcclResult:
        return self.results[-1]

    def end_table(self) -> None:
        """Read the rows gathered since the last cut with the header's layout, or the one their width
        implies."""
        if self.table:
            layout = self.header or _layout(tuple(_FALLBACK_LAYOUTS.get(max(len(t) for t in self.table),
                                                                        "").split()))
            if layout is not None:
                self.run.rows.extend(r for tokens in self.table for r in _rows(tokens, layout))
        self.table = []

    def open(self, kind: str, config: dict[str, str] | None = None) -> None:
        """A header, config or version line: a new run once rows came since the last such line, or at a
        second config line (that had values) with no run begun in between."""
        by_config = (kind == "config" and bool(self.last_config) and not self.run_began_since_config)
        if self.rows_since_opening > 0 or by_config:
            self.end_table()
            self.run.ranks = None if self.top_rank is None else self.top_rank + 1
            self.results.append(NcclResult())
            self.top_rank = None
            self.run_began_since_config = self.run_began_since_config or self.rows_since_opening > 0
        self.rows_since_opening = 0
        if kind == "config":
            self.last_config, self.run_began_since_config = config, False

    def comment(self, line: str) -> None:
        body = line.lstrip("#").strip()
        if rank := _RANK.match(line):
            self.top_rank = max(self.top_rank or 0, int(rank.group(1)))
            if group := _GROUP.search(line):
                self.run.groups = max(self.run.groups or 1, int(group.group(1)) + 1)
        elif body.startswith("Avg bus bandwidth"):
            self.end_table()
            self.run.avg_busbw_printed = _number(_after_colon(body))
        elif body.startswith("Out of bounds values"):
            value = _after_colon(body)
            self.run.out_of_bounds = int(value) if value.isdecimal() else None
        elif body.startswith("nThread"):
            config = dict(_CONFIG.findall(body))
            self.open("config", config)
            self.run.config = config
        elif starting := _STARTING.search(body):
            self.open("version")
            self.run.binary = starting.group(1)
        elif body.startswith("nccl-tests version"):
            self.open("version")
            self.run.tests_version = _word(body, 2) or self.run.tests_version
        elif body.startswith("size") and " count" in body:
            self.open("header")
            self.end_table()
            self.header = _layout(tuple(body.split()))
        elif _ERROR.search(line):
            self.run.errors.append(line[:300])

    def other(self, line: str) -> None:
        if "NCCL INFO" in line:
            if network := _NETWORK.search(line):
                self.run.network = network.group(1)
            if _TRANSPORT_HINT.search(line) and len(self.run.transport_evidence) < 8:
                self.run.transport_evidence.append(line[-200:])
            if nics := _NICS.search(line):
                self.run.nics = max(self.run.nics or 0, int(nics.group(1)))
            if version := _NCCL_VERSION.search(line):
                self.run.nccl_version = version.group(1)
            return
        if version := _NCCL_VERSION.search(line):
            self.run.nccl_version = version.group(1)
        if _ERROR.search(line):
            self.run.errors.append(line[:300])

    def row_tokens(self, line: str) -> list[str] | None:
        """A table row at the end of a line whose prefix no launcher here writes: the last tokens that make
        a full row (or an in-place one) of the current header's layout, its size and count whole numbers
        and its type a name (float, int8); None without a header or where they make none."""
        layout, tokens = self.header, line.split()
        if layout is None:
            return None
        for width in layout.widths():
            row = tokens[-width:]
            cells = dict(zip(layout.prefix, row))
            if (len(tokens) > width and row[0].isdecimal() and row[1].isdecimal()
                    and cells.get("type", "x")[:1].isalpha() and _rows(row, layout)):
                return row
        return None

    def add_row(self, tokens: list[str]) -> None:
        self.table.append(tokens)
        self.rows_since_opening += 1

    def line(self, raw: str) -> None:
        line = strip_prefix(raw.strip()).strip()
        if line.startswith("#"):
            self.comment(line)
        elif "#" in line and (at := comment_start(line)) is not None:  # a prefix nobody here writes
            self.comment(line[at:])
        elif "NCCL INFO" in line:  # a host name may start with a digit
            self.other(line)
        elif not line:
            return
        elif line[:1].isdigit() and len(tokens := line.split()) in self.widths():
            self.add_row(tokens)  # a row (or, before any header, one an excerpt's width names)
        elif row := self.row_tokens(line):  # a row after a prefix nobody here writes
            self.add_row(row)
        elif self.header is not None and line[:1].isdigit() and tokens[0].isdecimal():
            self.add_row(tokens)  # a row cut short (a crash mid-write): dropped, but it ends what came before
        else:
            self.other(line)

    def widths(self) -> tuple[int, ...]:
        """The token counts a row may have: its header's, else those of the layouts without one."""
        return self.header.widths() if self.header is not None else _FALLBACK_WIDTHS

    def finish(self) -> list[NcclResult]:
        self.end_table()
        self.run.ranks = None if self.top_rank is None else self.top_rank + 1
        return [r for r in self.results if r.rows or r.errors or r.config]


NO_OUTPUT = "no nccl-tests output found"  # the error of a text that holds no nccl-tests run at all


def parse_all(text: str) -> list[NcclResult]:
    """Every nccl-tests run in a text stream, in order."""
    reader = _Reader()
    for line in text.splitlines():
        reader.line(line)
    return reader.finish()


def parse(text: str) -> NcclResult:
    """The (last) nccl-tests run in a text; an empty result (status failed) if there is none."""
    results = parse_all(text)
    return results[-1] if results else NcclResult(errors=[NO_OUTPUT])


def by_collective(text: str) -> dict[str, NcclResult]:
    """The last run of each collective in a text stream: a probe output that holds only some of them (a
    job that died after its first binary) is read for those it holds. Runs whose collective cannot be
    told are left out."""
    out: dict[str, NcclResult] = {}
    for result in parse_all(text):
        if result.collective:
            out[result.collective] = result
    return out


def parse_json(data: str | dict[str, Any]) -> NcclResult:
    """The `-J file.json` output of nccl-tests 2.17+ (keys from its util.cu)."""
    doc = json.loads(data) if isinstance(data, str) else data
    result = NcclResult()
    config = doc.get("config") or {}
    result.config = {k: str(v) for k, v in config.items() if k != "devices"}
    result.ranks = len(config.get("devices") or []) or None
    version = doc.get("nccl_version")
    if isinstance(version, int):  # NCCL_VERSION_CODE: major*10000 + minor*100 + patch (2.9+)
        result.nccl_version = f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    for entry in doc.get("results") or []:
        for placement, key in zip(PLACEMENTS, ("out_of_place", "in_place")):
            body = entry.get(key)
            if body:
                result.rows.append(NcclRow(
                    size=int(entry["size"]), count=int(entry["count"]), dtype=entry.get("type", "?"),
                    redop=entry.get("redop"), root=_root(str(entry.get("root")).strip()), placement=placement,
                    time_us=float(body.get("time", body.get("cpu_time"))), algbw=float(body["alg_bw"]),
                    busbw=float(body["bus_bw"]), wrong=body.get("nwrong")))
    result.out_of_bounds = (doc.get("out_of_bounds") or {}).get("count")
    result.avg_busbw_printed = (doc.get("average_bus_bandwidth") or {}).get("bandwidth")
    result.errors = [e for e in doc.get("errors") or [] if e]
    return result
