"""Each transport's fitted figures (bench/predict/network.py DEFAULTS) against published nccl-tests tables
(benchmarks/nccl_model.py reads them). `--fit` prints, per transport, the latency of one network hop and
the multi-node bandwidth's fraction of NCCL's model that fit its multi-node tables best (those `--split`
does not set aside). `--cv` prints each fitting procedure's loss on every cluster left out of its fit in
turn (leave one system out): how a fitted figure does on a cluster it was not fitted to.

    python benchmarks/nccl_transports.py --fit [--tables DIR] [--split FILE]
    python benchmarks/nccl_transports.py --cv [--tables DIR] [--split FILE]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nccl_model import (  # noqa: E402
    DEFAULT_TABLES,
    MIB,
    Measured,
    TableError,
    fabric_of,
    measured,
    modelled,
    read_index,
    read_split,
    transport,
)

from bench.core.fabric import Fabric  # noqa: E402
from bench.predict.collective import Calibration  # noqa: E402
from bench.predict.nccl_fit import priced  # noqa: E402

# The grid of a transport's fitted figures: the latency of one network hop (us), and the multi-node
# bandwidth's fraction of NCCL's model of it
HOP_US = (0.0, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 75.0, 100.0, 150.0, 200.0)
NET_BW = tuple(round(0.1 + 0.05 * i, 2) for i in range(25))

# One row as the fit prices it (nccl_fit.priced): bytes, NCCL's base latency us, us per us of hop latency,
# the bandwidth term us at net_bw 1, measured us.
Term = tuple[int, float, float, float, float]


def terms(m: Measured, fabric: Fabric) -> list[Term]:
    return priced(m.kind, [(r.size, r.time_us) for r in m.rows], m.nodes, m.gpus_per_node, fabric,
                  version=m.version, env=m.env)


def table_loss(rows: list[Term], cal: Calibration) -> float:
    """The issue's measure of a table in log terms: the mean over its two size bands (1 MiB and more, below)
    of the band's median |log(predicted / measured)|. Medians, so that a table's few odd rows, or one odd
    table's many rows, do not set a transport's figures."""
    assert cal.net_latency_us is not None
    logs = [(size, abs(math.log((base + per_hop * cal.net_latency_us + bw / cal.net_bw) / t)))
            for size, base, per_hop, bw, t in rows]
    bands = [[x for size, x in logs if size >= MIB], [x for size, x in logs if size < MIB]]
    return statistics.mean(statistics.median(b) for b in bands if b)


# What a transport's fit reads (the procedure leave-one-system-out chose, `cross_validate`): "hop", the
# hop latency alone at NCCL's bandwidth; "both", the hop latency and the bandwidth's fraction
FIGURES = {"infiniband": "hop"}
PROCEDURES = ("nccl", "hop", "both")  # "nccl": NCCL's published constants, nothing fitted


@dataclass(frozen=True)
class Fitted:
    """One multi-node table as a fit reads it: its cluster, its rows priced, and the latency its net plugin
    reports to NCCL (what "nccl" keeps)."""

    system: str
    rows: list[Term]
    plugin_us: float


def fitted_tables(directory: Path, entries: list[dict[str, Any]]) -> dict[str, list[Fitted]]:
    """Per transport, its multi-node tables among `entries`."""
    by: dict[str, list[Fitted]] = {}
    for entry in entries:
        fabric = fabric_of(entry)
        if (tr := transport(fabric, int(entry["nodes"]))) is not None and fabric.scale_out is not None:
            by.setdefault(tr, []).append(Fitted(str(entry.get("system") or entry["id"]),
                                                terms(measured(directory, entry), fabric),
                                                fabric.scale_out.latency_us))
    return by


def best(group: list[Fitted], procedure: str) -> Calibration:
    """The grid point of `procedure` with the least mean table_loss over `group`."""
    bandwidths = NET_BW if procedure == "both" else (1.0,)
    grid = [Calibration(net_latency_us=h, net_bw=b) for h in HOP_US for b in bandwidths]
    return min(grid, key=lambda cal: statistics.mean(table_loss(t.rows, cal) for t in group))


def loss(table: Fitted, cal: Calibration | None) -> float:
    """table_loss at `cal`; None: NCCL's constants (the plugin's latency, NCCL's bandwidth)."""
    return table_loss(table.rows, cal or Calibration(net_latency_us=table.plugin_us))


def fit(directory: Path, entries: list[dict[str, Any]]) -> dict[str, tuple[Calibration, int]]:
    """Per transport, the figures FIGURES names for it (hop and bandwidth unless named) that minimise the mean
    table_loss over its multi-node tables among `entries` (those not set aside): what network.DEFAULTS
    ships."""
    return {tr: (best(group, FIGURES.get(tr, "both")), len(group))
            for tr, group in sorted(fitted_tables(directory, entries).items())}


def cross_validate(directory: Path, entries: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per transport of two or more clusters, each procedure's mean table_loss over its tables, each table
    predicted by the figures fitted to the other clusters' tables (leave one system out): how a fitted
    figure does on a cluster it was not fitted to."""
    out = {}
    for tr, group in sorted(fitted_tables(directory, entries).items()):
        systems = sorted({t.system for t in group})
        if len(systems) < 2:
            continue
        losses: dict[str, list[float]] = {p: [] for p in PROCEDURES}
        for system in systems:
            rest = [t for t in group if t.system != system]
            cals = {p: None if p == "nccl" else best(rest, p) for p in PROCEDURES}
            for t in (t for t in group if t.system == system):
                for p in PROCEDURES:
                    losses[p].append(loss(t, cals[p]))
        out[tr] = {p: statistics.mean(v) for p, v in losses.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=DEFAULT_TABLES, help="the table directory")
    parser.add_argument("--split", type=Path, help="the held-out table ids, left out of every fit")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fit", action="store_true", help="print each transport's fitted figures")
    mode.add_argument("--cv", action="store_true",
                      help="per transport, each procedure's loss on clusters left out of its fit")
    args = parser.parse_args(argv)
    try:
        entries = read_index(args.tables)
        held_out = read_split(args.split)
        fitting = [e for e in entries if modelled(e) and str(e["id"]) not in held_out]
        if args.fit:
            for tr, (cal, n) in fit(args.tables, fitting).items():
                print(f"{tr}: {n} tables, hop latency {cal.net_latency_us:g} us, bandwidth x {cal.net_bw:g}"
                      f"{' (hop latency alone)' if FIGURES.get(tr) == 'hop' else ''}")
        else:
            for tr, by in cross_validate(args.tables, fitting).items():
                pick = min(by, key=by.__getitem__)
                print(f"{tr}: loss on clusters left out, " + ", ".join(f"{p} {v:.3f}" for p, v in by.items())
                      + f"; least: {pick}")
    except (TableError, ValueError, KeyError, yaml.YAMLError) as err:
        print(f"nccl_transports: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
