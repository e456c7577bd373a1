"""nccl-tests parser speed on ~100 MB of concatenated real logs (target: > 50 MB/s).

The timed work is parse_all plus every result's status (which reads every row's busbw and #wrong, as
the summary does). Rows become NcclRow objects only when read, so the rate with all 1M rows built is
printed beside it. The parser scans with its C scanner (nccl/_fastscan.c, built by `pip install -e .`)
where it is built, else with pyarrow kernels; both are timed (the pyarrow one with the C scanner switched
off), and the line says which one the headline rate is. Also prints, as a yardstick of the machine, the
rate of a bare `str.split()` over the same text, measured in the same passes; the ratio of the two is what
carries over to another machine.

    python benchmarks/parse_nccl.py [../shared/data/nccl-tests]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nccl.parse as parse_module  # noqa: E402

TARGET_MB = 100
PASSES = 3


def corpus(data_dir: Path) -> str:
    one = "".join(p.read_text() + "\n" for p in sorted(data_dir.glob("sample_*.txt")))
    return one * (TARGET_MB * 2**20 // len(one) + 1)


def timed_parse(text: str, mb: float) -> tuple[float, set[str], int]:
    t0 = time.perf_counter()
    parsed = parse_module.parse_all(text)
    statuses = {r.status for r in parsed}  # every row's busbw and #wrong, as the summary reads them
    return mb / (time.perf_counter() - t0), statuses, len(parsed)


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else root.parent / "shared" / "data" / "nccl-tests"
    text = corpus(data)
    mb = len(text.encode()) / 2**20
    native = parse_module._NATIVE
    scanner = "C scanner" if native is not None else "pyarrow scan (C scanner not built)"
    rates, arrow_rates, row_rates, split_rates = [], [], [], []
    for _ in range(PASSES):
        rate, statuses, results = timed_parse(text, mb)
        rates.append(rate)
        t0 = time.perf_counter()
        rows = sum(len(r.rows) for r in parse_module.parse_all(text))
        row_rates.append(mb / (time.perf_counter() - t0))
        parse_module._NATIVE = None
        arrow_rates.append(timed_parse(text, mb)[0])
        parse_module._NATIVE = native
        t0 = time.perf_counter()
        text.split()
        split_rates.append(mb / (time.perf_counter() - t0))
    rate, split_rate = statistics.median(rates), statistics.median(split_rates)
    print(f"parsed {mb:.0f} MB ({results} nccl-tests runs, statuses {sorted(statuses)}) with the {scanner}: "
          f"median {rate:.1f} MB/s, min {min(rates):.1f} MB/s over {PASSES} passes (target > 50 MB/s); "
          f"with all {rows} rows built as NcclRow: median {statistics.median(row_rates):.1f} MB/s; "
          f"pyarrow scan alone: median {statistics.median(arrow_rates):.1f} MB/s; bare str.split() of the same "
          f"text {split_rate:.0f} MB/s, parser/split ratio {rate / split_rate:.2f}")
