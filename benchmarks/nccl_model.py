"""NCCL's model of one collective (bench/predict/collective.py) against published nccl-tests tables, with
NCCL's published constants only (nothing fitted): per row the error (predicted / measured time - 1), per
table the median |error| of rows of 1 MiB and more and of rows below, and the medians over all tables;
with --split, the tables it names (held out before any fitting) apart from the others.

A table directory holds one `<id>.txt` per table (nccl-tests' output, verbatim) and `index.yaml`, a list of
entries: id, source, collective, nodes, gpus_per_node, gpu, system, scale_up {kind, nvlink_gbs_per_gpu,
gpus (optional: an NVLink domain across trays)}, scale_out {transport, adapters, gbps, rdma, latency_us and
nic_path optional (bench/core/fabric.py NIC_PATHS: a Grace superchip's c2c, else pxb)}, cpu (optional:
intel, amd or arm), nccl_version, env (NCCL_ALGO, NCCL_PROTO, ... as the run set them), notes, and
`modelled: false` with `why_not` for a table no fabric can be built for. A
system bench/core/fabric.py publishes (FABRICS) takes its figures from there where the entry leaves them out.
--check reads every table and builds its fabric and communicator without predicting anything: it says per
table what the benchmark would model, and exits 2 naming each entry it cannot read.

    python benchmarks/nccl_model.py [--tables DIR] [--split FILE] [--quick]   # quick: the summaries only
    python benchmarks/nccl_model.py --check [--tables DIR]
    python benchmarks/nccl_model.py --staged [--split FILE]   # calibrated on one node count, predict the rest

Each transport's fitted figures (network.DEFAULTS) and their loss on clusters left out of the fit:
benchmarks/nccl_transports.py.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.core.fabric import FABRICS, Fabric, ScaleOut, ScaleUp  # noqa: E402
from bench.core.yaml_text import safe_load  # noqa: E402
from bench.predict.collective import (  # noqa: E402
    Calibration,
    available,
    build_comm,
    env_choices,
    predict_collective,
)
from bench.predict.nccl_fit import calibrate  # noqa: E402
from bench.predict.network import DEFAULTS  # noqa: E402
from bench.probes.parse import parse_all  # noqa: E402
from bench.probes.result import NcclRow  # noqa: E402

DEFAULT_TABLES = Path(__file__).resolve().parent / "published" / "nccl-tests"
MIB = 2**20
# GPU name -> compute capability (NCCL's tables are indexed by it): first match wins
GPU_SM = ((r"GB[23]00|B[123]00", 100), (r"H100|H200|H800|H20\b|GH200", 90), (r"L4\b|L40", 89),
          (r"A10G?\b|A40|A6000", 86), (r"A100|A800|A30\b", 80), (r"T4\b", 75), (r"V100", 70))
RDMA_TRANSPORTS = ("efa", "infiniband", "roce", "slingshot")
HOLDOUT = "holdout"  # <dir>/holdout*.txt: held-out id lists (--split), the .txt files there that are no table


class TableError(ValueError):
    """A table or its index entry that cannot be read (the benchmark exits 2 naming it)."""


@dataclass(frozen=True)
class Row:
    size: int
    measured_us: float
    predicted_us: float
    pick: str

    @property
    def error(self) -> float:
        return self.predicted_us / self.measured_us - 1


@dataclass(frozen=True)
class Table:
    id: str
    title: str
    rows: tuple[Row, ...]

    def median(self, large: bool) -> float | None:
        """Median |error| of the rows of 1 MiB and more (large) or below; None without such rows."""
        errs = [abs(r.error) for r in self.rows if (r.size >= MIB) == large]
        return statistics.median(errs) if errs else None


def compute_capability(gpu: str) -> int:
    for pattern, sm in GPU_SM:
        if re.search(pattern, gpu, re.I):
            return sm
    raise TableError(f"unknown GPU {gpu!r}: name one of the patterns in GPU_SM")


def fabric_of(entry: dict[str, Any]) -> Fabric:
    """The fabric an index entry describes: its own figures, the published system's where it names one of
    FABRICS and leaves a figure out, else what its transport implies (RDMA for EFA, InfiniBand, RoCE and
    Slingshot; aws-ofi-nccl's 75 us and Simple only on EFA before the P5 family)."""
    system = str(entry.get("system") or "")
    known = FABRICS.get(system)
    sm = compute_capability(str(entry.get("gpu") or ""))
    superchip = re.search(r"GB[23]00|GH200", str(entry.get("gpu")))  # Grace's: an Arm CPU, the NICs on it
    gpn = int(entry["gpus_per_node"])
    up_e, out_e = entry.get("scale_up") or {}, entry.get("scale_out") or {}
    kind = up_e.get("kind") or (known.scale_up.kind if known else "nvswitch")
    gbs = float(up_e.get("nvlink_gbs_per_gpu") or (known.scale_up.gbs if known else 24.0))
    nvls = known.scale_up.nvls if known else kind == "nvswitch" and sm >= 90
    scale_up = ScaleUp(kind, int(up_e.get("gpus") or gpn), gbs, nvls=nvls)
    scale_out = None
    if out_e or (known and known.scale_out):
        base = known.scale_out if known else None
        missing = [k for k in ("transport", "adapters", "gbps") if not out_e.get(k)]
        if missing and base is None:
            raise TableError(f"index entry {entry['id']}: scale_out has no {', '.join(missing)}")
        transport = out_e.get("transport") or base.transport
        aws_p5_on = bool(re.match(r"p[5-9]", system))
        rdma = out_e.get("rdma", base.rdma if base else transport in RDMA_TRANSPORTS)
        latency = out_e.get("latency_us", base.latency_us if base else 75.0 if transport == "efa" else 0.0)
        simple = base.simple_only if base else transport == "efa" and not aws_p5_on
        path = out_e.get("nic_path", base.nic_path if base else "c2c" if superchip else "pxb")
        scale_out = ScaleOut(transport, int(out_e.get("adapters") or base.adapters),
                             float(out_e.get("gbps") or base.gbps), bool(rdma), float(latency), simple,
                             nic_path=str(path))
    pcie = known.pcie_gen if known else 5 if sm >= 90 else 4 if sm >= 80 else 3
    cpu = str(entry.get("cpu") or (known.cpu if known else "arm" if superchip else "intel"))
    return Fabric(scale_up, scale_out, gpn, sm, pcie_gen=pcie, cpu=cpu, name=system or entry["id"])


@dataclass(frozen=True)
class Measured:
    """An index entry's table as read: the rows the benchmark predicts (out-of-place, with a size and a
    time) and the run's shape, NCCL version (the entry's, else the printed one) and environment."""

    kind: str
    nodes: int
    gpus_per_node: int
    version: str | None
    env: dict[str, str]
    rows: tuple[NcclRow, ...]


def measured(directory: Path, entry: dict[str, Any]) -> Measured:
    """One index entry's nccl-tests output, parsed; TableError where the entry or its file cannot be read."""
    for key in ("id", "collective", "nodes", "gpus_per_node", "gpu"):
        if entry.get(key) in (None, ""):
            raise TableError(f"index entry {entry.get('id', '?')}: no {key}")
    path = directory / f"{entry['id']}.txt"
    if not path.exists():
        raise TableError(f"{path}: missing (index.yaml names it)")
    kind = str(entry["collective"])
    results = [r for r in parse_all(path.read_text()) if r.rows and r.collective in (None, kind)]
    if not results:
        raise TableError(f"{path}: no {kind} rows")
    result = results[0]
    rows = tuple(r for r in result.rows if r.placement == "out-of-place" and r.size > 0 and r.time_us > 0)
    version = str(entry.get("nccl_version") or result.nccl_version or "") or None
    env = {str(k): str(v) for k, v in (entry.get("env") or {}).items()}
    return Measured(kind, int(entry["nodes"]), int(entry["gpus_per_node"]), version, env, rows)


def transport(fabric: Fabric, nodes: int) -> str | None:
    """The network a table's collective crosses (None on one node)."""
    return fabric.scale_out.transport if fabric.scale_out is not None and nodes > 1 else None


def read_table(directory: Path, entry: dict[str, Any], defaults: dict[str, Calibration] | None = None,
               calibration: Calibration | None = None) -> Table:
    """One index entry's table, every out-of-place row predicted: NCCL's model calibrated by `calibration`
    (another table's, as a study's probe calibrates it), else with a transport's fitted figures
    (network.DEFAULTS, or `defaults`), NCCL's published constants where none is given."""
    m = measured(directory, entry)
    fabric = fabric_of(entry)
    cal = calibration or (DEFAULTS if defaults is None else defaults).get(transport(fabric, m.nodes) or "")
    rows = []
    for r in m.rows:
        t = predict_collective(m.kind, r.size, m.nodes, m.gpus_per_node, fabric, version=m.version, env=m.env,
                               calibration=cal)
        rows.append(Row(r.size, r.time_us, t.seconds * 1e6, f"{t.algorithm}/{t.protocol}"))
    title = (f"{entry['id']}: {m.kind} {m.nodes} x {m.gpus_per_node} {entry['gpu']} on {fabric.name}, "
             f"NCCL {m.version or '?'}{' ' + str(m.env) if m.env else ''}; {fabric.describe()}")
    return Table(str(entry["id"]), title, tuple(rows))


NODES_IN_ID = re.compile(r"_\d+n(?:\d+g)?_")  # an id's node count (and GPUs a node): "_128n_", "_10n4g_"


def configuration(entry: dict[str, Any]) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """One cluster set up one way, whatever its node count: the id without its node count, the NCCL version
    and the environment the run set."""
    env = tuple(sorted((str(k), str(v)) for k, v in (entry.get("env") or {}).items()))
    return NODES_IN_ID.sub("_", str(entry["id"])), str(entry.get("nccl_version")), env


@dataclass(frozen=True)
class Staged:
    """A table at a larger node count predicted from its configuration's smallest multi-node table, as a
    study's probe calibrates NCCL's model (bench/predict/nccl_fit.py calibrate), beside the transport's
    prior (network.DEFAULTS) on the same rows."""

    base: str
    base_nodes: int
    calibrated: Table
    prior: Table


def staged(directory: Path, entries: list[dict[str, Any]]) -> list[Staged]:
    """Every configuration run at two or more node counts: its smallest multi-node table that can calibrate
    does, each table at a larger node count is predicted. The node counts no probe ran are the plan's
    question."""
    groups: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[dict[str, Any]]] = {}
    for entry in entries:
        if int(entry["nodes"]) > 1:
            groups.setdefault(configuration(entry), []).append(entry)
    out = []
    for group in groups.values():
        group.sort(key=lambda e: (int(e["nodes"]), str(e["id"])))
        for i, base in enumerate(group):
            cal, nodes = probe(directory, base), int(base["nodes"])
            if cal is not None:
                out += [Staged(str(base["id"]), nodes, read_table(directory, e, calibration=cal),
                               read_table(directory, e)) for e in group[i + 1:] if int(e["nodes"]) > nodes]
                break
    return out


def probe(directory: Path, entry: dict[str, Any]) -> Calibration | None:
    """NCCL's model calibrated on one table as on a study's probe; None where it cannot be (fewer than two
    rows with a size and a time)."""
    m = measured(directory, entry)
    try:
        return calibrate(m.kind, [(r.size, r.time_us) for r in m.rows], m.nodes, m.gpus_per_node,
                         fabric_of(entry), version=m.version, env=m.env)
    except ValueError:
        return None


def staged_report(runs: list[Staged], held_out: set[str]) -> list[str]:
    lines = []
    for s in runs:
        t, p = s.calibrated, s.prior
        lines.append(f"{'[held out] ' if t.id in held_out else ''}{t.title}\n  calibrated on {s.base} "
                     f"({s.base_nodes} nodes): median |error| >= 1 MiB {fmt(t.median(True))} (prior "
                     f"{fmt(p.median(True))}), < 1 MiB {fmt(t.median(False))} (prior {fmt(p.median(False))})")
    lines.append(summary("calibrated on the smallest node count", [s.calibrated for s in runs]))
    lines.append(summary("the same tables at the transport's prior", [s.prior for s in runs]))
    return lines


def modelled(entry: dict[str, Any]) -> bool:
    """Whether the benchmark models the entry's table: all but those `modelled: false` (with a why_not)."""
    if entry.get("modelled", True) is not False:
        return True
    if not str(entry.get("why_not") or "").strip():
        raise TableError(f"index entry {entry.get('id', '?')}: modelled: false needs a why_not")
    return False


def check_entry(directory: Path, entry: dict[str, Any]) -> str:
    """One table as --check reports it: its shape, fabric and rows, and whether the benchmark models it.
    Builds the fabric and NCCL's communicator on it and checks that the run's NCCL_ALGO/NCCL_PROTO leave an
    algorithm the model has; predicts nothing."""
    m = measured(directory, entry)
    wrong = sum(1 for r in m.rows if r.wrong)
    rows = f"{len(m.rows)} row{'' if len(m.rows) == 1 else 's'}"
    rows += f" ({wrong} with #wrong > 0)" if wrong else ""
    head = f"{entry['id']}: {m.kind} {m.nodes} x {m.gpus_per_node} {entry['gpu']}"
    if not modelled(entry):
        return f"{head}; {rows}; not modelled: {entry['why_not']}"
    fabric = fabric_of(entry)
    comm = build_comm(m.kind, m.nodes, m.gpus_per_node, fabric, m.version)
    algos, protos = env_choices(m.env, m.kind)
    offered = [(a, p) for a, ps in available(comm).items() for p in ps
               if (algos is None or a in algos) and (protos is None or p in protos)]
    if not offered:
        raise TableError(f"index entry {entry['id']}: its env {m.env} leaves none of the algorithms NCCL's "
                         f"model has for {m.kind} on this fabric ({', '.join(available(comm))})")
    return (f"{head} on {fabric.name} ({fabric.cpu} CPU, PCIe Gen{fabric.pcie_gen}), "
            f"NCCL {m.version or '?'}; {fabric.describe()}; {rows}; modelled")


def check(directory: Path, entries: list[dict[str, Any]]) -> int:
    """--check: a line per index entry (stdout), one per entry or table file that cannot be read (stderr);
    2 if there is any."""
    problems = []
    ids = [str(e.get("id", "?")) for e in entries]
    problems += [f"{i}: more than one index entry" for i in sorted({i for i in ids if ids.count(i) > 1})]
    files = {p.stem for p in directory.glob("*.txt") if not p.stem.startswith(HOLDOUT)}
    problems += [f"{directory / (i + '.txt')}: no index entry" for i in sorted(files - set(ids))]
    lines, not_modelled = [], 0
    for entry in entries:
        try:
            lines.append(check_entry(directory, entry))
            not_modelled += not modelled(entry)
        except (TableError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{entry.get('id', '?')}: cannot be read: {err}")
    print("\n".join(lines))
    print(f"{len(entries)} entries: {len(lines) - not_modelled} modelled, {not_modelled} not modelled, "
          f"{len(problems)} problems")
    for problem in problems:
        print(f"nccl_model: {problem}", file=sys.stderr)
    return 2 if problems else 0


def read_index(directory: Path) -> list[dict[str, Any]]:
    index = directory / "index.yaml"
    if not index.exists():
        raise TableError(f"{index}: no index (one entry per <id>.txt table)")
    entries = safe_load(index.read_text()) or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TableError(f"{index}: not a list of entries")
    return entries


def read_split(path: Path | None) -> set[str]:
    """Held-out table ids: a YAML list, or one id per line (# comments allowed)."""
    if path is None:
        return set()
    if not path.exists():
        raise TableError(f"{path}: no such split file")
    loaded = yaml.safe_load(path.read_text())
    ids = loaded if isinstance(loaded, list) else [line.split("#")[0].strip()
                                                   for line in path.read_text().splitlines()]
    return {str(i) for i in ids if str(i)}


def fmt(value: float | None) -> str:
    return "   -  " if value is None else f"{100 * value:5.1f}%"


def summary(name: str, tables: list[Table]) -> str:
    """Medians over tables: pooled over their rows, and the median of the tables' medians."""
    parts = []
    for large, label in ((True, ">= 1 MiB"), (False, "< 1 MiB")):
        errs = [abs(r.error) for t in tables for r in t.rows if (r.size >= MIB) == large]
        medians = [m for t in tables if (m := t.median(large)) is not None]
        pooled = statistics.median(errs) if errs else None
        of_tables = statistics.median(medians) if medians else None
        parts.append(f"{label}: {fmt(pooled)} of {len(errs)} rows, median of table medians {fmt(of_tables)}")
    return f"{name} ({len(tables)} tables) median |error|  " + "; ".join(parts)


def report(tables: list[Table], held_out: set[str], quick: bool) -> list[str]:
    lines = []
    for t in tables:
        lines.append(("[held out] " if t.id in held_out else "") + t.title)
        if not quick:
            lines.append(f"  {'bytes':>12} {'measured us':>12} {'predicted us':>13} {'error':>7}  NCCL pick")
            lines += [f"  {r.size:>12} {r.measured_us:12.1f} {r.predicted_us:13.1f} {100 * r.error:+6.1f}%  "
                      f"{r.pick}" for r in t.rows]
        lines.append(f"  median |error|: >= 1 MiB {fmt(t.median(True))}, < 1 MiB {fmt(t.median(False))}")
    lines.append(summary("all", tables))
    if held_out:
        lines.append(summary("held out", [t for t in tables if t.id in held_out]))
        lines.append(summary("the rest", [t for t in tables if t.id not in held_out]))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=DEFAULT_TABLES, help="the table directory")
    parser.add_argument("--split", type=Path, help="the held-out table ids (YAML list or one per line)")
    parser.add_argument("--quick", action="store_true", help="per-table and overall medians only")
    parser.add_argument("--check", action="store_true",
                        help="read every table and build its fabric, predict nothing; exit 2 on any problem")
    parser.add_argument("--published", action="store_true",
                        help="NCCL's published constants only, no transport's fitted figures")
    parser.add_argument("--staged", action="store_true",
                        help="per configuration at several node counts, calibrate on the smallest (as a "
                             "study's probe) and predict the larger")
    args = parser.parse_args(argv)
    try:
        entries = read_index(args.tables)
        held_out = read_split(args.split)
        unknown = held_out - {str(e.get("id")) for e in entries}
        if unknown:
            raise TableError(f"{args.split}: ids not in the index: {', '.join(sorted(unknown))}")
        if args.check:
            return check(args.tables, entries)
        skipped = [e for e in entries if not modelled(e)]
        if args.staged:
            runs = staged(args.tables, [e for e in entries if modelled(e)])
            print("\n".join(staged_report(runs, held_out)))
            return 0
        defaults = {} if args.published else None
        tables = [read_table(args.tables, e, defaults) for e in entries if modelled(e)]
    except (TableError, ValueError, KeyError, yaml.YAMLError) as err:
        print(f"nccl_model: {err}", file=sys.stderr)
        return 2
    lines = [f"[not modelled] {e['id']}: {e['why_not']}" for e in skipped]
    print("\n".join(lines + report(tables, held_out, args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

