"""Each run's own profiler trace, read back into one rank's timeline (recording it: trainer/trace_record.py).

A traced rank's steps run inside `fsdpbench::step` ranges (STEP_RANGE), and its trace carries the torch
version that wrote it (`fsdpbench` metadata, META_KEY), since the event names it is read by are torch's.

Reading. `timeline` turns one rank's trace into a Timeline: its profiled steps and, within them, what the
rank did, on a CPU (the main thread, gloo's work threads) or on a GPU (kernels on their streams): the
optimizer, compute, FSDP's local work around its collectives, the main thread idle in FSDP's collective
path, and the collectives in flight, each with its kind.

Kinds (all_gather_fwd, all_gather_bwd when issued under a backward range, reduce_scatter, all_reduce) are
those of the c10d op that issued the collective: gloo names FSDP2's reduce-scatter `gloo:all_reduce` on its
work threads, and its threads serve one process group each, not in one global order, so each gloo event is
matched to the earliest issued op before it of a compatible collective and the same element count. Bytes
per kind follow nccl-tests: all_gather the gathered output, reduce_scatter the unreduced input, all_reduce
the buffer.

What the timeline is then cut into is trainer/trace_split.py's; each collective's wait for its peers,
trainer/trace_waits.py's.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("all_gather_fwd", "all_gather_bwd", "reduce_scatter", "all_reduce")
BASE = {"all_gather_fwd": "all_gather", "all_gather_bwd": "all_gather", "reduce_scatter": "reduce_scatter",
        "all_reduce": "all_reduce"}
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
