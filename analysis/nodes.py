"""The nodes a study ran on: the preflight's verdict before it (bench/preflight.py, preflight.json in the
sweep dir), and the straggler each multi-node run named (bench/run/straggler.py), so a low efficiency that was
one node is not read as FSDP's."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench.core import rundir


def preflight_table(sweeps: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """One row per node of each sweep's preflight, and one note per sweep: when it ran, what it named (a
    slow link among them), or that its file cannot be read."""
    rows, notes = [], []
    for sweep in sweeps:
        path = sweep / rundir.PREFLIGHT_JSON
        if not path.is_file():
            continue
        try:
            verdict = json.loads(path.read_text())
            nodes = [{**r, "sweep": sweep.name, "verdict": "; ".join(r["problems"]) or "ok"}
                     for r in verdict["rows"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            notes.append(f"{sweep.name}: preflight.json unreadable ({type(e).__name__}): no preflight table")
            continue
        rows += nodes
        named = [r["node"] for r in nodes if r["verdict"] != "ok"] + list(verdict.get("links", []))
        notes.append(f"{sweep.name}: preflight of {len(nodes)} node(s) at {verdict.get('when', '?')}: "
                     + ("named " + "; ".join(named) if named else "no node stood apart")
                     + f" (tolerance {verdict.get('tolerance', float('nan')):.0%})")
    return pd.DataFrame(rows), notes


def straggler_cells(rows: pd.DataFrame) -> pd.Series:
    """Each run's named straggler as a table cell: "node3 (compute +240%, 1.2 s a step)" (the node, its
    compute over the others' median, the seconds a step they waited for it); None where none was named."""
    def cell(row: pd.Series) -> str | None:
        if pd.isna(row["straggler"]):
            return None
        return (f"{row['straggler']} (compute {row['slowest_node_excess']:+.0%}, "
                f"{row['slowest_node_held_s']:.3g} s a step)")
    return rows.apply(cell, axis=1) if not rows.empty else pd.Series(index=rows.index, dtype=object)


def joined(cells: pd.Series) -> str | None:
    named = sorted(set(cells.dropna()))
    return "; ".join(named) if named else None


def straggler_notes(frame: pd.DataFrame) -> list[str]:
    """One sentence per study whose ok runs named a straggler: their efficiency is that node's."""
    ok = frame[(frame["status"] == "ok") & frame["straggler"].notna()]
    notes = []
    for sweep, runs in ok.groupby("sweep"):
        nodes = ", ".join(sorted(set(runs["straggler"].astype(str))))
        notes.append(f"{sweep}: {len(runs)} run(s) were held back by a straggler ({nodes}): its compute per "
                     "step was more than preflight.tolerance above the other nodes', so those runs' scaling "
                     "efficiency measures that node, not FSDP; leave it out (Slurm: "
                     "launcher.slurm.extra_sbatch=['--exclude=NODE']; Kubernetes: "
                     "launcher.kubernetes.exclude_nodes=[NODE]) and run them again")
    return notes


