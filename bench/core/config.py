"""The sweep configuration, typed once: the dataclasses below are the schema Hydra composes sweeps/ into
(registered in its ConfigStore as `sweep_schema`, the first entry of sweeps/config.yaml's defaults), and
`from_dict` merges a composed config into them again with OmegaConf, so OmegaConf itself refuses a wrong
type or an unknown key, a `+key=` override included. Every field's default and meaning is written here,
once; the YAML files set only what differs.

What a type cannot say stays hand-written in `validate`: allowed values, ranges, cross-field rules and the
values a scheduler would refuse. Every problem is a ConfigError of one line; the sweep prints it, exit 2.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from bench.core.hardware import GPUS, supports_fp8
from bench.core.models import ModelError, model_source
from bench.core.schema import (
    AC_MODES,
    ACCUMULATIONS,
    COLLECTIVES,
    FAULT_COLLECTIVES,
    FAULTS,
    OFFLOADS,
    PRECISIONS,
    SHARDINGS,
    SPEC_FIELDS,
    TRACE_RANKS,
    WRAP_POLICIES,
)

AUTO = "auto"  # axes.micro_batch value: search the largest micro batch that fits
COMPILE_WARMUP = 1  # compile=true: step 0 compiles forward and backward; later steps reuse it (measured)
LAUNCHERS = ("local", "dryrun", "slurm", "kubernetes")
ADMISSIONS = ("harness", "slurm")  # cluster.slurm.admission
_SWEEP_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class ConfigError(ValueError):
    """A configuration problem, reported as one line before anything is launched (exit EXIT_CONFIG)."""


EXIT_CONFIG = 2  # every command's exit status for a ConfigError


@dataclass
class SlurmClusterConfig:
    partition: str | None = None  # sbatch --partition; None = the cluster's default partition
    account: str | None = None  # sbatch --account
    time_limit: str = "02:00:00"  # sbatch --time (admission=slurm: the limit of a run with no prediction)
    # who packs the study's runs onto nodes: "harness" (the runner submits what fits launcher.max_nodes, the
    # largest first) or "slurm" (every run submitted at once with --time from its prediction, Slurm's
    # backfill packs them within the partition): benchmarks/schedule_slurm.py measures both
    admission: str = "harness"
    exclusive: bool = True  # sbatch --exclusive: no other job shares a benchmarked node
    gpus_per_node: int | None = None  # --gpus-per-node; None = the cluster's GPUs/node; 0 = no GRES request
    container_image: str | None = None  # pyxis/enroot image (e.g. a .sqsh); None = run on the host
    container_mounts: str | None = None  # pyxis SRC:DST[,...]: must cover results_root, or nothing comes back
    container_workdir: str = "/workspace/fsdpbench"  # the project inside the image (Dockerfile WORKDIR)
    extra_sbatch: list[str] = field(default_factory=list)  # extra "#SBATCH ..." options, e.g. "--qos=high"
    conf: str | None = None  # SLURM_CONF for the client commands; None = the environment's
    # all_reduce_perf on GPU clusters (CPU clusters use the torch probe); all_gather_perf and
    # reduce_scatter_perf are taken from beside it (bench.probes.command.perf_binary)
    nccl_tests_binary: str = "all_reduce_perf"
    mpi: str = "pmix"  # srun --mpi for nccl-tests


@dataclass
class K8sClusterConfig:
    namespace: str = "default"
    image: str | None = None  # your worker image (Dockerfile in this repo); required to launch
    instance_type_label: str = "node.kubernetes.io/instance-type"  # node label the pods select on
    shm_size: str = "64Gi"  # /dev/shm of each worker (NCCL and data loaders need more than the default)
    hf_token_secret: str | None = None  # name of a Secret with key "token"; referenced, never inlined
    image_pull_secret: str | None = None
    service_account: str | None = None


@dataclass
class ClusterConfig:
    """One file of sweeps/cluster/: the machine type and how many of it there are."""

    name: str = MISSING
    instance_type: str = MISSING
    gpus_per_node: int = MISSING  # worker processes per node (local: per simulated node)
    max_nodes: int = MISSING  # the reservation's size: no run or budget may exceed it
    gpu: str | None = None  # a row of bench/core/hardware.py; None = no peak: no MFU, no memory pruning
    gpu_memory_gib: float | None = None  # None = runs are never pruned as infeasible by the estimate
    host_memory_gib: float | None = None  # per node; bounds what offload=cpu may put there (None: unchecked)
    efa_per_node: int = 0  # EFA adapters per node (0 = TCP sockets)
    price_per_hour: float | None = None  # USD per instance-hour, dated in the file; None = the report asks
    socket_ifname: str | None = None  # NCCL_SOCKET_IFNAME on every launcher, e.g. "^lo,docker,veth"
    slurm: SlurmClusterConfig = field(default_factory=SlurmClusterConfig)
    kubernetes: K8sClusterConfig = field(default_factory=K8sClusterConfig)


@dataclass
class LauncherConfig:
    """One file of sweeps/launcher/."""

    name: str = MISSING  # local, dryrun, slurm or kubernetes
    timeout_s: float = 900  # run time, counted from when the job really runs; past it: timeout
    # a collective that waits longer fails the run (NCCL's watchdog, gloo's timeout) and its ranks leave
    # flight-recorder dumps naming who lagged; None = 2/3 of timeout_s, so it fires before the harness's
    collective_timeout_s: float | None = None
    queue_timeout_s: float = 6 * 3600  # time a job may wait in the scheduler's queue; past it: launch_error
    grace_s: float = 10  # SIGTERM (or delete) -> SIGKILL
    poll_s: float = 0.2
    max_nodes: int | None = None  # node budget of runs in flight; None: the cluster's (local: one at a time)
    probes_alone: bool = True  # nccl probes run with nothing else in flight (a shared fabric distorts them)
    rendezvous_timeout_s: float = 1800  # torchrun c10d join/read timeouts: nodes that start apart still meet
    python: str | None = None  # interpreter on the nodes; None = this one (pyxis: the image's)
    workdir: str | None = None  # project checkout on the nodes; None = this checkout
    kubeconfig: str | None = None  # None = $KUBECONFIG or ~/.kube/config, or the in-cluster config
    context: str | None = None


@dataclass
class Axes:
    """The study's axes: the plan is their cartesian product minus `exclude`."""

    model: list[str] = field(default_factory=lambda: ["tiny_llama"])  # presets of bench/core/models.py, files
    # in sweeps/model/, or paths to a Hugging Face config.json (bench.core.models.model_source)
    nodes: list[int] = field(default_factory=lambda: [1])
    gpus_per_node: list[int | None] = field(default_factory=lambda: [None])  # None = the cluster's
    sharding: list[str] = field(default_factory=lambda: ["FULL_SHARD"])
    precision: list[str] = field(default_factory=lambda: ["bf16_mixed"])
    activation_checkpointing: list[str] = field(default_factory=lambda: ["none"])
    wrap_policy: list[str] = field(default_factory=lambda: ["transformer_block"])
    compile: list[bool] = field(default_factory=lambda: [False])  # torch.compile each block (regional)
    offload: list[str] = field(default_factory=lambda: ["none"])  # cpu: FSDP2 CPUOffloadPolicy
    micro_batch: list[Any] = field(default_factory=lambda: [1])  # per GPU; `auto`: the largest that fits
    # (and, with a global batch, divides each rank's share of it)
    # sequences per optimizer step over all ranks, the same at every node count (strong scaling): micro batch
    # x accumulation steps x ranks equals it; None = one micro batch per rank per step (weak scaling)
    global_batch: list[int | None] = field(default_factory=lambda: [None])
    accumulation: list[str] = field(default_factory=lambda: ["sync_each"])  # bench.core.schema.ACCUMULATIONS
    seq_len: list[int] = field(default_factory=lambda: [128])
    efa_per_node: list[int | None] = field(default_factory=lambda: [None])  # None = the cluster's adapters


AXES: tuple[str, ...] = tuple(f.name for f in fields(Axes))


@dataclass
class NcclSweepConfig:
    """Collective probes beside the training runs (nccl-tests where present, else the torch probe): one
    run per collective, node count, EFA count and repeat."""

    enabled: bool = False
    nodes: list[int] | None = None  # None = the training axes' nodes
    efa_per_node: list[int] | None = None  # None = [the cluster's EFA count]
    gpus_per_node: list[int] | None = None  # None = the cluster's
    min_bytes: int = 8
    max_bytes: int = 1 << 26
    iters: int = 20
    split_per_node: bool = False  # NCCL_TESTS_SPLIT="MOD <gpus/node>": inter-node bandwidth only
    # which collectives each probe point measures (bench.core.schema.COLLECTIVES): all-reduce, and the
    # all-gather and reduce-scatter FULL_SHARD and SHARD_GRAD_OP run, at the study's own message sizes too
    collectives: list[str] = field(default_factory=lambda: list(COLLECTIVES))


@dataclass
class MicroBatchSearch:
    """`micro_batch: auto`: the run starts at the largest power of two the estimate fits (at most `max`); on
    OOM, short runs of `steps` at the smaller sizes find the one that fits."""

    max: int = 64
    steps: int = 4
    warmup_steps: int = 1


@dataclass
class MemoryConfig:
    """How the planner knows each run's memory before launch (bench/predict/memory.py): the worker's own step
    on fake tensors, per distinct configuration, cached; the lower bound of the state where it cannot run."""

    measure: bool = True  # false: the lower bound only (instant; prunes only what surely cannot fit)
    cache_dir: str | None = None  # None = $XDG_CACHE_HOME/fsdpbench, else ~/.cache/fsdpbench
    workers: int = 2  # measuring processes side by side (each holds ~0.5 GiB; no GPU needed)
    timeout_s: float = 900  # per configuration; past it that run is planned on the lower bound


@dataclass
class StudyConfig:
    """What a team sizing a training run asks of a strong-scaling study: days and dollars to train a token
    budget at its global batch, per node count, and the knee past which more nodes buy little."""

    train_tokens: float | None = None  # tokens to train, e.g. 1e12; None: the report shows no days or dollars
    # the knee: the node count past which going to the next planned one buys less than this share of the
    # time linear scaling would save (1: as much, 0: nothing)
    knee_share: float = 0.5


@dataclass
class TraceConfig:
    """Each training run's profiler trace (trainer/trace.py): steps recorded after the timed ones, kept in
    the attempt dir and split into where the step went. Recording only: not in the run id."""

    enabled: bool = True
    ranks: str = "all"  # all: every rank; per_node: each node's local rank 0 (large studies)
    steps: int = 2  # profiled steps per run (each costs a step and its trace's size: docs/architecture.md)


PREFLIGHT_MODES = ("auto", "on", "warn", "off")


@dataclass
class PreflightConfig:
    """Nodes checked before a study spends its reservation (bench/preflight.py): one short job per node,
    then all-reduce between pairs of nodes; a node that differs from the others refuses the study."""

    # auto: on for launchers that reach several machines (slurm, kubernetes), off for local and dryrun;
    # on: refuse a study whose nodes disagree; warn: show the table and go on; off: no preflight
    mode: str = "auto"
    # a node this fraction below the median (local workload, pair bandwidth) is named; in a run, a node
    # whose compute per step is this fraction above the others' median is named its straggler
    tolerance: float = 0.25
    seconds: float = 2.0  # the timed local workload per node
    timeout_s: float = 300  # per round of jobs, queueing included: a node silent past it is named
    pair_bytes: int = 1 << 25  # the largest all-reduce between a pair of nodes
    nodes: list[str] | None = None  # the nodes to check; None: every node the launcher can reach


@dataclass
class FaultRule:
    """Test hook: inject a worker fault into the runs whose spec matches every key of `match`."""

    match: dict[str, Any] = field(default_factory=dict)  # run spec field -> value or list of values
    fault: str = MISSING  # one of bench.core.schema.FAULTS
    step: int = 1
    seconds: float = 0.0  # sleep: instead of working; slow_collective, slow_compute: the delay per call
    rank: int | None = None  # only this global rank (a lagging rank); None = every rank
    collective: str = "all_gather"  # slow_collective: the one delayed, of bench.core.schema.FAULT_COLLECTIVES


@dataclass
class SweepConfig:
    """The whole sweep: sweeps/config.yaml, a sweep of sweeps/sweep/, a cluster, a launcher, overrides."""

    sweep_name: str | None = None  # set by the chosen sweep (+sweep=NAME); also the sweep dir's name
    results_root: str = "results"
    dry_run: bool = False  # plan, render every submission, launch nothing (also: --dry-run)
    rerun_failed: bool = False  # retry runs that ended other than ok (also: --rerun-failed)
    force: bool = False  # redo every run, finished ones too (also: --force)
    progress: bool = True
    axes: Axes = field(default_factory=Axes)
    exclude: list[dict[str, Any]] = field(default_factory=list)  # each removes the runs matching all its keys
    repeats: int = 1
    steps: int = 10
    warmup_steps: int = 3  # steps before the timed window (compile and allocator warm-up)
    seed: int = 0
    nccl: NcclSweepConfig = field(default_factory=NcclSweepConfig)
    micro_batch_search: MicroBatchSearch = field(default_factory=MicroBatchSearch)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    faults: list[FaultRule] = field(default_factory=list)
    cluster: ClusterConfig = MISSING
    launcher: LauncherConfig = MISSING


def register_schema() -> None:
    """Make SweepConfig the schema of sweeps/config.yaml (its defaults list names `sweep_schema`)."""
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="sweep_schema", node=SweepConfig)


def omegaconf_message(e: OmegaConfBaseException) -> str:
    """OmegaConf's error as one line naming the key, and for a typo the keys that exist there."""
    key = getattr(e, "full_key", None)
    owner = getattr(e, "object_type", None)
    if isinstance(e, (ConfigKeyError, ConfigAttributeError)) and key and is_dataclass(owner):
        return f"unknown key {key}; known there: {', '.join(f.name for f in fields(owner))}"
    msg = (getattr(e, "msg", None) or str(e)).strip().splitlines()[0]
    if "is not a ListConfig, list or tuple" in msg:
        msg = "must be a list, e.g. [4]"
    return f"{key}: {msg}" if key else msg


def from_dict(raw: dict[str, Any]) -> SweepConfig:
    """A composed config (OmegaConf.to_container) as a validated SweepConfig."""
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SweepConfig), raw))
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    assert isinstance(cfg, SweepConfig)
    validate(cfg)
    return cfg


def _positive(where: str, value: float | None, kind: str = "integer") -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{where} must be a positive {kind}, got {value!r}")


def _check_models(axes: Axes) -> None:
    """Every model reference resolves to a model the harness can train (each run's sequence length is
    checked against it when the plan is expanded: excludes may leave the long ones out)."""
    for ref in axes.model:
        try:
            model_source(ref)
        except ModelError as e:
            raise ConfigError(f"axes.model: {e}") from None


def _check_axes(axes: Axes, cluster: ClusterConfig) -> None:
    _check_models(axes)
    choices = {"sharding": SHARDINGS, "precision": PRECISIONS,
               "activation_checkpointing": AC_MODES, "wrap_policy": WRAP_POLICIES, "offload": OFFLOADS,
               "accumulation": ACCUMULATIONS}
    for name, known in choices.items():
        for v in getattr(axes, name):
            if v not in known:
                raise ConfigError(f"axes.{name}: unknown value {v!r}; known: {', '.join(sorted(known))}")
    for name in ("nodes", "seq_len", "gpus_per_node", "global_batch"):
        for v in getattr(axes, name):
            _positive(f"axes.{name}", v)
    if set(axes.accumulation) != {"sync_each"} and None in axes.global_batch:
        raise ConfigError(f"axes.accumulation {list(axes.accumulation)} needs axes.global_batch: without one "
                          "a step is one micro batch, with nothing to accumulate")
    for v in axes.micro_batch:
        if v != AUTO and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"axes.micro_batch must be a positive integer or {AUTO}, got {v!r}")
    for v in axes.efa_per_node:
        if v is not None and v < 0:
            raise ConfigError(f"axes.efa_per_node: {v!r} is not a count of adapters")
        if v is not None and cluster.efa_per_node and v > cluster.efa_per_node:
            raise ConfigError(f"axes.efa_per_node: {v} EFA adapters per node, but {cluster.instance_type} "
                              f"has {cluster.efa_per_node} (cluster {cluster.name})")
    if too_many := [n for n in axes.nodes if n > cluster.max_nodes]:
        raise ConfigError(f"axes.nodes: {too_many} exceed cluster {cluster.name}'s max_nodes="
                          f"{cluster.max_nodes}")
    if too_many := [g for g in axes.gpus_per_node if g is not None and g > cluster.gpus_per_node]:
        raise ConfigError(f"axes.gpus_per_node: {too_many} exceed cluster {cluster.name}'s gpus_per_node="
                          f"{cluster.gpus_per_node}")
    if "HYBRID_SHARD" in axes.sharding and axes.model and cluster.gpus_per_node < 2:
        raise ConfigError(f"HYBRID_SHARD needs >= 2 GPUs per node to shard within a node; cluster "
                          f"{cluster.name} has gpus_per_node={cluster.gpus_per_node}")
    if "fp8_tensorwise" in axes.precision and cluster.gpu is not None and not supports_fp8(cluster.gpu):
        raise ConfigError(f"axes.precision: fp8_tensorwise needs FP8 tensor cores (H100, H200, L4, B200); "
                          f"cluster {cluster.name} has {cluster.gpu}")
    if "cpu" in axes.offload and cluster.gpu is None:
        raise ConfigError(f"axes.offload: cpu moves training state from GPU to host memory; cluster "
                          f"{cluster.name} names no GPU (set cluster.gpu on a GPU machine)")


# What the Kubernetes API accepts (RFC 1123 labels and subdomains, resource quantities, image references),
# checked here so a bad value is one line before anything is written, not a refused create per run.
_RFC1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_RFC1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_IMAGE = re.compile(r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                    r"(?:@sha256:[0-9a-f]{64})?$")


def _check_kubernetes(k: K8sClusterConfig) -> None:
    checks = [("namespace", k.namespace, _RFC1123_LABEL, "an RFC 1123 label (lower-case letters, digits, -)"),
              ("shm_size", k.shm_size, _QUANTITY, "a quantity such as 64Gi"),
              ("image", k.image, _IMAGE, "an image reference such as registry/repo:tag"),
              ("hf_token_secret", k.hf_token_secret, _RFC1123_SUBDOMAIN, "a Secret name"),
              ("image_pull_secret", k.image_pull_secret, _RFC1123_SUBDOMAIN, "a Secret name"),
              ("service_account", k.service_account, _RFC1123_SUBDOMAIN, "a ServiceAccount name")]
    for key, value, pattern, what in checks:
        if value is not None and (not pattern.match(value) or len(value) > 253):
            raise ConfigError(f"cluster.kubernetes.{key}={value!r} is not {what}")


def _check_probes(nccl: NcclSweepConfig, cluster: ClusterConfig) -> None:
    """Collectives the probes know, at least one; EFA counts the instance has (a cluster file that names
    its adapters: more than it has would measure nothing, or another count mislabelled)."""
    if unknown := [c for c in nccl.collectives if c not in COLLECTIVES]:
        raise ConfigError(f"nccl.collectives: unknown collective(s) {unknown}; known: "
                          f"{', '.join(COLLECTIVES)}")
    if nccl.enabled and not nccl.collectives:
        raise ConfigError("nccl.collectives is empty: name at least one of " + ", ".join(COLLECTIVES))
    for v in nccl.efa_per_node or ():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"nccl.efa_per_node: {v!r} is not a count of adapters")
        if cluster.efa_per_node and v > cluster.efa_per_node:
            raise ConfigError(f"nccl.efa_per_node: {v} EFA adapters per node, but {cluster.instance_type} "
                              f"has {cluster.efa_per_node} (cluster {cluster.name})")


def _check_cluster(cluster: ClusterConfig) -> None:
    _positive("cluster.gpus_per_node", cluster.gpus_per_node)
    _positive("cluster.max_nodes", cluster.max_nodes)
    if cluster.gpu is not None and cluster.gpu not in GPUS:
        raise ConfigError(f"cluster.gpu: unknown GPU {cluster.gpu!r}; known: {', '.join(GPUS)}")
    _check_kubernetes(cluster.kubernetes)


def _check_launcher(launcher: LauncherConfig) -> None:
    if launcher.name not in LAUNCHERS:
        raise ConfigError(f"launcher.name: {launcher.name!r}; known: {', '.join(LAUNCHERS)}")
    for key in ("timeout_s", "queue_timeout_s", "rendezvous_timeout_s", "grace_s", "poll_s"):
        _positive(f"launcher.{key}", getattr(launcher, key), "number of seconds")
    _positive("launcher.max_nodes", launcher.max_nodes)


def _check_admission(cfg: SweepConfig) -> None:
    admission = cfg.cluster.slurm.admission
    if admission not in ADMISSIONS:
        raise ConfigError(f"cluster.slurm.admission={admission!r} is not one of: {', '.join(ADMISSIONS)}")
    if admission == "slurm" and cfg.launcher.name == "slurm" and cfg.launcher.max_nodes is not None:
        raise ConfigError("cluster.slurm.admission=slurm leaves the node cap to Slurm: name a partition "
                          "(cluster.slurm.partition), or a --qos or --reservation in "
                          "cluster.slurm.extra_sbatch, instead of launcher.max_nodes")


def _check_faults(faults: list[FaultRule]) -> None:
    for f in faults:
        if unknown := sorted(set(f.match) - set(SPEC_FIELDS)):  # a misspelt key would silently never fire
            raise ConfigError(f"faults: unknown match key(s) {', '.join(unknown)}; keys are run spec fields: "
                              f"{', '.join(SPEC_FIELDS)}")
        if f.fault not in FAULTS:
            raise ConfigError(f"faults: unknown fault {f.fault!r}; known: {', '.join(FAULTS)}")
        if f.collective not in FAULT_COLLECTIVES:
            raise ConfigError(f"faults: unknown collective {f.collective!r}; known: "
                              f"{', '.join(FAULT_COLLECTIVES)}")


def _check_trace(t: TraceConfig) -> None:
    if t.ranks not in TRACE_RANKS:
        raise ConfigError(f"trace.ranks={t.ranks!r} is not one of: {', '.join(TRACE_RANKS)}")
    if t.steps < 1:
        raise ConfigError(f"trace.steps={t.steps} must be >= 1 (trace.enabled=false records none)")


def _check_preflight(p: PreflightConfig) -> None:
    if p.mode not in PREFLIGHT_MODES:
        raise ConfigError(f"preflight.mode={p.mode!r} is not one of: {', '.join(PREFLIGHT_MODES)}")
    if not 0 < p.tolerance < 1:
        raise ConfigError(f"preflight.tolerance={p.tolerance} must be a fraction between 0 and 1")
    for name in ("seconds", "timeout_s", "pair_bytes"):
        if getattr(p, name) <= 0:
            raise ConfigError(f"preflight.{name} must be > 0, got {getattr(p, name)}")


def validate(cfg: SweepConfig) -> None:
    """The rules a type cannot express; the first one broken is a ConfigError."""
    if not cfg.sweep_name:
        raise ConfigError("no sweep chosen")
    if not _SWEEP_NAME.match(cfg.sweep_name) or cfg.sweep_name in (".", ".."):
        raise ConfigError(f"sweep_name={cfg.sweep_name!r}: a plain name (letters, digits, ._-), so the sweep "
                          "dir stays under results_root")
    _check_cluster(cfg.cluster)
    _check_launcher(cfg.launcher)
    _check_admission(cfg)
    _check_preflight(cfg.preflight)
    _check_axes(cfg.axes, cfg.cluster)
    for i, rule in enumerate(cfg.exclude):
        if set(rule) - set(AXES):
            raise ConfigError(f"exclude[{i}] must map axis names ({', '.join(AXES)}) to values: {rule!r}")
    _positive("repeats", cfg.repeats)
    if not 0 <= cfg.warmup_steps < cfg.steps:
        raise ConfigError(f"need 0 <= warmup_steps < steps, got warmup_steps={cfg.warmup_steps}, "
                          f"steps={cfg.steps}")
    if True in cfg.axes.compile and cfg.warmup_steps < COMPILE_WARMUP:
        raise ConfigError(f"axes.compile: the first step compiles every block; warmup_steps="
                          f"{cfg.warmup_steps} would time it (need >= {COMPILE_WARMUP})")
    nccl = cfg.nccl
    for key in ("nodes", "gpus_per_node"):
        for v in getattr(nccl, key) or ():
            _positive(f"nccl.{key}", v)
    if nccl.enabled and nccl.nodes and max(nccl.nodes) > cfg.cluster.max_nodes:
        raise ConfigError(f"nccl.nodes {list(nccl.nodes)} exceed cluster {cfg.cluster.name}'s max_nodes="
                          f"{cfg.cluster.max_nodes}")
    _check_probes(nccl, cfg.cluster)
    _check_faults(cfg.faults)
    _check_trace(cfg.trace)
    search = cfg.micro_batch_search
    _positive("micro_batch_search.max", search.max)
    _positive("micro_batch_search.steps", search.steps)
    if not 0 <= search.warmup_steps < search.steps:
        raise ConfigError("micro_batch_search: need 0 <= warmup_steps < steps")
    _positive("launcher.collective_timeout_s", cfg.launcher.collective_timeout_s, "number")
    if (cfg.launcher.collective_timeout_s or 0) >= cfg.launcher.timeout_s:
        raise ConfigError(f"launcher.collective_timeout_s={cfg.launcher.collective_timeout_s:g} must be "
                          f"below launcher.timeout_s={cfg.launcher.timeout_s:g}: a hung collective must fail "
                          "(and dump) before the harness stops the run")
    tokens, price = cfg.study.train_tokens, cfg.cluster.price_per_hour
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        raise ConfigError(f"study.train_tokens must be a positive number of tokens, e.g. 1e12, got "
                          f"{tokens!r}")
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise ConfigError(f"cluster.price_per_hour must be USD per instance-hour (>= 0), got {price!r}")
    if not 0 < cfg.study.knee_share <= 1:
        raise ConfigError(f"study.knee_share must be in (0, 1], got {cfg.study.knee_share!r}")
    _positive("memory.workers", cfg.memory.workers)
    _positive("memory.timeout_s", cfg.memory.timeout_s, "number")
