"""FSDP2's communication beside its compute, unit by unit, as its CUDA streams run it: which part of each
collective the step waits for and which part hides behind compute (bench/predict/perf.py's exposed parts).

A unit is what fully_shard wraps: each transformer block, and the root (the embedding, the final norm and
the output layer). FSDP2 (torch 2.6-2.13; docs/prediction.md, "FSDP2's overlap", cites each rule):
- one NCCL communicator carries a unit's all-gather and reduce-scatter (the shard group), so they queue
  one behind the other in the order the CPU issues them; HYBRID_SHARD's and NO_SHARD's all-reduce runs on
  the replicate group's own queue beside it;
- forward: the root's all-gather comes first and nothing hides it; each block's all-gather is issued ahead
  of the compute (the CPU runs ahead), at most two units ahead of the compute stream; a block computes
  once its own all-gather has ended; the output layer and the loss run last, on the root's parameters;
- backward: the root, resharded after forward, is gathered again before the output layer's backward; each
  block's pre-backward gathers it (where it was resharded) and prefetches the next block's gather; its
  reduce-scatter is issued after its backward, and the compute stream waits for the previous
  reduce-scatter before the next one's copy-in (one buffer); the root's reduce-scatter (the embedding's
  gradients come last) runs after every block's, nothing beside it; the optimizer waits for all.
The time the compute stream idles is exposed, counted against the collective running meanwhile (as a
trace counts it: the kind of the kernel in flight); the rest of each collective is hidden, and slows the
compute it runs beside (`contention`: NCCL's kernels hold SMs the compute loses).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

GATHER_FWD, GATHER_BWD = "exposed_all_gather_fwd", "exposed_all_gather_bwd"
REDUCE, ALL_REDUCE = "exposed_reduce_scatter", "exposed_all_reduce"
PARTS = (GATHER_FWD, GATHER_BWD, REDUCE, ALL_REDUCE)


@dataclass(frozen=True)
class Unit:
    """One FSDP unit's work in one micro-batch, in seconds (0: none of that collective this micro-batch)."""

    forward: float  # its forward compute
    backward: float  # its backward compute (the forward activation checkpointing reruns included)
    gather: float = 0.0  # its all-gather before the forward
    regather: float = 0.0  # its all-gather before the backward (resharded after forward)
    reduce: float = 0.0  # its reduce-scatter after the backward
    all_reduce: float = 0.0  # its all-reduce across the replicate group, after the reduce-scatter
    share: float = 0.0  # the fraction of the compute its collectives slow while they run beside it


class Op(NamedTuple):
    """One collective as its queue ran it."""

    part: str  # the exposed part its time counts against
    start: float
    end: float
    share: float  # the compute's loss while it runs (Unit.share)


@dataclass
class Queue:
    """One communicator's collectives, run one at a time in the order they are issued."""

    free: float = 0.0
    ops: list[Op] = field(default_factory=list)

    def run(self, part: str, ready: float, seconds: float, share: float) -> float:
        """Enqueue a collective that may start at `ready`; when it ends (`ready` where there is none)."""
        if seconds <= 0:
            return ready
        start = max(self.free, ready)
        self.free = start + seconds
        self.ops.append(Op(part, start, self.free, share))
        return self.free


@dataclass(frozen=True)
class Overlap:
    """A micro-batch's communication against its compute."""

    exposed: dict[str, float]  # per part, seconds the compute stream waited for a collective
    by_part: dict[str, float]  # per part, seconds of its collectives in all
    hidden: float  # seconds of collectives that ran beside compute
    total: float  # seconds of every collective
    contention: float  # seconds the compute lost to the collectives beside it


@dataclass
class Stream:
    """The compute stream: when it is free, and the spans it computed."""

    free: float = 0.0
    busy: list[tuple[float, float]] = field(default_factory=list)

    def compute(self, ready: float, seconds: float) -> float:
        start = max(self.free, ready)
        self.free = start + seconds
        if seconds > 0:
            self.busy.append((start, self.free))
        return start


def forward(root: Unit, blocks: Sequence[Unit], shard: Queue, stream: Stream) -> float:
    """The forward pass; returns when the output layer's compute began (the backward's root gather may
    start then: the CPU issues the backward while the device still runs the forward's tail)."""
    stream.compute(shard.run(GATHER_FWD, 0.0, root.gather, root.share), 0.0)  # the embedding: no FLOPs
    starts: list[float] = []
    for i, unit in enumerate(blocks):
        ready = starts[i - 2] if i >= 2 else 0.0  # at most two units ahead of the compute stream
        gathered = shard.run(GATHER_FWD, ready, unit.gather, unit.share)
        starts.append(stream.compute(gathered, unit.forward))
    return stream.compute(0.0, root.forward)


def backward(root: Unit, blocks: Sequence[Unit], shard: Queue, replicate: Queue, stream: Stream,
             issued: float) -> None:
    """The backward pass, from the output layer's backward to the root's reduce-scatter."""
    stream.compute(shard.run(GATHER_BWD, issued, root.regather, root.share), root.backward)
    order = list(reversed(range(len(blocks))))
    gathered = {i: shard.run(GATHER_BWD, issued, blocks[i].regather, blocks[i].share) for i in order[:1]}
    reduced = 0.0
    for i in order:
        if i - 1 >= 0:  # prefetched in this block's pre-backward, before its reduce-scatter is issued
            nxt = blocks[i - 1]
            gathered[i - 1] = shard.run(GATHER_BWD, issued, nxt.regather, nxt.share)
        stream.compute(gathered[i], blocks[i].backward)
        reduced = reduce(blocks[i], shard, replicate, stream, reduced)
    reduce(root, shard, replicate, stream, reduced)


def reduce(unit: Unit, shard: Queue, replicate: Queue, stream: Stream, previous: float) -> float:
    """A unit's reduce-scatter after its backward: its copy-in waits on the compute stream for the
    previous reduce-scatter; its all-reduce follows on the replicate queue. When it ends."""
    if unit.reduce <= 0 and unit.all_reduce <= 0:
        return previous
    stream.free = max(stream.free, previous)
    done = shard.run(REDUCE, stream.free, unit.reduce, unit.share)
    replicate.run(ALL_REDUCE, done, unit.all_reduce, unit.share)
    return done


def idle(stream: Stream, end: float) -> list[tuple[float, float]]:
    """The spans the compute stream had nothing to run, up to `end`."""
    gaps, t = [], 0.0
    for start, stop in sorted(stream.busy):
        if start > t:
            gaps.append((t, start))
        t = max(t, stop)
    return gaps + ([(t, end)] if end > t else [])


def per_op(ops: Sequence[Op], spans: Sequence[tuple[float, float]]) -> list[float]:
    """Each op's time within `spans` (sorted and disjoint): the spans' time covered by its end less that
    covered by its start, read off the piecewise-linear running total of the spans' lengths."""
    if not ops or not spans:
        return [0.0] * len(ops)
    edges = np.asarray(spans, dtype=float)
    lengths = edges[:, 1] - edges[:, 0]
    total = np.cumsum(lengths)
    running = np.column_stack((total - lengths, total)).ravel()  # at each span's start and end
    times = np.asarray([(op.start, op.end) for op in ops], dtype=float)
    inside = np.interp(times, edges.ravel(), running)
    return (inside[:, 1] - inside[:, 0]).tolist()


def outside(spans: Sequence[tuple[float, float]], ops: Sequence[Op]) -> list[tuple[float, float]]:
    """The parts of sorted, disjoint `spans` no op of a queue ran in."""
    out, j = [], 0
    for start, stop in spans:
        t = start
        while j < len(ops) and ops[j].end <= start:
            j += 1
        k = j
        while k < len(ops) and ops[k].start < stop:
            if ops[k].start > t:
                out.append((t, ops[k].start))
            t = max(t, ops[k].end)
            k += 1
        if t < stop:
            out.append((t, stop))
    return out


def charged(gaps: Sequence[tuple[float, float]], first: Sequence[Op], then: Sequence[Op]) -> dict[str, float]:
    """Per part, the compute stream's idle time charged to it: the shard queue's collectives for the time they
    ran in the gaps, the replicate queue's for the rest of the gaps' time they ran in (each queue runs one
    collective at a time, so neither counts a moment twice)."""
    exposed = dict.fromkeys(PARTS, 0.0)
    for op, seconds in zip(first, per_op(first, gaps)):
        exposed[op.part] += seconds
    for op, seconds in zip(then, per_op(then, outside(gaps, first))):
        exposed[op.part] += seconds
    return exposed


def micro_batch(root: Unit, blocks: Sequence[Unit]) -> Overlap:
    """One micro-batch's forward and backward: the compute stream's waits, counted against the collective
    in flight (the shard queue's first, the replicate queue's where the shard queue is idle)."""
    shard, replicate, stream = Queue(), Queue(), Stream()
    issued = forward(root, blocks, shard, stream)
    backward(root, blocks, shard, replicate, stream, issued)
    end = max(stream.free, shard.free, replicate.free)
    exposed = charged(idle(stream, end), shard.ops, replicate.ops)
    by_part = dict.fromkeys(PARTS, 0.0)
    for op in shard.ops + replicate.ops:
        by_part[op.part] += op.end - op.start
    total = sum(by_part.values())
    busy = sorted(stream.busy)
    lost = sum(op.share * s for ops in (shard.ops, replicate.ops) for op, s in zip(ops, per_op(ops, busy)))
    shown = sum(exposed.values())
    return Overlap(exposed, {k: v for k, v in by_part.items() if v > 0}, max(0.0, total - shown), total, lost)
