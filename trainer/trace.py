"""Each run's own profiler trace, and the split of its step into where the time went.

Recording. After its timed steps a rank runs `steps` more under torch.profiler (the throughput figures stay
those of unprofiled steps), each inside a `fsdpbench::step` range, and writes a gzip-compressed Chrome trace
(Perfetto, chrome://tracing) named by rank; the trace carries the torch version that wrote it
(`fsdpbench` metadata), since the event names it is read by are torch's.

The split. The profiled step (the `fsdpbench::step` range) is cut at every event boundary and each piece
given to one part, first match wins, by one definition on a CPU (the main thread, gloo's work threads) and
on a GPU (kernels on their streams):
  optimizer          inside `Optimizer.step` (on a GPU: kernels launched from it);
  compute            work outside FSDP's collective path: on a CPU an op of the main thread outside FSDP's
                     collective ranges (below), on a GPU a kernel other than NCCL's launched outside them;
  collective_copies  the local work FSDP does around a collective: an op (CPU) or kernel (GPU) issued from
                     inside its collective ranges (the all-gather's copy-in and copy-out, the
                     reduce-scatter's copy-in and casts, the gradient division, the c10d call that issues
                     it), and a collective of a group of one rank, which sends nothing;
  exposed_<kind>     the rank waits on a collective in flight: on a CPU the main thread idles inside FSDP's
                     collective path while a collective runs on gloo's threads (the one it waits on: of the
                     range's kind, the last issued), on a GPU an NCCL kernel runs and nothing else does;
  waiting            the part of an exposed piece before the last rank of the collective's own process group
                     arrived: the wait for a peer, read from the ranks' arrivals where they share a host
                     clock, else by the duration rule (`set_waits`);
  other              nothing of the above: the host (Python, thread wake-ups, a collective queued but not
                     yet running), data, idle.
A collective running while the rank computes or copies is `overlapped` (per kind, beside the parts).
Kinds (all_gather_fwd, all_gather_bwd when issued under a backward range, reduce_scatter, all_reduce) are
those of the c10d op that issued the collective: gloo names FSDP2's reduce-scatter `gloo:all_reduce` on its
work threads, and its threads serve one process group each, not in one global order, so each gloo event is
matched to the earliest issued op before it of a compatible collective and the same element count. Bytes
per kind follow nccl-tests: all_gather the gathered output, reduce_scatter the unreduced input, all_reduce
the buffer.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("all_gather_fwd", "all_gather_bwd", "reduce_scatter", "all_reduce")
BASE = {"all_gather_fwd": "all_gather", "all_gather_bwd": "all_gather", "reduce_scatter": "reduce_scatter",
        "all_reduce": "all_reduce"}
PARTS = ("compute", *(f"exposed_{k}" for k in KINDS), "waiting", "collective_copies", "optimizer", "other")
STEP_RANGE = "fsdpbench::step"
META_KEY = "fsdpbench"  # the trace's metadata: the torch version and rank that wrote it
# the c10d ops FSDP2 issues, by the collective they are (torch 2.13's dispatcher names)
C10D_OPS = {"c10d::_allgather_base_": "all_gather", "c10d::allgather_into_tensor_coalesced": "all_gather",
            "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::reduce_scatter_tensor_coalesced":
            "reduce_scatter", "c10d::allreduce_": "all_reduce", "c10d::allreduce_coalesced_": "all_reduce"}
# FSDP2's ranges (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py) in which a rank copies in, issues,
# waits for and copies out a collective, by what it waits for there ("reduce": the reduce-scatter, and under
# HYBRID_SHARD and NO_SHARD the all-reduce after it); `FSDP::all_gather` covers `FSDP::all_gather_copy_out`
FSDP_COLLECTIVE_RANGES = (("FSDP::all_gather", "all_gather"), ("FSDP::post_backward_reduce", "reduce"),
                          ("FSDP::post_backward_rs_wait", "reduce_scatter"))
WAITS_FOR = {"all_gather": ("all_gather",), "reduce": ("reduce_scatter", "all_reduce"),
             "reduce_scatter": ("reduce_scatter",)}
# gloo's work-thread events (`gloo:<algorithm>`) and the issuing ops each can be: FSDP2's reduce-scatter
# runs as gloo's all_reduce
GLOO_RUNS = {"all_gather": ("all_gather",), "all_reduce": ("reduce_scatter", "all_reduce"),
             "reduce_scatter": ("reduce_scatter",)}
NCCL_KERNELS = (("AllGather", "all_gather"), ("ReduceScatter", "reduce_scatter"), ("AllReduce", "all_reduce"))
NCCL_DTYPES = (("_bf16", "c10::BFloat16"), ("_f16", "c10::Half"), ("_f32", "float"), ("_f64", "double"))
DTYPE_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
               "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e5m2": 1}
# The duration rule (a rank's wait is its time in a collective less the group's shortest) holds where the
# ranks leave a collective together, so that the last to arrive is the quickest through. Where the ranks
# share a clock the rule is checked against their arrival times: a collective on which the two readings of
# some rank's wait differ by more than this share of its longest duration contradicts the rule's premise
# (ranks that leave together still differ by thread wake-ups: 0.3-0.5 ms of 2-9 ms gloo collectives with 4
# ranks on 2 cores)
PREMISE_SLACK = 0.1


class TraceError(ValueError):
    """A trace this reader cannot split (missing, truncated, another torch, no profiled step)."""


Span = tuple[float, float]


@dataclass
class Collective:
    """One collective as this rank ran it: a gloo work-thread event, or an NCCL kernel."""

    kind: str  # one of KINDS once its issuing op is known, else ""
    start: float  # microseconds on the trace's clock: this rank's side of it began (its arrival)
    end: float
    runs: tuple[str, ...] = ()  # the collectives its event can be (gloo's all_reduce: a reduce-scatter too)
    numel: int | None = None  # gloo: the elements its event names, which its issuing op names too
    dtype: str | None = None  # its element type where the event names one (gloo's args, NCCL's name)
    issued: float = 0.0  # when its c10d op was issued: the order every rank of its group issued it in
    ranks: int | None = None  # its process group's size (set_waits), None where not known
    local: bool = False  # its process group is this rank alone: it sends nothing
    wait: float = 0.0  # its first `wait` microseconds were the wait for a peer (set_waits)
    wait_duration: float = 0.0  # the same wait by the duration rule
    shared_clock: bool = False  # `wait` was read from its group's arrival times on one host clock
    contradicted: bool = False  # its durations contradict the duration rule's premise


@dataclass
class Timeline:
    """One rank's profiled steps as intervals in microseconds: what the split is computed from."""

    windows: list[Span]  # each profiled step
    optimizer: list[Span]
    compute: list[Span]
    copies: list[Span]  # FSDP's local work in its collective path
    path: list[tuple[float, float, str]]  # CPU: the main thread idle in FSDP's collective path, waiting for
    collectives: list[Collective]  # collectives in flight (gloo work-thread events, NCCL kernels)
    device: str  # "cpu" or "gpu"
    base_ns: int = 0  # the trace's clock origin: ts + base_ns / 1000 is wall-clock time in microseconds
    bytes: dict[str, int] = field(default_factory=dict)  # per kind, over all windows
    unclassified: int = 0  # collectives whose kind could not be told
    unmatched: int = 0  # collectives whose group's peers recorded another count of that kind: no wait read


def load(path: Path, torch_version: str) -> dict[str, Any]:
    """The trace's JSON; TraceError where it is missing, truncated or written by another torch."""
    try:
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"no trace at {path}") from None
    except (OSError, EOFError, ValueError) as e:
        raise TraceError(f"unreadable trace {path.name} ({type(e).__name__}: {str(e)[:80]})") from None
    meta = data.get(META_KEY) if isinstance(data, dict) else None
    written = meta.get("torch") if isinstance(meta, dict) else None
    if written != torch_version:
        raise TraceError(f"trace {path.name} was written by torch {written}, this reader knows torch "
                         f"{torch_version}'s event names")
    return data


def _us(e: dict[str, Any]) -> tuple[float, float]:
    """An event's span in the trace's microseconds."""
    return e["ts"], e["ts"] + e.get("dur", 0)


def _inside(t: float, spans: list[tuple[float, float]]) -> bool:
    return any(a <= t < b for a, b in spans)


def _numel(dims: list[Any]) -> int:
    """Elements of a tensor's recorded dims, or of a tensor list's (a list of dims)."""
    if dims and isinstance(dims[0], list):
        return sum(_numel(d) for d in dims)
    numel = 1
    for d in dims:
        numel *= d
    return numel


def _size(e: dict[str, Any], kind: str) -> tuple[int, str | None]:
    """nccl-tests' size of one c10d op from its recorded shapes, in elements, and their type where the op
    records one (a TensorList's is the collective's own: gloo's event, NCCL's kernel name): all_gather's
    output (the first argument), reduce_scatter's input (the second), all_reduce's buffer (the first)."""
    args = e.get("args", {})
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    at = 1 if kind == "reduce_scatter" else 0
    if len(dims) <= at:
        return 0, None
    return _numel(dims[at]), types[at] if len(types) > at and types[at] in DTYPE_BYTES else None


@dataclass(frozen=True)
class _Op:
    """A c10d op FSDP2 issued: when, its kind, nccl-tests' size and type, and the elements gloo runs."""

    ts: float
    kind: str
    numel: int
    dtype: str | None
    runs_numel: int  # the elements of the tensor gloo's event names: the input, or all_reduce's buffer


def _issued(events: list[dict[str, Any]], backward: list[Span], windows: list[Span]) -> list[_Op]:
    """The c10d ops issued in the windows, in order (all-gathers with the pass they were issued in)."""
    out = []
    for e in events:
        base = C10D_OPS.get(e["name"])
        if base is None or not _inside(e["ts"], windows):
            continue
        kind = base if base != "all_gather" else (
            "all_gather_bwd" if _inside(e["ts"], backward) else "all_gather_fwd")
        numel, dtype = _size(e, base)
        dims = e.get("args", {}).get("Input Dims") or []
        runs = dims[0] if base == "all_reduce" else (dims[1] if len(dims) > 1 else [])
        out.append(_Op(e["ts"], kind, numel, dtype, _numel(runs) if runs else 0))
    return sorted(out, key=lambda o: o.ts)


def timeline(data: dict[str, Any]) -> Timeline:
    """The profiled steps of one rank's trace as intervals (GPU where it holds kernels, else CPU)."""
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e and "name" in e]
    # the host's range (a GPU trace holds its kernels' span too, as a `gpu_user_annotation`)
    steps = [e for e in events if e["name"] == STEP_RANGE and e.get("cat") == "user_annotation"]
    if not steps:
        raise TraceError(f"the trace holds no {STEP_RANGE} range (no profiled step)")
    main = steps[0]["tid"]
    windows = sorted(_us(e) for e in steps)
    # every host thread: on a GPU autograd runs the backward (FSDP's ranges, its c10d ops) on a thread of
    # its own; on a CPU on the main thread, beside gloo's work threads (which issue nothing)
    anywhere = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    host = [e for e in anywhere if e.get("tid") == main]
    backward = [_us(e) for e in anywhere if e["name"].startswith("FSDP::") and "backward" in e["name"]]
    optimizer = [_us(e) for e in host if e["name"].startswith("Optimizer.step")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    tl = _gpu(kernels, events, anywhere, optimizer, windows) if kernels else _cpu(events, host, main, windows,
                                                                                  optimizer)
    tl.base_ns = int(data.get("baseTimeNanoseconds") or 0)
    _kinds_from_ops(tl, _issued(anywhere, backward, windows))
    return tl


def _kinds_from_ops(tl: Timeline, ops: list[_Op]) -> None:
    """Give each collective in flight the kind of the op that issued it. NCCL runs each kind's kernels in
    launch order; gloo's threads serve one process group each, so a gloo event takes the earliest op issued
    before it of a collective it can be, of the same element count where one has it. One no op accounts for
    stays unclassified. Bytes per kind from the ops' sizes."""
    flights = sorted(tl.collectives, key=lambda c: c.start)
    matched: dict[int, Collective] = {}
    if tl.device == "gpu":
        for base in ("all_gather", "reduce_scatter", "all_reduce"):
            free = [i for i, o in enumerate(ops) if BASE[o.kind] == base]
            for c, i in zip([c for c in flights if c.runs == (base,)], free):
                matched[i] = c
    else:
        free = list(range(len(ops)))
        for c in flights:
            fits = [i for i in free if BASE[ops[i].kind] in c.runs and ops[i].ts <= c.start]
            same = [i for i in fits if ops[i].runs_numel == c.numel]
            if same or fits:
                matched[(same or fits)[0]] = c
                free.remove((same or fits)[0])
    for i, c in matched.items():
        c.kind, c.issued = ops[i].kind, ops[i].ts
    for i, o in enumerate(ops):
        dtype = o.dtype or (matched[i].dtype if i in matched else None)
        tl.bytes[o.kind] = tl.bytes.get(o.kind, 0) + o.numel * DTYPE_BYTES.get(dtype or "", 0)
    tl.unclassified = sum(1 for c in flights if c.kind not in KINDS)


def _role(e: dict[str, Any]) -> tuple[str, str | None]:
    """What a main-thread event is to the split: a c10d op (issuing a collective: FSDP's local work), a
    range of FSDP's collective path (with what it waits for there), another op, or another range."""
    if e["name"] in C10D_OPS:
        return "c10d", C10D_OPS[e["name"]]
    hint = next((h for prefix, h in FSDP_COLLECTIVE_RANGES if e["name"].startswith(prefix)), None)
    if hint is not None:
        return "path", hint
    return ("op" if e.get("cat") == "cpu_op" else "range"), None


def _innermost(stack: list[tuple[float, float, str, str | None]]) -> tuple[str, str | None] | None:
    """What the main thread does under a stack of nested events: the innermost op is compute, or FSDP's
    local work where a collective range or c10d op holds it; the innermost collective range with no op in
    it is an idle wait (what for); nothing of either is None (host, idle)."""
    for i in range(len(stack) - 1, -1, -1):
        role, hint = stack[i][2], stack[i][3]
        if role == "c10d" or (role == "op" and any(s[2] in ("path", "c10d") for s in stack[:i])):
            return "copies", None
        if role == "op":
            return "compute", None
        if role == "path":
            return "path", hint
    return None


def _main_thread(host: list[dict[str, Any]]) -> tuple[list[Span], list[Span], list[tuple[float, float, str]]]:
    """The main thread's nested events flattened into what it does at each moment: compute, copies (FSDP's
    local work in its collective path) and path (idle inside that path: a wait, and for which collective)."""
    events = sorted(((*_us(e), *_role(e)) for e in host if e.get("dur", 0) > 0), key=lambda x: (x[0], -x[1]))
    bounds = sorted({t for s, e, _, _ in events for t in (s, e)})
    out: dict[str, list[Any]] = {"compute": [], "copies": [], "path": []}
    stack: list[tuple[float, float, str, str | None]] = []
    i, last = 0, None
    for a, b in zip(bounds, bounds[1:]):
        stack = [s for s in stack if s[1] > a]
        while i < len(events) and events[i][0] <= a:
            if events[i][1] > a:
                stack.append(events[i])
            i += 1
        now = _innermost(stack)
        if now is None:
            last = None
            continue
        spans = out[now[0]]
        if last == now and spans and spans[-1][1] == a:  # the same activity goes on: one span
            spans[-1] = (spans[-1][0], b, *spans[-1][2:])
        else:
            spans.append((a, b) if now[0] != "path" else (a, b, now[1]))
        last = now
    return out["compute"], out["copies"], out["path"]


def _cpu(events: list[dict[str, Any]], host: list[dict[str, Any]], main: int, windows: list[Span],
         optimizer: list[Span]) -> Timeline:
    """gloo: collectives run on gloo's work threads (`gloo:*` events); the main thread computes, does FSDP's
    local work around them, or idles in FSDP's collective path while one it waits for runs."""
    compute, copies, path = _main_thread(host)
    flights = []
    for e in events:
        if e.get("tid") == main or not e["name"].startswith("gloo:") or not _inside(e["ts"], windows):
            continue
        args = e.get("args", {})
        dims = args.get("Input Dims") or []
        flights.append(Collective("", *_us(e), runs=GLOO_RUNS.get(e["name"][len("gloo:"):], ()),
                                  numel=_numel(dims[0]) if dims else None,
                                  dtype=(args.get("Input type") or [None])[0]))
    return Timeline(windows, optimizer, compute, copies, path, flights, "cpu")


def _nccl_kind(name: str) -> str | None:
    """An NCCL kernel's base kind ("unknown" for one FSDP2 does not issue); None for any other kernel."""
    if not name.startswith("nccl"):
        return None
    return next((k for word, k in NCCL_KERNELS if word in name), "unknown")


def _nccl_dtype(name: str) -> str | None:
    """The element type an NCCL kernel's name carries (reductions: "..._Sum_f32_..."), as the profiler
    names types."""
    return next((t for word, t in NCCL_DTYPES if word in name), None)


def _gpu(kernels: list[dict[str, Any]], events: list[dict[str, Any]], anywhere: list[dict[str, Any]],
         optimizer: list[Span], windows: list[Span]) -> Timeline:
    """CUDA: kernels on their streams. NCCL kernels are the collectives; every other kernel is the
    optimizer's where its launch (same correlation id) lies in `Optimizer.step`, FSDP's local work where it
    lies in one of FSDP's collective ranges on the launching thread, else compute."""
    launches = {e["args"]["correlation"]: (e.get("tid"), e["ts"]) for e in events  # runtime, driver APIs
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ranges: dict[Any, list[Span]] = {}
    for e in anywhere:
        if _role(e)[0] in ("path", "c10d"):
            ranges.setdefault(e.get("tid"), []).append(_us(e))
    compute, copies, opt, flights = [], [], [], []
    for k in kernels:
        span, kind = _us(k), _nccl_kind(k["name"])
        if kind is not None:
            runs = (kind,) if kind in GLOO_RUNS else ()
            flights.append(Collective("", *span, runs=runs, dtype=_nccl_dtype(k["name"])))
            continue
        tid, launched = launches.get(k.get("args", {}).get("correlation"), (None, -1.0))
        (opt if _inside(launched, optimizer) else copies if _inside(launched, ranges.get(tid, []))
         else compute).append(span)
    return Timeline(windows, opt, compute, copies, [], flights, "gpu")


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


def record(run_step: Callable[[int], None], steps: range, path: Path | None, cuda: bool,
           meta: dict[str, Any]) -> tuple[list[float], str | None]:
    """Run `steps` (every rank must: they hold collectives), each inside a STEP_RANGE range, under
    torch.profiler where `path` is set, and write the trace there; returns each step's seconds by
    perf_counter, the clock the split is checked against, and why no trace was written where the write
    failed (a full disk): the run keeps its figures, its split says why it has none."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    times: list[float] = []

    def one(step: int) -> None:
        began = time.perf_counter()
        with record_function(STEP_RANGE):
            run_step(step)
        times.append(time.perf_counter() - began)
    if path is None:
        for step in steps:
            one(step)
        return times, None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        prof.add_metadata_json(META_KEY, json.dumps({**meta, "torch": torch.__version__}))
        for step in steps:
            one(step)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))  # a .gz name: torch compresses it
    except OSError as e:
        with contextlib.suppress(OSError):
            path.unlink()  # no half-written trace left behind
        return times, f"trace not written to {path.parent} ({e.strerror or e})"
    return times, None


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
