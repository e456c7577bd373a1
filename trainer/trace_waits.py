"""Each collective's wait for its peers, read across the ranks of its own process group.

A rank tells the others its collectives (`exchanged`: each kind's spans in issue order, its process groups,
its host and its trace's clock origin; the worker sends it with one all_gather_object), and `set_waits`
reads each collective's wait from their answers: the same kind at the same place in issue order on every
rank of its group. Where the group's ranks share one host clock the wait is the time from this rank's
arrival to the last rank's; elsewhere the duration rule, d - min(d) over the group, whose premise (the
ranks leave a collective together) is checked where the clock is shared. The split (trainer/trace_split.py)
counts a piece of an exposed collective before the wait ends as `waiting`.
"""
from __future__ import annotations

from typing import Any

from trainer.trace import BASE, KINDS, Collective, Span, Timeline

# The duration rule (a rank's wait is its time in a collective less the group's shortest) holds where the
# ranks leave a collective together, so that the last to arrive is the quickest through. Where the ranks
# share a clock the rule is checked against their arrival times: a collective on which the two readings of
# some rank's wait differ by more than this share of its longest duration contradicts the rule's premise
# (ranks that leave together still differ by thread wake-ups: 0.3-0.5 ms of 2-9 ms gloo collectives with 4
# ranks on 2 cores)
PREMISE_SLACK = 0.1


def fsdp_groups(shard: list[int], replicate: list[int]) -> dict[str, list[int]]:
    """The process group of each collective FSDP2 issues, from the mesh the worker built
    (trainer/parallel.py MeshInfo): all-gathers and reduce-scatters over the shard group, the all-reduce
    (HYBRID_SHARD, NO_SHARD) over the replicate group."""
    return {"all_gather": list(shard), "reduce_scatter": list(shard), "all_reduce": list(replicate)}


def _in_order(tl: Timeline) -> list[Collective]:
    """The classified collectives in the order they were issued: each kind's i-th is the same collective on
    every rank of its group."""
    return sorted((c for c in tl.collectives if c.kind in KINDS), key=lambda c: (c.issued, c.start))


def exchanged(tl: Timeline, rank: int, groups: dict[str, list[int]] | None, host: str) -> dict[str, Any]:
    """What a rank tells the others to read the waits: each kind's collectives (start, end) in issue order,
    its groups, its host and its trace's clock origin (arrival times compare only on one host's clock)."""
    flights: dict[str, list[Span]] = {}
    for c in _in_order(tl):
        flights.setdefault(c.kind, []).append((c.start, c.end))
    return {"rank": rank, "host": host, "base_ns": tl.base_ns, "groups": groups, "flights": flights}


def set_waits(tl: Timeline, mine: dict[str, Any], everyone: list[dict[str, Any] | None]) -> None:
    """Each collective's wait for a peer, read across the ranks of its own process group (the same kind,
    the same place in issue order; `mine["groups"]`, else every rank that sent its collectives). Where the
    group's ranks share one host clock, the wait is the time from this rank's arrival to the last rank's
    (its start); the duration rule, d - min(d) over the group, is kept beside it, and is the wait where no
    clock is shared: the last to arrive spends the least in a collective the ranks leave together. Where
    the two readings differ on some rank of the group by more than PREMISE_SLACK of the collective's
    longest duration (the last to arrive was not the quickest through, or the ranks did not leave
    together), the collective is marked contradicted. A group of this rank alone sends nothing: `local`."""
    by_rank = {p["rank"]: p for p in everyone if p}
    seen: dict[str, int] = {}
    for c in _in_order(tl):
        i = seen[c.kind] = seen.get(c.kind, -1) + 1
        base = BASE[c.kind]
        known = (mine.get("groups") or {}).get(base)
        group = list(known) if known else sorted(by_rank)
        c.ranks = len(group) if known else None
        if known and len(known) == 1:
            c.local = True
            continue
        peers = [by_rank[r] for r in group if r in by_rank]
        if any(len(p["flights"].get(c.kind, ())) != len(mine["flights"][c.kind])
               or (p.get("groups") or {}).get(base, group) != group for p in peers):
            tl.unmatched += 1
            continue
        if len(peers) < 2:
            continue
        spans = [p["flights"][c.kind][i] for p in peers]
        durations = [e - s for s, e in spans]
        c.wait = c.wait_duration = max(0.0, (c.end - c.start) - min(durations))
        if len(peers) == len(group) and all(p["host"] == mine["host"] for p in peers):
            arrivals = [s + (p["base_ns"] - mine["base_ns"]) / 1e3 for p, (s, _) in zip(peers, spans)]
            c.wait = min(c.end - c.start, max(0.0, max(arrivals) - c.start))
            c.shared_clock = True
            # the readings apart on some rank of the group: the last to arrive was not the quickest
            # through, or the ranks did not leave together
            apart = max(abs((d - min(durations)) - min(d, max(arrivals) - a))
                        for a, d in zip(arrivals, durations))
            c.contradicted = apart > PREMISE_SLACK * max(durations)
