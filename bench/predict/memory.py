"""Each planned run's per-GPU memory before launch: measured by the worker's own code on fake tensors
(`python -m trainer.memory`, which this module runs as a command: bench never imports torch), cached per
configuration. Where a measurement cannot run (memory.measure=false, no torch where the sweep plans, a
measurement past memory.timeout_s or one that fails) the figure is the exact lower bound: the sharded
parameters, gradients and AdamW state every GPU holds. It prunes only runs that surely cannot fit; a run
it lets through that does not fit ends `oom`, and micro_batch auto halves from there.

Why a bound and not a formula where nothing is measured: a guess presented as a figure launches an OOM
or prunes a feasible run (docs/memory.md, "The lower bound where nothing is measured").

A configuration is every spec field that changes memory (MEMORY_FIELDS, the nodes and GPUs per node as
the ranks a parameter is split across) plus a fingerprint of what measured it: the worker's sources and the
torch, transformers and torchao versions. A change to the worker or a library measures again; a new sweep
over known configurations plans at once. The worker measures a deep model on two shallow copies of it
(trainer/memory.py says why that is exact), so a configuration costs seconds whatever the model's depth.

What a GPU needs beyond the tensors the tracker counts is the headroom below: each figure is a planning
assumption, and the report checks it on every GPU run (reserved / allocated for fragmentation, NVML used
- reserved for the CUDA context and NCCL).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench.core.config import SweepConfig
from bench.core.flops import GIB, PARAM_BYTES, shard_size, state_bytes_per_param
from bench.core.models import count_params
from bench.core.records import parse_records
from bench.core.rundir import atomic_write_text
from bench.core.schema import RunSpec
from bench.launchers.base import PROJECT_ROOT
from bench.launchers.processes import command_env, die_with_parent

MEMORY_FIELDS = ("model", "nodes", "gpus_per_node", "sharding", "precision", "activation_checkpointing",
                 "wrap_policy", "offload", "micro_batch", "seq_len")
WORKER_SOURCES = ("trainer", "bench/core")  # the code the measurement runs
LIBRARIES = ("torch", "transformers", "torchao")

# Inside torch's allocator but not a tensor the tracker sees: cuBLAS's and cuBLASLt's workspaces, 32 MiB
# each on Hopper (cuBLAS's recommended size there; less on older GPUs, so a bound). On an H200
# (benchmarks/evidence/NVIDIA-H200_*): every run's torch.cuda.max_memory_allocated was the fake-tensor peak
# plus 64.0 MiB (tiny to 113 GiB; fp32 with AC full: 1 GiB more, one T x T the GPU's recompute holds).
# Added to the planned figure on a GPU cluster (cluster.gpu set), so it reads as the allocator's peak.
CUBLAS_WORKSPACE_GIB = 64 / 1024
# Headroom beyond the allocator's peak (per GPU):
# CUDA context, cuBLAS/cuDNN handles, loaded kernels: outside torch's allocator. Evidence: NVML's used -
# torch's reserved on one rank with its one communicator (benchmarks/evidence/README.md, "Headroom").
CUDA_CONTEXT_GIB = 1.5
# NCCL's buffers per communicator: NCCL_BUFFSIZE (4 MiB, NCCL's environment-variable docs) for each of the 2
# ring neighbours, 32 channels (NCCL_MAX_NCHANNELS' default) and 2 protocols (Simple, LL128) = 0.5 GiB.
NCCL_GIB_PER_COMMUNICATOR = 0.5
# torch's caching allocator: reserved beyond allocated, as a fraction of the allocated peak, where it decides
# a fit (an allocated peak of half the GPU or more). An empirical bound, the largest ratio the GPU evidence
# holds (benchmarks/evidence/README.md, "Headroom"); the gpucheck holds every GPU run to it. On 80 GiB it
# lowers the largest peak that fits from 66.7 to 65.0 GiB.
FRAGMENTATION = 0.20


MEASURE_OFF = "memory.measure=false"


def communicators(spec: RunSpec) -> int:
    """NCCL communicators a rank holds: the world's; HYBRID_SHARD adds its intra- and inter-node groups."""
    return 3 if spec.sharding == "HYBRID_SHARD" else 1


@dataclass(frozen=True)
class MemoryFigure:
    """What the planner knows of one run's memory, and where it came from."""

    gpu_gib: float  # per GPU: the measured peak of allocated tensors, else the lower bound
    host_gib: float  # per GPU: offloaded state in host memory (offload=cpu)
    source: str  # "measured" (fake tensors) or "lower bound"
    note: str | None = None  # why not measured, where it was not
    categories: dict[str, float] = field(default_factory=dict)  # measured: GiB per tracker category

    def need_gib(self, spec: RunSpec) -> float:
        """Per GPU, with the headroom: what the run needs of the GPU's memory."""
        return (self.gpu_gib * (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB
                + NCCL_GIB_PER_COMMUNICATOR * communicators(spec))


def states_gib(spec: RunSpec, accumulating: bool | None = None) -> float:
    """Per GPU, the sharded parameters, gradients and AdamW state: what any step's peak holds at least; under
    sync_once accumulation (the spec's, else `accumulating`) the gradients whole, as they build up
    unsharded until the step's last micro-batch (in the parameters' dtype: fp32 master weights under mixed
    precision, trainer/test_memory.py)."""
    params = count_params(spec.arch)
    shard = shard_size(spec.sharding, spec.nodes, spec.gpus_per_node)
    states = params * state_bytes_per_param(spec.precision) / shard
    if spec.accumulation == "sync_once" and (spec.grad_accum > 1 if accumulating is None else accumulating):
        states += params * PARAM_BYTES[spec.precision] * (1 - 1 / shard)
    return states / GIB


def state_fits(spec: RunSpec, limit: float | None) -> bool:
    """Whether the GPU holds the state alone (on the host under offload=cpu): else the run is infeasible
    without measuring."""
    return limit is None or lower_bound(spec, "").gpu_gib <= limit


def lower_bound(spec: RunSpec, note: str) -> MemoryFigure:
    """The figure where nothing was measured: the state alone, in host memory under offload=cpu."""
    states = states_gib(spec)
    on_host = spec.offload == "cpu"
    return MemoryFigure(0.0 if on_host else states, states if on_host else 0.0, "lower bound", note)


def configuration(spec: RunSpec) -> dict[str, Any]:
    """What a measurement depends on in the spec: MEMORY_FIELDS, with the ranks a parameter is split across
    in place of the nodes and GPUs per node (a rank holds its shard group's tensors: HYBRID_SHARD's peak
    is the same on 1 node as on 16, NO_SHARD's on any number of ranks; benchmarks/memory_plan.py --check
    measures every configuration of the GPU sweeps by its own world size and compares), and a brought
    model's config (a preset's empty one is left out)."""
    fields = {name: getattr(spec, name) for name in MEMORY_FIELDS if name not in ("nodes", "gpus_per_node")}
    fields["shard_ranks"] = shard_size(spec.sharding, spec.nodes, spec.gpus_per_node)
    if spec.model_config:
        fields["model_config"] = spec.model_config
    if spec.grad_accum > 1:  # a step of several micro-batches is measured over two, in its mode
        fields["accumulation"] = spec.accumulation
    return fields


def memory_key(spec: RunSpec, cuda: bool = False) -> str:
    """The cache key: the configuration, what measures it, and whether as a CUDA GPU runs it (some
    configurations take another attention kernel there: trainer.memory.gpu_attention)."""
    measured = [configuration(spec), fingerprint()] + (["cuda"] if cuda else [])
    return hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest()[:16]


@functools.cache
def fingerprint() -> str:
    """The worker's sources and the library versions that measure: a change to either measures again."""
    digest = hashlib.sha256()
    for package in WORKER_SOURCES:
        for path in sorted((PROJECT_ROOT / package).glob("*.py")):
            if not path.name.startswith("test_"):
                digest.update(path.name.encode() + path.read_bytes())
    for lib in LIBRARIES:
        try:
            digest.update(f"{lib}={importlib.metadata.version(lib)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{lib}=none".encode())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fsdpbench"


class MemoryPlanner:
    """Measured memory figures for a sweep's runs: cached ones at once, missing ones measured by
    `memory.workers` worker processes side by side, each fed the next configuration when it answers."""

    def __init__(self, cfg: SweepConfig, out: TextIO | None = None) -> None:
        self.cfg, self.out = cfg, out or sys.stdout  # looked up now: the stdout of whoever plans
        self.dir = Path(cfg.memory.cache_dir or default_cache_dir()) / "memory"
        self.cuda = cfg.cluster.gpu is not None  # measured as a CUDA GPU runs it (worker's --cuda)
        self.measured = self.cached = 0
        self.unavailable = None if importlib.util.find_spec("torch") else (
            "torch is not installed where the sweep plans (pip install torch to measure)")
        self._known: dict[str, MemoryFigure] = {}
        self._pool: Measurers | None = None  # kept between prefetches (a micro batch search's rounds)

    def figure(self, spec: RunSpec) -> MemoryFigure:
        """The run's memory figure, measuring its configuration now if nobody has yet."""
        self.prefetch([spec])
        return self._known[memory_key(spec, self.cuda)]

    def prefetch(self, specs: Iterable[RunSpec]) -> None:
        """Measure every distinct configuration among specs that is not known yet, in parallel."""
        todo: dict[str, RunSpec] = {}
        for spec in specs:
            key = memory_key(spec, self.cuda)
            if key in self._known or key in todo:
                continue
            if figure := self._without_measuring(spec):
                self._known[key] = figure
            elif cached := self._read(key, spec):
                self._known[key], self.cached = cached, self.cached + 1
            else:
                todo[key] = spec
        if todo:
            self._measure(todo)

    def _without_measuring(self, spec: RunSpec) -> MemoryFigure | None:
        """The lower bound where measuring is off, impossible, or cannot change the answer."""
        if not self.cfg.memory.measure:
            return lower_bound(spec, f"not measured ({MEASURE_OFF})")
        if self.unavailable:
            return lower_bound(spec, f"not measured: {self.unavailable}")
        if not state_fits(spec, self.cfg.cluster.gpu_memory_gib):
            return lower_bound(spec, "not measured: parameters, gradients and AdamW state alone do not fit")
        return None

    def _read(self, key: str, spec: RunSpec) -> MemoryFigure | None:
        try:
            data = json.loads((self.dir / f"{key}.json").read_text())
            return _figure(spec, data, self.cuda)
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent or unreadable: measure again

    def _measure(self, todo: dict[str, RunSpec]) -> None:
        workers = min(self.cfg.memory.workers, len(todo))
        print(f"memory: measuring {len(todo)} configuration(s) on fake tensors with {workers} process(es), "
              f"cached in {self.dir}", file=self.out, flush=True)
        biggest_first = sorted(todo.values(), key=lambda s: -count_params(s.arch) * s.world_size)
        if self._pool is None:
            self._pool = Measurers(self.cfg.memory.workers, self.cfg.memory.timeout_s,
                                   ("--cuda",) if self.cuda else ())
            weakref.finalize(self, self._pool.close)
        for done, (spec, result) in enumerate(self._pool.measure(biggest_first), 1):
            key = memory_key(spec, self.cuda)
            if "error" in result:
                figure = lower_bound(spec, f"not measured: {result['error']}")
            else:
                atomic_write_text(self.dir / f"{key}.json", json.dumps(_cache_entry(spec, result)))
                figure, self.measured = _figure(spec, result, self.cuda), self.measured + 1
            self._known[key] = figure
            shown = f"{figure.gpu_gib:.3g} GiB/GPU" if figure.source == "measured" else figure.note
            print(f"memory: [{done}/{len(todo)}] {spec.label}: {shown} ({result.get('seconds', 0):.0f} s)",
                  file=self.out, flush=True)

    def close(self) -> None:
        """Stop the measuring processes (the plan is made: nothing measures after it)."""
        if self._pool:
            self._pool.close()

    def summary(self) -> str:
        return f"memory: {self.measured} measured, {self.cached} from the cache ({self.dir})"


def _cache_entry(spec: RunSpec, result: dict[str, Any]) -> dict[str, Any]:
    return {"configuration": configuration(spec),
            "fingerprint": fingerprint(),
            **{k: result.get(k) for k in ("peak_gib", "host_gib", "categories", "seconds", "torch", "count_s",
                                          "flops_per_token", "hw_flops_per_token", "blocks_measured")}}


MOE_NOTE = ("routed experts' activations are not measured (routing reads values fake tensors do not have): "
            "the peak is low by what a token's top-k experts hold")


def _figure(spec: RunSpec, data: dict[str, Any], cuda: bool) -> MemoryFigure:
    """A measurement as the plan's figure: on a CUDA GPU with cuBLAS's workspaces, which the allocator
    holds beside the tensors."""
    notes = ["compile measured eager"] * spec.compile + [MOE_NOTE] * bool(spec.arch.experts)
    note = "; ".join(notes) or None
    categories = {k: float(v) for k, v in data["categories"].items()}
    workspace = CUBLAS_WORKSPACE_GIB if cuda else 0.0
    if workspace:
        categories["cublas workspace"] = workspace
    return MemoryFigure(float(data["peak_gib"]) + workspace, float(data["host_gib"]), "measured", note,
                        categories)


class _Worker:
    """One `python -m trainer.memory` process, given one spec at a time; a thread posts its answers. Started
    on the main thread, which lives as long as the sweep: the process dies with it (PR_SET_PDEATHSIG)."""

    def __init__(self, answers: queue.Queue, args: tuple[str, ...] = ()) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "trainer.memory", *args], cwd=PROJECT_ROOT,
                                     env=command_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True,
                                     preexec_fn=die_with_parent())  # dies with the sweep
        self.spec: RunSpec | None = None
        self.since = 0.0
        threading.Thread(target=self._read, args=(answers,), daemon=True).start()

    def give(self, spec: RunSpec) -> None:
        assert self.proc.stdin is not None
        self.spec, self.since = spec, time.monotonic()
        self.proc.stdin.write(json.dumps(spec.to_dict()) + "\n")
        self.proc.stdin.flush()

    def _read(self, answers: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for record in parse_records(self.proc.stdout):
            answers.put((self, record))
        answers.put((self, None))  # the process is gone

    def last_words(self) -> str:
        self.stderr.seek(0)
        lines = [ln.strip() for ln in self.stderr.read().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else f"exit code {self.proc.poll()}"

    def stop(self) -> None:
        for step in (self.proc.terminate, self.proc.kill):
            if self.proc.poll() is None:
                step()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    continue
        self.stderr.close()


class Measurers:
    """`python -m trainer.memory` processes kept between batches of specs: a search measures in rounds, and
    starting torch again for each round cost more than a round's measurements. Stopped by close(), when
    the owner is collected, or with the sweep (PR_SET_PDEATHSIG); every process is gone after a batch that
    raised (Ctrl-C included)."""

    def __init__(self, workers: int, timeout_s: float, args: tuple[str, ...] = ()) -> None:
        self.workers, self.timeout_s, self.args = workers, timeout_s, args
        self.answers: queue.Queue = queue.Queue()
        self.live: list[_Worker] = []

    def measure(self, specs: list[RunSpec]) -> Iterable[tuple[RunSpec, dict[str, Any]]]:
        """Yield (spec, memory record) as the processes answer, in the order they finish. A spec whose
        process died or stayed silent past timeout_s gets a record with `error` (and a fresh process takes
        the rest)."""
        todo = list(specs)
        while len(self.live) < min(self.workers, len(todo)):
            self.live.append(_Worker(self.answers, self.args))
        finished = False
        try:
            while todo or any(w.spec for w in self.live):
                for worker in self.live:
                    if worker.spec is None and todo:
                        worker.give(todo.pop(0))
                try:
                    worker, record = self.answers.get(timeout=1.0)
                except queue.Empty:
                    late = [w for w in self.live if w.spec and time.monotonic() - w.since > self.timeout_s]
                    for worker in late:
                        yield worker.spec, {
                            "error": f"no answer within memory.timeout_s={self.timeout_s:g} s"}
                        self._retire(worker, bool(todo))
                    continue
                if worker not in self.live:
                    continue  # a stopped worker's last words
                if record is None:  # died: its spec fails, a new process takes the rest
                    if worker.spec:
                        yield worker.spec, {"error": f"the measuring process died: {worker.last_words()}"}
                    self._retire(worker, bool(todo))
                    continue
                spec, worker.spec = worker.spec, None
                if spec is not None:
                    yield spec, record
            finished = True
        finally:
            if not finished:
                self.close()

    def _retire(self, worker: _Worker, replace: bool) -> None:
        worker.stop()
        self.live.remove(worker)
        if replace:
            self.live.append(_Worker(self.answers, self.args))

    def close(self) -> None:
        for worker in self.live:
            worker.stop()
        self.live.clear()


def measure_in_workers(specs: list[RunSpec], workers: int, timeout_s: float,
                       args: tuple[str, ...] = ()) -> Iterable[tuple[RunSpec, dict[str, Any]]]:
    """Measurers.measure once, every process gone when this returns or raises. args: the command's
    (--whole: every model stepped whole, the check benchmarks/memory_plan.py runs)."""
    pool = Measurers(workers, timeout_s, args)
    try:
        yield from pool.measure(specs)
    finally:
        pool.close()
