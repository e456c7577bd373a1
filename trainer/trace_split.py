"""The split of a rank's profiled steps into where the time went, from its timeline (trainer/trace.py) and
its collectives' waits for their peers (trainer/trace_waits.py); `analyse` is what the worker calls.

The split. The profiled step (the `fsdpbench::step` range) is cut at every event boundary and each piece
given to one part, first match wins, by one definition on a CPU (the main thread, gloo's work threads) and
on a GPU (kernels on their streams):
  optimizer          inside `Optimizer.step` (on a GPU: kernels launched from it);
  compute            work outside FSDP's collective path: on a CPU an op of the main thread outside FSDP's
                     collective ranges (trainer/trace.py FSDP_COLLECTIVE_RANGES), on a GPU a kernel other
                     than NCCL's launched outside them;
  collective_copies  the local work FSDP does around a collective: an op (CPU) or kernel (GPU) issued from
                     inside its collective ranges (the all-gather's copy-in and copy-out, the
                     reduce-scatter's copy-in and casts, the gradient division, the c10d call that issues
                     it), and a collective of a group of one rank, which sends nothing;
  exposed_<kind>     the rank waits on a collective in flight: on a CPU the main thread idles inside FSDP's
                     collective path while a collective runs on gloo's threads (the one it waits on: of the
                     range's kind, the last issued), on a GPU an NCCL kernel runs and nothing else does;
  waiting            the part of an exposed piece before the last rank of the collective's own process group
                     arrived: the wait for a peer, read from the ranks' arrivals where they share a host
                     clock, else by the duration rule (trainer/trace_waits.py `set_waits`);
  other              nothing of the above: the host (Python, thread wake-ups, a collective queued but not
                     yet running), data, idle.
A collective running while the rank computes or copies is `overlapped` (per kind, beside the parts).
"""
from __future__ import annotations

import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.trace import BASE, KINDS, WAITS_FOR, Collective, Timeline, TraceError, load, timeline
from trainer.trace_waits import exchanged, set_waits

PARTS = ("compute", *(f"exposed_{k}" for k in KINDS), "waiting", "collective_copies", "optimizer", "other")


@dataclass
class _State:
    """What is active on a piece of the step, as the sweep over the event boundaries keeps it."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("window", "optimizer", "compute", "copies"), 0))
    path: dict[int, str] = field(default_factory=dict)  # the idle-in-path spans open: what they wait for
    flying: dict[int, Collective] = field(default_factory=dict)


def _marks(tl: Timeline) -> list[tuple[float, int, str, int]]:
    """Every span's opening (+1) and closing (-1) as (time, delta, what, index), in time order, and cuts
    (0) where a collective's wait ends by either reading."""
    marks: list[tuple[float, int, str, int]] = []

    def add(start: float, end: float, what: str, i: int = 0) -> None:
        if end > start:
            marks.extend(((start, 1, what, i), (end, -1, what, i)))
    for what, spans in (("window", tl.windows), ("optimizer", tl.optimizer), ("compute", tl.compute),
                        ("copies", tl.copies)):
        for s, e in spans:
            add(s, e, what)
    for i, (s, e, _) in enumerate(tl.path):
        add(s, e, "path", i)
    for i, c in enumerate(tl.collectives):
        add(c.start, c.end, "flying", i)
        marks.extend((min(c.end, c.start + w), 0, "cut", i) for w in (c.wait, c.wait_duration) if w > 0)
    return sorted(marks, key=lambda m: (m[0], m[1]))


def _apply(state: _State, tl: Timeline, delta: int, what: str, i: int) -> None:
    if what in state.counts:
        state.counts[what] += delta
    elif what == "path":
        if delta > 0:
            state.path[i] = tl.path[i][2]
        else:
            state.path.pop(i, None)
    elif what == "flying":
        if delta > 0:
            state.flying[i] = tl.collectives[i]
        else:
            state.flying.pop(i, None)


def _awaited(state: _State, device: str) -> Collective | None:
    """The collective this piece waits on: on a GPU the NCCL kernel running (a group's of several ranks
    first, the earliest); on a CPU, where the main thread idles in FSDP's collective path, the last issued
    of those in flight of the kind the path waits for (else of any kind)."""
    flying = [c for c in state.flying.values() if c.kind in KINDS]
    if not flying:
        return None
    if device == "gpu":
        return min(flying, key=lambda c: (c.local, c.start))
    if not state.path:
        return None
    waits_for = WAITS_FOR[next(iter(state.path.values()))]
    fits = [c for c in flying if BASE[c.kind] in waits_for]
    return max(fits or flying, key=lambda c: (c.issued, c.start))


def _part(state: _State, device: str, mid: float) -> tuple[str, Collective | None]:
    """The part of one piece of a step (see the module docstring) and the collective it waits on."""
    if state.counts["optimizer"] > 0:
        return "optimizer", None
    if state.counts["compute"] > 0:
        return "compute", None
    if state.counts["copies"] > 0:
        return "collective_copies", None
    awaited = _awaited(state, device)
    if awaited is None:
        return "other", None
    if awaited.local:
        return "collective_copies", awaited
    if awaited.start <= mid < awaited.start + awaited.wait:
        return "waiting", awaited
    return f"exposed_{awaited.kind}", awaited


def split(tl: Timeline) -> dict[str, Any]:
    """Seconds per profiled step in each part (they partition it); beside them the overlapped seconds and
    the waiting per kind, the waiting by the duration rule, the premise's check (collectives read on a
    shared clock, those that contradict it, and the seconds the two readings differ by on those), and per
    kind the collectives' bytes, seconds (`s`, of which `wait_s` before the last rank arrived) and count
    per step, and their group's ranks."""
    parts = dict.fromkeys(PARTS, 0.0)
    overlapped, waited = dict.fromkeys(KINDS, 0.0), dict.fromkeys(KINDS, 0.0)
    by_duration = at_stake = 0.0
    state, marks = _State(), _marks(tl)
    for (t, delta, what, i), nxt in zip(marks, [*marks[1:], None]):
        _apply(state, tl, delta, what, i)
        if nxt is None or nxt[0] <= t or state.counts["window"] <= 0:
            continue
        length, mid = nxt[0] - t, (t + nxt[0]) / 2
        part, awaited = _part(state, tl.device, mid)
        parts[part] += length
        if part in ("compute", "collective_copies") and awaited is None:
            for kind in {c.kind for c in state.flying.values() if c.kind in KINDS and not c.local}:
                overlapped[kind] += length
        if awaited is None or awaited.local:
            continue
        duration_says = awaited.start <= mid < awaited.start + awaited.wait_duration
        by_duration += length * duration_says
        waited[awaited.kind] += length * (part == "waiting")
        at_stake += length * (awaited.contradicted and duration_says != (part == "waiting"))
    n = len(tl.windows)
    seconds: dict[str, float] = {}
    waits: dict[str, float] = {}
    count: dict[str, int] = {}
    ranks: dict[str, int] = {}
    for c in tl.collectives:
        seconds[c.kind] = seconds.get(c.kind, 0.0) + c.end - c.start
        waits[c.kind] = waits.get(c.kind, 0.0) + c.wait
        count[c.kind] = count.get(c.kind, 0) + 1
        ranks[c.kind] = max(ranks.get(c.kind, 0), c.ranks or 0)
    collectives = {k: {"bytes": tl.bytes.get(k, 0) // n, "s": seconds.get(k, 0.0) / n / 1e6,
                       "wait_s": waits.get(k, 0.0) / n / 1e6, "count": count.get(k, 0) // n,
                       "ranks": ranks.get(k) or None} for k in KINDS if k in count or k in tl.bytes}
    read = [c for c in tl.collectives if c.shared_clock]
    return {"parts": {k: v / n / 1e6 for k, v in parts.items()},
            "overlapped": {k: v / n / 1e6 for k, v in overlapped.items()},
            "waiting_by_kind": {k: v / n / 1e6 for k, v in waited.items()},
            "waiting_duration_rule": by_duration / n / 1e6,
            "premise": {"checked": len(read), "contradicted": sum(c.contradicted for c in read),
                        "at_stake_s": at_stake / n / 1e6},
            "step_s": sum(b - a for a, b in tl.windows) / n / 1e6, "collectives": collectives,
            "unclassified": tl.unclassified, "unmatched": tl.unmatched, "steps": n, "device": tl.device}


def median_split(splits: list[dict[str, Any]]) -> dict[str, float]:
    """Per part the median over ranks (seconds per profiled step), with the profiled step's median."""
    out = {k: statistics.median(s["parts"][k] for s in splits) for k in PARTS}
    out["step_s"] = statistics.median(s["step_s"] for s in splits)
    return out


def analyse(path: Path | None, exchange: Callable[[Any], list[Any]], rank: int = 0,
            groups: dict[str, list[int]] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """This rank's split from its trace, its collectives exchanged with every rank (`exchange`: an
    all_gather_object, which every rank calls, recording or not) to read each one's wait across its own
    process group (`groups`: fsdp_groups of the mesh the worker built; None: every rank). Never raises: a
    trace that cannot be read leaves (None, why)."""
    import torch
    tl, error = None, None
    if path is not None:
        try:
            tl = timeline(load(path, torch.__version__))
        except TraceError as e:
            error = str(e)
        except Exception as e:  # a trace of a shape this reader does not know: the run stays ok
            error = f"trace {path.name} could not be split ({type(e).__name__}: {str(e)[:120]})"
    mine = exchanged(tl, rank, groups, socket.gethostname()) if tl else None
    everyone = exchange(mine)
    if tl is None:
        return None, error
    set_waits(tl, mine, everyone)
    return split(tl), None
