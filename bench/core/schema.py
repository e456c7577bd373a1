"""The one results schema: run specs, run summaries, the results-table columns, and the lists of allowed
values each field takes (this module owns them; the config, planner and workers import them).

Everything that crosses a process or file boundary is described here or in `records.py` (metric records),
and versioned by SCHEMA_VERSION.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from bench.core.models import ModelArch, arch_of

SCHEMA_VERSION = 1

# Each list of allowed values is a Literal type (the config's fields are typed with it) and the tuple of its
# values, the one read from the other (typing.get_args)
Sharding = Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"]
SHARDINGS: tuple[Sharding, ...] = get_args(Sharding)
Precision = Literal["fp32", "bf16_mixed", "fp16_mixed", "bf16_pure", "fp8_tensorwise"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)  # fp8: bf16_mixed + Float8
# cpu: FSDP2's CPUOffloadPolicy (parameters, gradients, optimizer state on host)
Offload = Literal["none", "cpu"]
OFFLOADS: tuple[Offload, ...] = get_args(Offload)
ACMode = Literal["none", "full", "selective", "selective_op"]  # selective: every 2nd block; _op: by operator
AC_MODES: tuple[ACMode, ...] = get_args(ACMode)
WrapPolicy = Literal["transformer_block", "whole_model"]
WRAP_POLICIES: tuple[WrapPolicy, ...] = get_args(WrapPolicy)
# How gradients are synchronised when a step accumulates several micro-batches (global_batch): named for what
# each does, as FSDP2 sets it (trainer/parallel.py accumulate): every micro-batch reduce-scattered (and, for
# HYBRID_SHARD, all-reduced across nodes); once per step, gradients held unsharded until the last
# micro-batch (set_requires_gradient_sync); HYBRID_SHARD's all-reduce across nodes once per step, its
# reduce-scatter within a node every micro-batch (set_requires_all_reduce); parameters kept gathered from
# one micro-batch's backward to the next one's forward (set_reshard_after_backward)
Accumulation = Literal["sync_each", "sync_once", "allreduce_once", "keep_gathered"]
ACCUMULATIONS: tuple[Accumulation, ...] = get_args(Accumulation)
RUN_KINDS = ("train", "nccl", "preflight")  # preflight: one node's facts and speed alone
# What an nccl probe measures: the all-reduce (NO_SHARD, HYBRID_SHARD's replicate step) and the two
# collectives FULL_SHARD and SHARD_GRAD_OP run (nccl-tests' <name>_perf binaries, bench/probes/command.py)
Collective = Literal["all_reduce", "all_gather", "reduce_scatter"]
COLLECTIVES: tuple[Collective, ...] = get_args(Collective)
# test hook; sleep: no work, just the time; slow_collective: every step, before issuing each collective of
# one kind (FAULT_COLLECTIVES), the rank sleeps (outside compute); slow_compute: one rank computes longer
Fault = Literal["none", "oom", "nan", "hang", "crash", "sleep", "slow_collective", "slow_compute"]
FAULTS: tuple[Fault, ...] = get_args(Fault)
FaultCollective = Collective  # FSDP2's torch.distributed calls: the three the probes measure
FAULT_COLLECTIVES: tuple[FaultCollective, ...] = get_args(FaultCollective)
FAULTS_ENV = "FSDPBENCH_FAULTS"  # the test hook's rules, in the sweep's environment (bench/core/faults.py)
# which ranks of a run record a profiler trace (per_node: local rank 0)
TraceRanks = Literal["all", "per_node"]
TRACE_RANKS: tuple[TraceRanks, ...] = get_args(TraceRanks)

STATUSES = ("ok", "oom", "timeout", "nccl_error", "rendezvous_error", "launch_error", "nan_loss",
            "failed", "infeasible", "cancelled")
TERMINAL_STATUSES = frozenset(STATUSES)  # every status is final; "running" is never written
RETRYABLE_STATUSES = frozenset(s for s in STATUSES if s not in ("ok", "infeasible"))


def _check_choice(name: str, value: str, choices: Iterable[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of: {', '.join(choices)}")


@dataclass(frozen=True)
class RunSpec:
    """One run: every axis a flat typed field. Equal specs have equal run ids."""

    kind: str = "train"
    model: str = "tiny_llama"  # a preset, or the name of the model a user brought (model_config)
    model_config: str = ""  # a brought model's Hugging Face config (canonical JSON): in the run id, so an
    # edited config is a new run; the worker builds the model from it
    nodes: int = 1
    gpus_per_node: int = 1
    sharding: str = "FULL_SHARD"
    precision: str = "bf16_mixed"
    activation_checkpointing: str = "none"
    wrap_policy: str = "transformer_block"
    compile: bool = False  # torch.compile of each transformer block (regional), before sharding
    offload: str = "none"
    micro_batch: int = 1  # per GPU; 0 = auto: the sweep searches the largest that fits before the run
    # sequences per optimizer step over all ranks (strong scaling): micro_batch x grad_accum x ranks equals
    # it; 0 = none: each step is one micro batch per rank, the global batch growing with the ranks (weak)
    global_batch: int = 0
    accumulation: str = "sync_each"  # one of ACCUMULATIONS: how a step of several micro-batches syncs
    seq_len: int = 128
    steps: int = 10
    warmup_steps: int = 3
    efa_per_node: int = 0
    cluster: str = "local"
    launcher: str = "local"
    hosts: str = ""  # the nodes the job must run on, comma-separated ("": wherever the scheduler puts it)
    repeat: int = 0
    seed: int = 0
    nccl_min_bytes: int = 8
    nccl_max_bytes: int = 1 << 26
    nccl_iters: int = 20
    collective: str = "all_reduce"  # an nccl probe's collective, one of COLLECTIVES
    # the study's own message sizes (bytes, comma-separated, ascending) an nccl probe measures beside its
    # doubling sweep: a wrapped block's gathered parameters or its gradients (bench/predict/comm.py)
    nccl_sizes: str = ""

    def __post_init__(self) -> None:
        _check_choice("kind", self.kind, RUN_KINDS)
        _check_choice("sharding", self.sharding, SHARDINGS)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("activation_checkpointing", self.activation_checkpointing, AC_MODES)
        _check_choice("wrap_policy", self.wrap_policy, WRAP_POLICIES)
        _check_choice("offload", self.offload, OFFLOADS)
        _check_choice("accumulation", self.accumulation, ACCUMULATIONS)
        _check_choice("collective", self.collective, COLLECTIVES)
        if any(size < 1 for size in self.study_sizes):
            raise ValueError(f"nccl_sizes must be positive byte counts, got {self.nccl_sizes!r}")
        for name in ("nodes", "gpus_per_node", "seq_len", "steps", "nccl_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("micro_batch", "global_batch", "warmup_steps", "efa_per_node", "repeat", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.kind == "train" and self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be < steps ({self.steps})")
        if self.sharding == "HYBRID_SHARD" and self.kind == "train" and self.gpus_per_node < 2:
            raise ValueError("HYBRID_SHARD shards within a node and replicates across nodes: it needs "
                             f"gpus_per_node >= 2 (got {self.gpus_per_node})")
        if not 0 < self.nccl_min_bytes <= self.nccl_max_bytes:
            raise ValueError("nccl_min_bytes must be > 0 and <= nccl_max_bytes")
        if self.kind == "train":
            self._check_accumulation()

    def _check_accumulation(self) -> None:
        """A global batch the ranks (and a pinned micro batch) divide; a mode that applies to the strategy."""
        if self.global_batch:
            if self.global_batch % self.world_size:
                raise ValueError(f"global_batch {self.global_batch} is not divisible by the "
                                 f"{self.world_size} data-parallel ranks of {self.nodes} node(s) x "
                                 f"{self.gpus_per_node} GPUs")
            if self.micro_batch and (self.global_batch // self.world_size) % self.micro_batch:
                raise ValueError(f"micro_batch {self.micro_batch} does not divide the "
                                 f"{self.global_batch // self.world_size} sequences per rank of global_batch "
                                 f"{self.global_batch} over {self.world_size} ranks")
        elif self.accumulation != "sync_each":
            raise ValueError(f"accumulation={self.accumulation} needs a global_batch (without one a step is "
                             "one micro batch, with nothing to accumulate)")
        if self.accumulation == "allreduce_once" and self.sharding != "HYBRID_SHARD":
            raise ValueError("accumulation=allreduce_once defers HYBRID_SHARD's all-reduce across nodes; "
                             f"{self.sharding} has none")
        if self.accumulation == "keep_gathered" and self.sharding == "NO_SHARD":
            raise ValueError("accumulation=keep_gathered keeps gathered parameters; NO_SHARD never shards "
                             "them")

    @property
    def study_sizes(self) -> tuple[int, ...]:
        """nccl_sizes as integers (ValueError for anything else)."""
        try:
            return tuple(int(v) for v in self.nccl_sizes.split(",") if v)
        except ValueError:
            raise ValueError(f"nccl_sizes must be comma-separated byte counts, got {self.nccl_sizes!r}"
                             ) from None

    @property
    def auto_micro_batch(self) -> bool:
        return self.kind == "train" and self.micro_batch == 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def per_rank(self) -> int | None:
        """Sequences each rank trains per optimizer step where a global batch fixes it (else None)."""
        return self.global_batch // self.world_size if self.global_batch else None

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step: 1 without a global batch (or before auto picks the size)."""
        return self.per_rank // self.micro_batch if self.global_batch and self.micro_batch else 1

    def at_nodes(self, nodes: int) -> RunSpec:
        """The same work per rank at another node count (micro batch and accumulation steps kept, a global
        batch scaled with the ranks): what a per-GPU comparison across node counts holds equal."""
        scaled = self.global_batch // self.nodes * nodes if self.global_batch else 0
        return replace(self, nodes=nodes, global_batch=scaled)

    @property
    def sequences_per_step(self) -> int:
        """Sequences of one optimizer step over all ranks."""
        return self.micro_batch * self.grad_accum * self.world_size

    @property
    def arch(self) -> ModelArch:
        """The architecture the run trains: its preset, or the config it carries."""
        return arch_of(self.model, self.model_config)

    def canonical(self) -> str:
        """What the run id hashes. Fields added after a study may have started are left out at their
        default, so its runs keep their ids (and stay done) when the harness learns a new axis."""
        items = {k: v for k, v in self.to_dict().items()
                 if not (k in ADDED_DEFAULTS and v == ADDED_DEFAULTS[k])}
        return json.dumps(items, sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def run_id(self) -> str:
        """Content hash of the spec: re-planning the same sweep gives the same ids."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        """Human-readable part of the run dir name."""
        on = f"-on-{self.hosts.replace(',', '-')}" if self.hosts else ""
        if self.kind == "preflight":
            return f"preflight-n{self.nodes}x{self.gpus_per_node}{on}"
        if self.kind == "nccl":
            return (f"nccl-{self.collective.replace('_', '')}-n{self.nodes}x{self.gpus_per_node}"
                    f"-efa{self.efa_per_node}-r{self.repeat}{on}")
        ac = {"none": "noac", "full": "acfull", "selective": "acsel",
              "selective_op": "acselop"}[self.activation_checkpointing]
        options = "-compile" if self.compile else ""
        options += "" if self.offload == "none" else f"-off{self.offload}"
        if self.global_batch:
            options += f"-gb{self.global_batch}-{self.accumulation.replace('_', '')}"
        return (f"{self.model}-n{self.nodes}x{self.gpus_per_node}-{self.sharding.lower()}-"
                f"{self.precision}-{ac}-{self.wrap_policy}{options}-mb{self.micro_batch or 'auto'}-"
                f"s{self.seq_len}-efa{self.efa_per_node}-r{self.repeat}")

    def to_dict(self) -> dict[str, Any]:
        """Shallow: every field is a scalar (dataclasses.asdict deep-copies, 20x slower at plan scale)."""
        return {name: getattr(self, name) for name in SPEC_FIELDS}

    def to_argv(self) -> list[str]:
        """Worker command-line arguments that reproduce this spec (`--model tiny_llama ...`); a preset's
        empty model_config, an empty hosts and a probe's fields at their defaults are left out."""
        argv: list[str] = []
        for f in fields(self):
            if not (f.name in _ARGV_DEFAULTS and getattr(self, f.name) == _ARGV_DEFAULTS[f.name]):
                argv += [f"--{f.name.replace('_', '-')}", str(getattr(self, f.name))]
        return argv

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """Build from a dict, ignoring unknown keys (written by a newer schema)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        sizes = values.get("nccl_sizes")
        if isinstance(sizes, (int, float)):  # a table cell: one size read as a number, none as NaN
            values["nccl_sizes"] = "" if sizes != sizes else str(int(sizes))
        return cls(**values)


SPEC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RunSpec))
# Fields added after schema v1 began, at their defaults: left out of run ids, and of reports that never
# varied them.
ADDED_DEFAULTS = {"compile": False, "offload": "none", "model_config": "", "global_batch": 0,
                  "accumulation": "sync_each", "hosts": "", "collective": "all_reduce", "nccl_sizes": ""}
# Fields a worker's command line leaves out at these values (its parser has the same defaults)
_ARGV_DEFAULTS = {"model_config": "", "hosts": "", "collective": "all_reduce", "nccl_sizes": ""}


def _flag(text: str) -> bool:
    """A bool field on the worker's command line, as RunSpec.to_argv writes it."""
    if text not in ("True", "False"):
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return text == "True"


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """One --flag per RunSpec field (the inverse of RunSpec.to_argv), for the worker entry points."""
    for f in fields(RunSpec):
        kind = _flag if isinstance(f.default, bool) else type(f.default)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """The test hook's flags, the same on every worker (bench.launchers.base.fault_args writes them)."""
    parser.add_argument("--fault", default="none", choices=FAULTS)
    parser.add_argument("--fault-step", type=int, default=1)
    parser.add_argument("--fault-seconds", type=float, default=0.0, help="fault sleep: seconds, no work")
    parser.add_argument("--fault-rank", type=int, default=-1, help="only this global rank (-1: every rank)")
    parser.add_argument("--fault-collective", default="all_gather", choices=FAULT_COLLECTIVES,
                        help="fault slow_collective: the collective delayed")


def spec_from_namespace(ns: argparse.Namespace) -> RunSpec:
    """RunSpec from parsed arguments; raises ValueError on invalid values."""
    return RunSpec(**{name: getattr(ns, name) for name in SPEC_FIELDS})


@dataclass
class RunSummary:
    """One row of the results table: the spec, the outcome and the steady-state metrics.

    Units are in the field names. Metrics are None where not measured (never 0 for "unknown").
    """

    run_id: str
    sweep: str
    status: str
    spec: RunSpec
    error: str | None = None
    run_dir: str | None = None
    schema_version: int = SCHEMA_VERSION
    world_size: int | None = None
    steps_timed: int | None = None
    step_time_s: float | None = None  # median over the steady-state window
    step_time_s_std: float | None = None
    step_time_s_min: float | None = None
    step_time_s_max: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    samples_per_s: float | None = None
    tflops_per_gpu: float | None = None
    hw_tflops_per_gpu: float | None = None
    peak_tflops_per_gpu: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    mem_peak_alloc_gib: float | None = None  # max over ranks
    mem_peak_reserved_gib: float | None = None
    mem_rss_gib: float | None = None  # host RSS peak (CPU runs)
    nvml_mem_used_gib: float | None = None  # max over GPUs and samples
    nvml_util_pct: float | None = None  # mean
    nvml_power_w: float | None = None  # mean per GPU
    # The GPUs' energy per token trained over the timed steps: every GPU's joules (NVML's energy counter,
    # else its power samples integrated) over the run's tokens; energy_source says which, or why there is
    # none (a CPU run: not measured)
    energy_j_per_token: float | None = None
    energy_source: str | None = None
    compile_s: float | None = None  # compile=true: warm-up time beyond steady steps (compilation)
    loss_first: float | None = None
    loss_last: float | None = None
    pred_mem_gib: float | None = None  # what the plan judged by: peak measured on fake tensors, else the
    pred_mem_source: str | None = None  # lower bound of the state: "measured" or "lower bound"
    pred_step_time_s: float | None = None  # bench/predict/perf.py's prediction, made when the run was planned
    pred_tokens_per_s_per_gpu: float | None = None
    pred_mfu: float | None = None
    pred_scaling_efficiency: float | None = None  # against the smallest planned node count of its config
    pred_base_tokens_per_s_per_gpu: float | None = None  # that node count's tokens/s/GPU in the same
    # prediction: pred_scaling_efficiency = pred_tokens_per_s_per_gpu / it (one prediction per row)
    pred_bound: str | None = None  # compute-, memory-bandwidth-, network- or host-bound
    pred_exposed_comm_s: float | None = None  # communication the model says the step waits for (exposed_s)
    pred_source: str | None = None  # the constants it was predicted with: "published constants" or "this
    # study's N runs" (bench/predict/calibrate.py)
    device_name: str | None = None
    torch_version: str | None = None
    host: str | None = None
    git_rev: str | None = None
    started_at: str | None = None
    wall_s: float | None = None  # run time, from when the job really started
    queue_s: float | None = None  # time pending in the scheduler's queue
    attempt: int | None = None  # which attempt of the run this summary comes from (run ledger)
    # Times the run started again after it began, within one attempt: a Slurm requeue (NODE_FAIL), a pod
    # restart, a torchrun elastic restart (each in extra["executions"] / extra["torchrun_restarts"]); and the
    # wall time from its first start to its last, which they cost
    restarts: int | None = None
    restart_lost_s: float | None = None
    # A multi-rank run's slowest node by its own compute per step, without its waits (trainer/clock.py; on
    # one node, its slowest rank), that compute over the median of the others' less 1, and the seconds a
    # step the others waited for it; straggler: that node, where the excess passes preflight.tolerance
    slowest_node: str | None = None
    slowest_node_excess: float | None = None
    slowest_node_held_s: float | None = None
    straggler: str | None = None
    nccl_busbw_avg_gbs: float | None = None
    nccl_busbw_max_gbs: float | None = None
    nccl_algbw_max_gbs: float | None = None
    nccl_transport: str | None = None
    # The profiled steps' split (trainer/trace_split.py), seconds per step, each part the median over ranks
    # that recorded a trace: compute, exposed_<kind>, waiting, optimizer, other (they add up to step_s,
    # the profiled step's median), overlapped_<kind> beside them; the per-rank splits are in extra
    trace_split: dict[str, float] | None = None
    # per collective kind (all_gather_fwd, all_gather_bwd, reduce_scatter, all_reduce) per step: bytes
    # (nccl-tests' size convention), seconds its collectives ran (rank median), count
    trace_collectives: dict[str, dict[str, Any]] | None = None
    trace_note: str | None = None  # why a run has no split (no trace, unreadable, another torch)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choice("status", self.status, STATUSES)

    def to_row(self) -> dict[str, Any]:
        """Flat dict for the results table: spec fields first, then outcome and metrics."""
        row: dict[str, Any] = {"run_id": self.run_id, "sweep": self.sweep, "status": self.status}
        row.update(self.spec.to_dict())
        for f in fields(self):
            if f.name not in ("run_id", "sweep", "status", "spec", "extra"):
                row[f.name] = getattr(self, f.name)
        for name in JSON_FIELDS:  # nested: one JSON text per cell, as extra
            row[name] = json.dumps(row[name], sort_keys=True) if row[name] is not None else None
        row["extra"] = json.dumps(self.extra, sort_keys=True) if self.extra else None
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunSummary:
        names = {f.name for f in fields(cls)} - {"spec", "extra"}
        extra = row.get("extra")
        kwargs = {k: _none_if_nan(row[k]) for k in names if k in row}
        for name in JSON_FIELDS:
            if isinstance(kwargs.get(name), str):
                kwargs[name] = json.loads(kwargs[name])
        return cls(spec=RunSpec.from_dict(row), extra=json.loads(extra) if isinstance(extra, str) else {},
                   **kwargs)


JSON_FIELDS = ("trace_split", "trace_collectives")  # RunSummary's dict fields: JSON in the table


def _none_if_nan(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


SUMMARY_COLUMNS: tuple[str, ...] = tuple(
    RunSummary(run_id="", sweep="", status="ok", spec=RunSpec()).to_row().keys())
