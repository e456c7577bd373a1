"""Each run's own profiler trace, and the split of its step into where the time went.

Recording. After its timed steps a rank runs `steps` more under torch.profiler (the throughput figures stay
those of unprofiled steps), each inside a `fsdpbench::step` range, and writes a gzip-compressed Chrome trace
(Perfetto, chrome://tracing) named by rank; the trace carries the torch version that wrote it
(`fsdpbench` metadata), since the event names it is read by are torch's.

The split. The profiled step (the `fsdpbench::step` range) is cut at every event boundary and each piece
given to one part, first match wins:
  optimizer   inside `Optimizer.step` (on a GPU: its kernels);
  compute     on a GPU, a kernel other than NCCL's runs; on a CPU, the main thread runs an op outside
              FSDP's collective path (below);
  exposed     the rank waits for a collective: on a GPU an NCCL kernel runs with no compute kernel; on a
              CPU the main thread is inside a c10d op or FSDP's collective ranges (all-gather, its copy-out,
              which waits for it, the reduce-scatter's reduce and wait), which gloo blocks;
  waiting     the exposed part of a collective's first d - min(d over ranks) seconds: the rank that came
              first waits there for the last (the last to arrive spends the least in it), so the
              difference is the wait for a peer, clock-free across nodes;
  other       nothing of the above: the host (Python, launches), data, idle.
A collective running while the step computes is `overlapped` (per kind, beside the parts, not in their sum).
Kinds: all_gather_fwd, all_gather_bwd (issued under a backward range), reduce_scatter, all_reduce, from
the c10d op that issued it; gloo runs each on its work threads in the order issued, and gloo's
reduce-scatter is an all_reduce there, so its thread events take the kinds of the issuing ops in order.
Bytes per kind follow nccl-tests: all_gather the gathered output, reduce_scatter the unreduced input,
all_reduce the buffer.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("all_gather_fwd", "all_gather_bwd", "reduce_scatter", "all_reduce")
PARTS = ("compute", *(f"exposed_{k}" for k in KINDS), "waiting", "optimizer", "other")
STEP_RANGE = "fsdpbench::step"
META_KEY = "fsdpbench"  # the trace's metadata: the torch version and rank that wrote it
# the c10d ops FSDP2 issues, by the collective they are (torch 2.13's dispatcher names)
C10D_OPS = {"c10d::_allgather_base_": "all_gather", "c10d::allgather_into_tensor_coalesced": "all_gather",
            "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::reduce_scatter_tensor_coalesced":
            "reduce_scatter", "c10d::allreduce_": "all_reduce", "c10d::allreduce_coalesced_": "all_reduce"}
# FSDP2's ranges (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py) in which the main thread
# issues, waits for and copies out a collective: on a CPU, time there is the collective's, not compute
FSDP_COLLECTIVE_RANGES = (("FSDP::all_gather", "all_gather"),  # its copy-out too, which waits for it
                          ("FSDP::post_backward_reduce", "reduce_scatter"),
                          ("FSDP::post_backward_rs_wait", "reduce_scatter"))
NCCL_KERNELS = (("AllGather", "all_gather"), ("ReduceScatter", "reduce_scatter"), ("AllReduce", "all_reduce"))
NCCL_DTYPES = (("_bf16", "c10::BFloat16"), ("_f16", "c10::Half"), ("_f32", "float"), ("_f64", "double"))
DTYPE_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
               "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e5m2": 1}


class TraceError(ValueError):
    """A trace this reader cannot split (missing, truncated, another torch, no profiled step)."""


@dataclass
class Collective:
    kind: str  # one of KINDS, or "" where its issuing op is unknown
    start: float  # seconds (trace clock)
    end: float
    wait: float = 0.0  # its first `wait` seconds were spent waiting for a peer
    dtype: str | None = None  # its element type where the event names one (gloo's args, NCCL's name)


@dataclass
class Timeline:
    """One rank's profiled steps as intervals in seconds: what the split is computed from."""

    windows: list[tuple[float, float]]  # each profiled step
    optimizer: list[tuple[float, float]]
    compute: list[tuple[float, float]]
    blocked: list[tuple[float, float, str]]  # the rank held in a collective's path (CPU: FSDP's ranges)
    collectives: list[Collective]  # collectives in flight (gloo work-thread events, NCCL kernels)
    exposed_over_compute: bool  # CPU: blocked wins over an op nested in it; GPU: compute hides NCCL
    bytes: dict[str, int] = field(default_factory=dict)  # per kind, over all windows
    unclassified: int = 0  # collectives whose kind could not be told


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


def _issued(events: list[dict[str, Any]], backward: list[tuple[float, float]],
            windows: list[tuple[float, float]]) -> list[tuple[float, str, tuple[int, str | None]]]:
    """The c10d ops issued in the windows, in order: (start, kind with the pass for all-gathers, size)."""
    out = []
    for e in events:
        base = C10D_OPS.get(e["name"])
        if base is None or not _inside(e["ts"], windows):
            continue
        kind = base if base != "all_gather" else (
            "all_gather_bwd" if _inside(e["ts"], backward) else "all_gather_fwd")
        out.append((e["ts"], kind, _size(e, base)))
    return sorted(out)


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
    issued = _issued(anywhere, backward, windows)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    tl = (_gpu(kernels, events, optimizer, windows) if kernels
          else _cpu(events, host, main, windows, optimizer, backward))
    _kinds_in_order(tl, issued)
    return tl


def _kinds_in_order(tl: Timeline, issued: list[tuple[float, str, tuple[int, str | None]]]) -> None:
    """Give each collective in flight the kind of the op that issued it, in order: gloo's work threads take
    every kind from one queue (its events are named for gloo's algorithm: kind ""), NCCL runs each kind's
    kernels in launch order (named for their base kind: the pass comes from the op). One the issuing ops
    do not account for stays unclassified. Bytes per kind from the ops' sizes."""
    flights = sorted(tl.collectives, key=lambda c: c.start)
    matched: dict[int, Collective] = {}
    for base in ("all_gather", "reduce_scatter", "all_reduce", ""):
        ops = [i for i, (_, k, _) in enumerate(issued) if k.startswith(base) and i not in matched]
        for c, i in zip([c for c in flights if c.kind == base], ops):
            c.kind, matched[i] = issued[i][1], c
    for i, (_, kind, (numel, dtype)) in enumerate(issued):
        dtype = dtype or (matched[i].dtype if i in matched else None)
        tl.bytes[kind] = tl.bytes.get(kind, 0) + numel * DTYPE_BYTES.get(dtype or "", 0)
    tl.unclassified = sum(1 for c in flights if c.kind not in KINDS)


def _cpu(events: list[dict[str, Any]], host: list[dict[str, Any]], main: int,
         windows: list[tuple[float, float]], optimizer: list[tuple[float, float]],
         backward: list[tuple[float, float]]) -> Timeline:
    """gloo: collectives run on gloo's work threads (`gloo:*` events); the main thread computes, or is held
    in FSDP's collective path (it blocks there until gloo finishes)."""
    blocked = []
    for e in host:
        kind = C10D_OPS.get(e["name"]) or next((k for prefix, k in FSDP_COLLECTIVE_RANGES
                                                if e["name"].startswith(prefix)), None)
        if kind == "all_gather":
            kind = "all_gather_bwd" if _inside(e["ts"], backward) else "all_gather_fwd"
        if kind is not None:
            blocked.append((*_us(e), kind))
    compute = [_us(e) for e in host if e.get("cat") == "cpu_op"]
    flights = [Collective("", *_us(e), dtype=(e.get("args", {}).get("Input type") or [None])[0])
               for e in events
               if e.get("tid") != main and e["name"].startswith("gloo:") and _inside(e["ts"], windows)]
    return Timeline(windows, optimizer, compute, blocked, flights, exposed_over_compute=True)


def _nccl_kind(name: str) -> str | None:
    """An NCCL kernel's base kind ("unknown" for one FSDP2 does not issue); None for any other kernel."""
    if not name.startswith("nccl"):
        return None
    return next((k for word, k in NCCL_KERNELS if word in name), "unknown")


def _nccl_dtype(name: str) -> str | None:
    """The element type an NCCL kernel's name carries (reductions: "..._Sum_f32_..."), as the profiler
    names types."""
    return next((t for word, t in NCCL_DTYPES if word in name), None)


def _gpu(kernels: list[dict[str, Any]], events: list[dict[str, Any]], optimizer: list[tuple[float, float]],
         windows: list[tuple[float, float]]) -> Timeline:
    """CUDA: kernels on their streams. NCCL kernels are the collectives; every other kernel is compute,
    or the optimizer's where its launch (same correlation id) lies in `Optimizer.step`."""
    launches = {e["args"]["correlation"]: e["ts"] for e in events  # runtime and driver API launches
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    compute, opt, flights = [], [], []
    for k in kernels:
        span, kind = _us(k), _nccl_kind(k["name"])
        if kind is not None:
            flights.append(Collective(kind, *span, dtype=_nccl_dtype(k["name"])))
        elif _inside(launches.get(k.get("args", {}).get("correlation"), -1.0), optimizer):
            opt.append(span)
        else:
            compute.append(span)
    blocked = [(c.start, c.end, c.kind) for c in flights]
    return Timeline(windows, opt, compute, blocked, flights, exposed_over_compute=False)


def collective_durations(tl: Timeline) -> dict[str, list[float]]:
    """Each kind's collectives' durations (microseconds) in order: what the ranks exchange for the waits."""
    out: dict[str, list[float]] = {}
    for c in sorted(tl.collectives, key=lambda c: c.start):
        out.setdefault(c.kind, []).append(c.end - c.start)
    return out


def set_waits(tl: Timeline, all_ranks: Iterable[dict[str, list[float]] | None]) -> None:
    """A collective's wait for a peer: its duration less the shortest of the same collective (same kind,
    same place in order) on any rank that recorded one."""
    shortest: dict[str, list[float]] = {}
    for durations in all_ranks:
        for kind, values in (durations or {}).items():
            known = shortest.setdefault(kind, list(values))
            for i, v in enumerate(values[:len(known)]):
                known[i] = min(known[i], v)
    seen: dict[str, int] = {}
    for c in sorted(tl.collectives, key=lambda c: c.start):
        i = seen[c.kind] = seen.get(c.kind, -1) + 1
        floor = shortest.get(c.kind, [])
        c.wait = max(0.0, (c.end - c.start) - floor[i]) if i < len(floor) else 0.0


@dataclass
class _State:
    """What is active on a piece of the step, as the sweep over the event boundaries keeps it."""

    counts: dict[str, int] = field(default_factory=lambda: {"window": 0, "optimizer": 0, "compute": 0})
    held: dict[int, tuple[float, str]] = field(default_factory=dict)  # blocked spans: start, base kind
    flying: dict[int, Collective] = field(default_factory=dict)
    waiting: set[int] = field(default_factory=set)  # collectives in their first `wait` microseconds


def _marks(tl: Timeline) -> list[tuple[float, int, str, int]]:
    """Every span's opening (+1) and closing (-1) as (time, delta, what, index), in time order."""
    marks: list[tuple[float, int, str, int]] = []

    def add(start: float, end: float, what: str, i: int = 0) -> None:
        if end > start:
            marks.extend(((start, 1, what, i), (end, -1, what, i)))
    for what, spans in (("window", tl.windows), ("optimizer", tl.optimizer), ("compute", tl.compute)):
        for s, e in spans:
            add(s, e, what)
    for i, (s, e, _) in enumerate(tl.blocked):
        add(s, e, "held", i)
    for i, c in enumerate(tl.collectives):
        add(c.start, c.end, "flying", i)
        add(c.start, min(c.end, c.start + c.wait), "waiting", i)
    return sorted(marks, key=lambda m: (m[0], m[1]))


def _apply(state: _State, tl: Timeline, delta: int, what: str, i: int) -> None:
    if what in state.counts:
        state.counts[what] += delta
    elif what == "held":
        if delta > 0:
            state.held[i] = (tl.blocked[i][0], tl.blocked[i][2])
        else:
            state.held.pop(i, None)
    elif what == "flying":
        if delta > 0:
            state.flying[i] = tl.collectives[i]
        else:
            state.flying.pop(i, None)
    elif delta > 0:
        state.waiting.add(i)
    else:
        state.waiting.discard(i)


def split(tl: Timeline) -> dict[str, Any]:
    """Seconds per profiled step in each part (they partition it), the overlapped seconds per kind, and per
    kind the collectives' seconds, bytes and count per step."""
    parts = dict.fromkeys(PARTS, 0.0)
    overlapped = dict.fromkeys(KINDS, 0.0)
    state, marks = _State(), _marks(tl)
    for (t, delta, what, i), nxt in zip(marks, [*marks[1:], None]):
        _apply(state, tl, delta, what, i)
        if nxt is None or nxt[0] <= t or state.counts["window"] <= 0:
            continue
        parts[_part(state, tl.exposed_over_compute, nxt[0] - t, overlapped)] += nxt[0] - t
    n = len(tl.windows)
    seconds: dict[str, float] = {}
    count: dict[str, int] = {}
    for c in tl.collectives:
        seconds[c.kind] = seconds.get(c.kind, 0.0) + c.end - c.start
        count[c.kind] = count.get(c.kind, 0) + 1
    collectives = {k: {"bytes": tl.bytes.get(k, 0) // n, "s": seconds.get(k, 0.0) / n / 1e6,
                       "count": count.get(k, 0) // n} for k in KINDS if k in count or k in tl.bytes}
    return {"parts": {k: v / n / 1e6 for k, v in parts.items()},
            "overlapped": {k: v / n / 1e6 for k, v in overlapped.items()},
            "step_s": sum(b - a for a, b in tl.windows) / n / 1e6, "collectives": collectives,
            "unclassified": tl.unclassified, "steps": n,
            "device": "cpu" if tl.exposed_over_compute else "gpu"}


def _part(state: _State, exposed_over_compute: bool, length: float, overlapped: dict[str, float]) -> str:
    """The part of one piece of a step (see the module docstring)."""
    if state.counts["optimizer"] > 0:
        return "optimizer"
    flying = sorted((c for c in state.flying.values() if c.kind in KINDS), key=lambda c: c.start)
    held = sorted(state.held.values())
    if state.counts["compute"] > 0 and not (held and exposed_over_compute):
        for kind in {c.kind for c in flying}:
            overlapped[kind] += length
        return "compute"
    if not held:
        return "other"
    base = held[-1][1]  # the innermost: a c10d op inside FSDP's range
    mine = [c for c in flying if c.kind.startswith(base)] or flying
    waited = {id(state.flying[i]) for i in state.waiting if i in state.flying}
    if any(id(c) in waited for c in mine):
        return "waiting"
    if mine:
        return f"exposed_{mine[0].kind}"
    # in a collective's path with none in flight (issuing it, copying out): the path's own kind
    return f"exposed_{base}" if base in KINDS else "other"


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


def analyse(path: Path | None, exchange: Callable[[Any], list[Any]],
            ) -> tuple[dict[str, Any] | None, str | None]:
    """This rank's split from its trace, the collectives' durations exchanged with every rank (`exchange`:
    an all_gather_object, which every rank calls, recording or not). Never raises: a trace that cannot be
    read leaves (None, why)."""
    import torch
    tl, error = None, None
    if path is not None:
        try:
            tl = timeline(load(path, torch.__version__))
        except TraceError as e:
            error = str(e)
        except Exception as e:  # a trace of a shape this reader does not know: the run stays ok
            error = f"trace {path.name} could not be split ({type(e).__name__}: {str(e)[:120]})"
    everyone = exchange(collective_durations(tl) if tl else None)
    if tl is None:
        return None, error
    set_waits(tl, everyone)
    return split(tl), None
