"""Typed sweep configuration, converted once from Hydra's DictConfig and validated before any launch.

Every problem is a ConfigError with one line a user can act on; the sweep prints it and exits 2.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from bench.hardware import GPUS
from bench.models import PRESETS
from bench.schema import AC_MODES, PRECISIONS, SHARDINGS, SPEC_FIELDS, WRAP_POLICIES

AXES = ("model", "nodes", "gpus_per_node", "sharding", "precision", "activation_checkpointing", "wrap_policy",
        "micro_batch", "seq_len", "efa_per_node")
FAULT_KINDS = ("oom", "nan", "hang", "crash", "sleep")  # sleep: the worker sleeps `seconds`, does no work
AUTO = "auto"  # axes.micro_batch value: search the largest micro batch that fits
LAUNCHERS = ("local", "dryrun", "slurm", "kubernetes")
_SWEEP_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class ConfigError(ValueError):
    """A configuration problem, reported as one line before anything is launched."""


@dataclass(frozen=True)
class SlurmClusterConfig:
    partition: str | None = None
    account: str | None = None
    time_limit: str = "02:00:00"
    exclusive: bool = True
    gpus_per_node: int | None = None  # --gpus-per-node; None = the cluster's gpus_per_node if it has GPUs
    container_image: str | None = None  # pyxis/enroot
    container_mounts: str | None = None
    extra_sbatch: tuple[str, ...] = ()  # extra "#SBATCH ..." option lines, e.g. "--qos=high"
    conf: str | None = None  # SLURM_CONF for the client commands; None = the environment's
    nccl_tests_binary: str = "all_reduce_perf"  # on GPU clusters; CPU clusters use the torch probe
    mpi: str = "pmix"  # srun --mpi for nccl-tests
    container_workdir: str = "/workspace/fsdpbench"  # pyxis: the project inside the image (Dockerfile WORKDIR)


@dataclass(frozen=True)
class K8sClusterConfig:
    namespace: str = "default"
    image: str | None = None
    instance_type_label: str = "node.kubernetes.io/instance-type"
    shm_size: str = "64Gi"
    hf_token_secret: str | None = None
    image_pull_secret: str | None = None
    service_account: str | None = None


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    instance_type: str
    gpus_per_node: int
    max_nodes: int
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    efa_per_node: int = 0
    price_per_hour: float | None = None
    socket_ifname: str | None = None  # NCCL_SOCKET_IFNAME on every launcher, e.g. "^lo,docker,veth"
    slurm: SlurmClusterConfig = field(default_factory=SlurmClusterConfig)
    kubernetes: K8sClusterConfig = field(default_factory=K8sClusterConfig)


@dataclass(frozen=True)
class LauncherConfig:
    name: str
    timeout_s: float = 900  # run time, counted from when the job really runs
    queue_timeout_s: float = 6 * 3600  # time a job may wait in the scheduler's queue before it is given up
    grace_s: float = 10
    poll_s: float = 0.2
    max_nodes: int | None = None  # node budget of runs in flight; None: the cluster's (local: one run at a time)
    probes_alone: bool = True  # nccl probes run with nothing else in flight (shared fabric distorts bandwidth)
    rendezvous_timeout_s: float = 1800  # torchrun c10d join/read timeouts: nodes that start apart still meet
    python: str | None = None
    workdir: str | None = None
    kubeconfig: str | None = None
    context: str | None = None


@dataclass(frozen=True)
class NcclSweepConfig:
    enabled: bool = False
    nodes: tuple[int, ...] | None = None
    efa_per_node: tuple[int, ...] | None = None
    min_bytes: int = 8
    max_bytes: int = 1 << 26
    iters: int = 20
    gpus_per_node: tuple[int, ...] | None = None  # None: the cluster's
    split_per_node: bool = False  # NCCL_TESTS_SPLIT="MOD <gpus_per_node>": inter-node bandwidth only


@dataclass(frozen=True)
class MicroBatchSearch:
    """`micro_batch: auto`: start at the largest power of two the estimate fits (at most `max`), confirm
    with a short run of `steps`, halve on OOM."""

    max: int = 64
    steps: int = 4
    warmup_steps: int = 1


@dataclass(frozen=True)
class FaultRule:
    match: dict[str, Any]
    fault: str
    step: int = 1
    seconds: float = 0.0  # fault sleep: how long the worker sleeps instead of working


@dataclass(frozen=True)
class SweepConfig:
    name: str
    results_root: str
    axes: dict[str, tuple[Any, ...]]
    repeats: int
    steps: int
    warmup_steps: int
    seed: int
    exclude: tuple[dict[str, Any], ...]
    nccl: NcclSweepConfig
    faults: tuple[FaultRule, ...]
    micro_batch_search: MicroBatchSearch
    cluster: ClusterConfig
    launcher: LauncherConfig
    dry_run: bool = False
    rerun_failed: bool = False
    force: bool = False
    progress: bool = True


# The YAML's top level is SweepConfig's fields, its `name` spelt `sweep_name`.
TOP_LEVEL_KEYS = ("sweep_name", *(f.name for f in fields(SweepConfig) if f.name != "name"))


_SCALARS = ("str", "int", "float", "bool")


def _scalar(value: Any, hint: str, where: str) -> Any:
    """A scalar as its field's annotation wants it, or a ConfigError naming the key: YAML reads `nan` or
    `123` as numbers where a name is meant (kept as text); a number or a flag must be one."""
    if value is None:
        if "None" in hint:
            return None
        raise ConfigError(f"{where} must be set, got null")
    kind = hint.replace(" | None", "")
    if kind == "str":
        if isinstance(value, (dict, list, tuple)):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value if isinstance(value, str) else str(value)
    if kind == "bool" and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    return value


def _build(cls: type, data: Any, where: str, convert: dict[str, Any] | None = None) -> Any:
    """Dataclass from a dict: unknown keys, wrong types and wrong shapes are ConfigErrors naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    hints = {f.name: str(f.type) for f in fields(cls)}
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)}; known: {', '.join(sorted(hints))}")
    kwargs = {}
    for k, v in data.items():
        if convert and k in convert and v is not None:
            v = convert[k](v, f"{where}.{k}")
        elif hints[k].replace(" | None", "") in _SCALARS:
            v = _scalar(v, hints[k], f"{where}.{k}")
        kwargs[k] = v
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def _as_list(value: Any, where: str) -> tuple[Any, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} must be a positive integer, got {value!r}")
    return value


def _check_axis(name: str, values: tuple[Any, ...], cluster: ClusterConfig) -> None:
    choices = {"model": PRESETS, "sharding": SHARDINGS, "precision": PRECISIONS,
               "activation_checkpointing": AC_MODES, "wrap_policy": WRAP_POLICIES}.get(name)
    for v in values:
        if choices is not None and v not in choices:
            raise ConfigError(f"axes.{name}: unknown value {v!r}; known: {', '.join(sorted(choices))}")
        if name in ("nodes", "seq_len") or (name == "micro_batch" and v != AUTO) or (
                name == "gpus_per_node" and v is not None):
            _positive_int(v, f"axes.{name}")
        if name == "efa_per_node" and v is not None and (not isinstance(v, int) or v < 0):
            raise ConfigError(f"axes.efa_per_node: {v!r} is not a count of adapters")
    if name == "nodes":
        too_many = [n for n in values if n > cluster.max_nodes]
        if too_many:
            raise ConfigError(f"axes.nodes: {too_many} exceed cluster {cluster.name}'s max_nodes="
                              f"{cluster.max_nodes}")
    if name == "gpus_per_node":
        too_many = [g for g in values if g is not None and g > cluster.gpus_per_node]
        if too_many:
            raise ConfigError(f"axes.gpus_per_node: {too_many} exceed cluster {cluster.name}'s gpus_per_node="
                              f"{cluster.gpus_per_node}")


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


def from_dict(raw: dict[str, Any]) -> SweepConfig:
    """Validate a resolved config (OmegaConf.to_container) into a SweepConfig."""
    if not raw.get("sweep_name"):
        raise ConfigError("no sweep chosen")
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    if unknown:  # `+dry_runn=true` must not launch for real
        raise ConfigError(f"unknown key(s): {', '.join(unknown)}; known: {', '.join(TOP_LEVEL_KEYS)}")
    top = {k: _scalar(raw.get(k, default), hint, k) for k, hint, default in (
        ("seed", "int", 0), ("steps", "int", 10), ("warmup_steps", "int", 3), ("dry_run", "bool", False),
        ("rerun_failed", "bool", False), ("force", "bool", False), ("progress", "bool", True))}
    if not _SWEEP_NAME.match(str(raw["sweep_name"])) or str(raw["sweep_name"]) in (".", ".."):
        raise ConfigError(f"sweep_name={raw['sweep_name']!r}: a plain name (letters, digits, ._-), so the sweep "
                          "dir stays under results_root")
    cluster_raw = dict(raw.get("cluster") or {})
    cluster = _build(ClusterConfig, cluster_raw, "cluster", {
        "slurm": lambda v, w: _build(SlurmClusterConfig, v, w, {"extra_sbatch": _as_list}),
        "kubernetes": lambda v, w: _build(K8sClusterConfig, v, w),
        "gpus_per_node": _positive_int, "max_nodes": _positive_int})
    if cluster.gpu is not None and cluster.gpu not in GPUS:
        raise ConfigError(f"cluster.gpu: unknown GPU {cluster.gpu!r}; known: {', '.join(GPUS)}")
    _check_kubernetes(cluster.kubernetes)
    launcher = _build(LauncherConfig, dict(raw.get("launcher") or {}), "launcher",
                      {"max_nodes": _positive_int})
    if launcher.name not in LAUNCHERS:
        raise ConfigError(f"launcher.name: {launcher.name!r}; known: {', '.join(LAUNCHERS)}")
    for key in ("timeout_s", "queue_timeout_s", "rendezvous_timeout_s", "grace_s", "poll_s"):
        value = getattr(launcher, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"launcher.{key} must be a positive number of seconds, got {value!r}")
    axes_raw = dict(raw.get("axes") or {})
    unknown = sorted(set(axes_raw) - set(AXES))
    if unknown:
        raise ConfigError(f"unknown axis {', '.join(unknown)}; axes are: {', '.join(AXES)}")
    axes = {k: _as_list(v, f"axes.{k}") for k, v in axes_raw.items()}
    for name, values in axes.items():
        _check_axis(name, values, cluster)
    if "HYBRID_SHARD" in axes.get("sharding", ()) and axes.get("model") and cluster.gpus_per_node < 2:
        raise ConfigError(f"HYBRID_SHARD needs >= 2 GPUs per node to shard within a node; cluster "
                          f"{cluster.name} has gpus_per_node={cluster.gpus_per_node}")
    for i, rule in enumerate(raw.get("exclude") or []):
        if not isinstance(rule, dict) or set(rule) - set(AXES):
            raise ConfigError(f"exclude[{i}] must map axis names ({', '.join(AXES)}) to values: {rule!r}")
    nccl = _build(NcclSweepConfig, dict(raw.get("nccl") or {}), "nccl",
                  {"nodes": _as_list, "efa_per_node": _as_list, "gpus_per_node": _as_list})
    if nccl.enabled and nccl.nodes and max(nccl.nodes) > cluster.max_nodes:
        raise ConfigError(f"nccl.nodes {list(nccl.nodes)} exceed cluster {cluster.name}'s max_nodes="
                          f"{cluster.max_nodes}")
    faults = tuple(_build(FaultRule, dict(f), f"faults[{i}]") for i, f in enumerate(raw.get("faults") or []))
    for f in faults:
        unknown = sorted(set(f.match) - set(SPEC_FIELDS))
        if unknown:  # a misspelt key would never match: the fault would silently never fire
            raise ConfigError(f"faults: unknown match key(s) {', '.join(unknown)}; keys are run spec fields: "
                              f"{', '.join(SPEC_FIELDS)}")
        if f.fault not in FAULT_KINDS:
            raise ConfigError(f"faults: unknown fault {f.fault!r}; known: {', '.join(FAULT_KINDS)}")
    search = _build(MicroBatchSearch, dict(raw.get("micro_batch_search") or {}), "micro_batch_search",
                    {"max": _positive_int, "steps": _positive_int})
    if not 0 <= search.warmup_steps < search.steps:
        raise ConfigError("micro_batch_search: need 0 <= warmup_steps < steps")
    steps, warmup = top["steps"], top["warmup_steps"]
    if not 0 <= warmup < steps:
        raise ConfigError(f"need 0 <= warmup_steps < steps, got warmup_steps={warmup}, steps={steps}")
    return SweepConfig(
        name=str(raw["sweep_name"]), results_root=str(raw.get("results_root", "results")), axes=axes,
        repeats=_positive_int(raw.get("repeats", 1), "repeats"), steps=steps, warmup_steps=warmup,
        seed=top["seed"], exclude=tuple(raw.get("exclude") or ()), nccl=nccl,
        faults=faults, micro_batch_search=search, cluster=cluster, launcher=launcher,
        dry_run=top["dry_run"], rerun_failed=top["rerun_failed"], force=top["force"], progress=top["progress"])
