"""nccl-tests parser speed at the sizes users have: one full sweep output, and a whole efa_probe study.

1. A full sweep up to 16 GiB: the real sample_01.txt (0 B - 1 GiB, 2 nodes under mpirun tags, with its
   NCCL INFO lines, 10 KB) with its largest row doubled up to 16 GiB (35 sizes). Target: under 2 ms.
2. The logs of an efa_probe study, 5 node counts x 4 EFA counts x 3 repeats = 60 outputs, here the 12 real
   samples cycled to 60 files, each parsed on its own as the collector does. Target: under 0.2 s.

Medians of repeated passes, measured side by side in one process.

    python benchmarks/parse_nccl.py [../shared/data/nccl-tests] [--quick]   # quick: 3 passes, not 50
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.probes.parse import parse, strip_prefix  # noqa: E402

PASSES = 50


def full_sweep(data_dir: Path) -> str:
    """sample_01.txt with rows after its 1 GiB one up to 16 GiB (sizes and counts doubled, times as
    measured)."""
    lines = (data_dir / "sample_01.txt").read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if strip_prefix(line).strip()[:1].isdigit())
    prefix = lines[last][:len(lines[last]) - len(strip_prefix(lines[last]))]
    tokens = strip_prefix(lines[last]).split()
    for k in range(1, 5):
        tokens[0], tokens[1] = str(2 * int(tokens[0])), str(2 * int(tokens[1]))
        lines.insert(last + k, prefix + "  ".join(tokens))
    return "\n".join(lines) + "\n"


def median_s(work, passes: int = PASSES) -> float:
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", nargs="?", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared/data/nccl-tests")
    parser.add_argument("--quick", action="store_true", help="3 passes instead of 50")
    args = parser.parse_args()
    passes = 3 if args.quick else PASSES
    data_dir = args.data_dir
    sweep = full_sweep(data_dir)
    result = parse(sweep)
    assert result.rows[-1].size == 16 * 2**30 and len(result.rows) == 2 * 35  # out-of-place + in-place
    samples = [p.read_text() for p in sorted(data_dir.glob("sample_*.txt"))]
    study = [samples[i % len(samples)] for i in range(60)]
    if len(samples) != 12:  # the study is stated for the 12 real samples cycled to 60 outputs
        sys.exit(f"{data_dir} holds {len(samples)} sample_*.txt, not the 12 the study is built from")
    one = median_s(lambda: parse(sweep), passes)
    whole = median_s(lambda: [parse(t).status for t in study], passes=min(10, passes))
    print(f"full 0 B - 16 GiB sweep ({len(sweep) / 1024:.1f} KB, {len(result.rows)} rows): median "
          f"{one * 1e3:.2f} ms per parse (target < 2 ms)")
    print(f"efa_probe study, 60 outputs ({sum(map(len, study)) / 1024:.0f} KB): median {whole * 1e3:.1f} ms "
          f"(target < 200 ms)")


if __name__ == "__main__":
    main()
