"""The straggler of one run: which node's compute held the others back, and by how much.

Each rank of a multi-rank run reports its own compute seconds per step (trainer/clock.py: forward and
backward of the blocks and the output layer, without the time it waited in collectives) and the node it ran
on. A node is as slow as its slowest rank (its peers wait for that one). The slowest node is compared with
the median of the others: FSDP's collectives make every rank wait for it, so the difference is what it
cost each step. On one node the units are its ranks (one GPU held down is a straggler too)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.core.schema import RunSummary


@dataclass(frozen=True)
class Straggler:
    unit: str  # the slowest node (or "node rank N" on one node)
    excess: float  # its compute time over the median of the others', minus 1
    held_s: float  # seconds per step the others waited for it: its compute less the others' median
    named: bool  # excess above the tolerance: the run's scaling is this unit's, not FSDP's


def _units(per_rank: list[dict[str, Any]]) -> tuple[dict[str, float], bool]:
    """Compute seconds per step by node (its slowest rank), or by rank where the run has one node; and
    whether the units are nodes."""
    timed = [(i, r) for i, r in enumerate(per_rank) if isinstance(r, dict) and r.get("compute_s") is not None]
    nodes = {r.get("node") for _, r in timed}
    units: dict[str, float] = {}
    for i, r in timed:
        key = str(r.get("node")) if len(nodes) > 1 else f"{r.get('node')} rank {r.get('rank', i)}"
        units[key] = max(units.get(key, 0.0), float(r["compute_s"]))
    return units, len(nodes) > 1


def find(per_rank: list[dict[str, Any]], tolerance: float, name_ranks: bool = True) -> Straggler | None:
    """The run's slowest unit, named when its compute exceeds the others' median by more than tolerance
    (a rank of a one-node run only where name_ranks: ranks sharing one host's CPU cores time each other's
    time slices, GPUs do not); None where fewer than two units report compute (one rank, an older worker)."""
    units, by_node = _units(per_rank)
    if len(units) < 2:
        return None
    slowest = max(units, key=lambda k: units[k])
    others = statistics.median(v for k, v in units.items() if k != slowest)
    if others <= 0:
        return None
    excess = units[slowest] / others - 1
    return Straggler(slowest, excess, units[slowest] - others, excess > tolerance and (by_node or name_ranks))


def note(summary: RunSummary) -> str | None:
    """A named straggler in one clause, as the sweep prints it when its run ends; None without one."""
    if not summary.straggler or summary.slowest_node_excess is None or summary.slowest_node_held_s is None:
        return None
    return (f"straggler {summary.straggler}: its compute {summary.slowest_node_excess:+.0%} over the "
            f"others', who waited {summary.slowest_node_held_s:.3g} s a step for it")
