"""One nccl-tests run as its output states it: its rows (one per message size and placement), its config,
versions, network and errors (what bench/probes/parse.py reads from the text or the `-J` JSON), and what
they imply: the collective, the ranks, the mean bus bandwidth against the printed Avg, and the status.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from bench.probes.command import collective_of_binary

STATUSES = ("ok", "wrong_results", "truncated", "failed")
PLACEMENTS = ("out-of-place", "in-place")
DTYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "half": 2, "bfloat16": 2, "float": 4, "int32": 4, "int": 4,
               "uint32": 4, "double": 8, "int64": 8, "uint64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1}
_AVG_TOLERANCE_ABS = 0.011  # busbw is printed with 2 decimals; the Avg line with more
_AVG_TOLERANCE_REL = 0.002


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
    avg_busbw_printed: float | None = None
    out_of_bounds: int | None = None
    ranks: int | None = None  # from the device ("Rank N") lines
    tests_version: str | None = None
    nccl_version: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    network: str | None = None  # NCCL's "Using network X"
    transport_evidence: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    groups: int | None = None  # operations run side by side (NCCL_TESTS_SPLIT); bandwidths are per group
    nics: int | None = None  # NICs aws-ofi-nccl found ("found N nics"), the most any rank reported
    rows: list[NcclRow] = field(default_factory=list)  # one per message size and placement, in table order
    binary: str | None = None  # the binary as nccl-tests 2.17+ names it ("Collective test starting")

    @property
    def collective(self) -> str | None:
        """all_reduce, all_gather or reduce_scatter: the binary's name where the output has it (2.17+);
        else the rows': a gather or reduce-scatter prints each rank's share as its count (size / (element
        bytes x ranks)), an all-reduce the whole tensor; of the two, the gather reduces nothing (redop
        "none", or no redop column before 2.13). None where no row tells."""
        if self.binary:
            return collective_of_binary(self.binary)
        shares = self.shares_per_rank()
        if shares is None:
            return "all_gather" if any(r.redop == "none" for r in self.rows) else None
        if shares < 2:
            return "all_gather" if any(r.redop == "none" for r in self.rows) else "all_reduce"
        return "all_gather" if all(r.redop in (None, "none") for r in self.rows) else "reduce_scatter"

    def shares_per_rank(self) -> int | None:
        """size / (count x element bytes) on the largest row: the ranks of a gather or reduce-scatter (whose
        count is one rank's share), 1 for an all-reduce."""
        row = max((r for r in self.rows if r.count > 0 and r.dtype in DTYPE_BYTES), key=lambda r: r.size,
                  default=None)
        return round(row.size / (row.count * DTYPE_BYTES[row.dtype])) if row else None

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
        printed, mean = self.avg_busbw_printed, self.avg_busbw
        if printed is None or mean is None:
            return False
        return abs(mean - printed) <= _AVG_TOLERANCE_ABS + _AVG_TOLERANCE_REL * printed

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
        """Ranks from the device list, else a gather's or reduce-scatter's count column, else busbw/algbw
        on the largest message: f(n-1)/n, f = 2 for an all-reduce (assumed where nothing names it), 1 for
        a gather or reduce-scatter."""
        if self.ranks:
            return self.ranks
        shares = self.shares_per_rank()
        if self.collective in ("all_gather", "reduce_scatter") and shares and shares > 1:
            return shares
        big = max((r for r in self.rows if r.algbw > 0), key=lambda r: r.size, default=None)
        if big is None:
            return None
        f = 2.0 if self.collective in (None, "all_reduce") else 1.0
        ratio = big.busbw / big.algbw
        return round(f / (f - ratio)) if ratio < f - 0.001 else None

    @property
    def network_measurement(self) -> bool:
        """False for one rank: busbw is 0 by definition, nothing crossed a link."""
        return bool(self.rows) and self.inferred_ranks() != 1 and any(r.busbw > 0 for r in self.rows)
