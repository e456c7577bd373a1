"""nccl-tests parser speed on ~100 MB of concatenated real logs (target: > 50 MB/s).

Also prints, as a yardstick of the machine, the rate of a bare `str.split()` over the same text: no
Python tokenizer can beat it, so the ratio of the two is what carries over to another machine.

    python benchmarks/parse_nccl.py [../shared/data/nccl-tests]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nccl.parse import parse_all  # noqa: E402

TARGET_MB = 100


def corpus(data_dir: Path) -> str:
    one = "".join(p.read_text() + "\n" for p in sorted(data_dir.glob("sample_*.txt")))
    return one * (TARGET_MB * 2**20 // len(one) + 1)


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else root.parent / "shared" / "data" / "nccl-tests"
    text = corpus(data)
    mb = len(text.encode()) / 2**20
    rates, results, split_rates = [], 0, []
    for _ in range(3):
        t0 = time.perf_counter()
        parsed = parse_all(text)
        statuses = {r.status for r in parsed}  # touches every row (Avg check), as a consumer would
        rates.append(mb / (time.perf_counter() - t0))
        results = len(parsed)
        t0 = time.perf_counter()
        text.split()
        split_rates.append(mb / (time.perf_counter() - t0))
    rate, split_rate = statistics.median(rates), statistics.median(split_rates)
    print(f"parsed {mb:.0f} MB ({results} nccl-tests runs, statuses {sorted(statuses)}): median {rate:.0f} MB/s, "
          f"min {min(rates):.0f} MB/s over 3 passes (target > 50 MB/s); bare str.split() of the same text "
          f"{split_rate:.0f} MB/s, parser/split ratio {rate / split_rate:.2f}")
