"""The rules a sweep configuration's types cannot say, checked before anything is launched or written:
what each field declares (`check_fields`: a `Literal`'s values, which OmegaConf reads as a plain str, and a
`Range` or `Matches` on the field), then cross-field rules and the values a scheduler would refuse. The first
rule broken is a ConfigError of one line; the sweep prints it, exit 2. The fields themselves, with their
types, ranges, defaults and meanings, are `bench/core/config.py`'s (and each launcher's own section's).
"""
from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

from bench.core.config import (
    AUTO,
    AXES,
    COMPILE_WARMUP,
    LAUNCHERS,
    Axes,
    ClusterConfig,
    ConfigError,
    LauncherConfig,
    NcclSweepConfig,
    SweepConfig,
    constraint_of,
    literal_choices,
)
from bench.core.fabric import FABRICS
from bench.core.hardware import GPUS, supports_fp8
from bench.core.models import ModelError, model_source
from bench.core.schema import COLLECTIVES

_SWEEP_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def check_fields(node: Any, prefix: str = "", in_list: str | None = None) -> None:
    """What every field below `node` declares, in every section: a Literal's value (or each of a list's) is
    one of its values, and a number or string meets the Range or Matches annotated on its field (each
    entry of a list; null passes). A field of a list's entries is named by the list: "X: unknown fault
    'x'"."""
    hints, declared = get_type_hints(type(node)), get_type_hints(type(node), include_extras=True)
    for f in fields(node):
        value, hint, key = getattr(node, f.name), hints[f.name], f"{prefix}{f.name}"
        if is_dataclass(value):
            check_fields(value, key + ".")
            continue
        _check_choices(key, f.name, value, hint, in_list)
        if (constraint := constraint_of(declared[f.name])) is not None:
            for v in value if isinstance(value, list) else [value]:
                if v is not None and not constraint.holds(v):
                    raise ConfigError(constraint.problem(key, v))


def _check_choices(key: str, name: str, value: Any, hint: Any, in_list: str | None) -> None:
    if isinstance(value, list) and get_origin(hint) is list:
        known = literal_choices(get_args(hint)[0])
        for v in value:
            if known and v not in known:
                raise ConfigError(f"{key}: unknown value {v!r}; known: {', '.join(known)}")
    elif value is not None and (known := literal_choices(hint)) and value not in known:
        if in_list:
            raise ConfigError(f"{in_list}: unknown {name} {value!r}; known: {', '.join(known)}")
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(known)}")


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
    if set(axes.accumulation) != {"sync_each"} and None in axes.global_batch:
        raise ConfigError(f"axes.accumulation {list(axes.accumulation)} needs axes.global_batch: without one "
                          "a step is one micro batch, with nothing to accumulate")
    for v in axes.micro_batch:
        if v != AUTO and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"axes.micro_batch must be a positive integer or {AUTO}, got {v!r}")
    _check_efa_fabric(cluster, [v for v in axes.efa_per_node if v], "axes.efa_per_node")
    for v in axes.efa_per_node:
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


def _check_collectives(nccl: NcclSweepConfig) -> None:
    """Collectives the probes know, every unknown one named at once (before `check_fields`, which would
    name the first)."""
    if unknown := [c for c in nccl.collectives if c not in COLLECTIVES]:
        raise ConfigError(f"nccl.collectives: unknown collective(s) {unknown}; known: "
                          f"{', '.join(COLLECTIVES)}")


def _check_probes(nccl: NcclSweepConfig, cluster: ClusterConfig) -> None:
    """At least one collective; EFA counts the instance has (a cluster file that names its adapters: more
    than it has would measure nothing, or another count mislabelled)."""
    if nccl.enabled and not nccl.collectives:
        raise ConfigError("nccl.collectives is empty: name at least one of " + ", ".join(COLLECTIVES))
    _check_efa_fabric(cluster, [v for v in nccl.efa_per_node or () if v], "nccl.efa_per_node")
    for v in nccl.efa_per_node or ():
        if cluster.efa_per_node and v > cluster.efa_per_node:
            raise ConfigError(f"nccl.efa_per_node: {v} EFA adapters per node, but {cluster.instance_type} "
                              f"has {cluster.efa_per_node} (cluster {cluster.name})")


def _check_cluster(cluster: ClusterConfig) -> None:
    if cluster.gpu is not None and cluster.gpu not in GPUS:
        raise ConfigError(f"cluster.gpu: unknown GPU {cluster.gpu!r}; known: {', '.join(GPUS)}")


def _check_launcher(launcher: LauncherConfig) -> None:
    if not launcher.name:
        raise ConfigError(f"launcher.name is empty; built-in: {', '.join(LAUNCHERS)}")
    if (launcher.collective_timeout_s or 0) >= launcher.timeout_s:
        raise ConfigError(f"launcher.collective_timeout_s={launcher.collective_timeout_s:g} must be below "
                          f"launcher.timeout_s={launcher.timeout_s:g}: a hung collective must fail (and "
                          "dump) before the harness stops the run")


def _check_steps(cfg: SweepConfig) -> None:
    """The timed window after the warm-up, and the auto micro batch's trial runs."""
    if not 0 <= cfg.warmup_steps < cfg.steps:
        raise ConfigError(f"need 0 <= warmup_steps < steps, got warmup_steps={cfg.warmup_steps}, "
                          f"steps={cfg.steps}")
    if True in cfg.axes.compile and cfg.warmup_steps < COMPILE_WARMUP:
        raise ConfigError(f"axes.compile: the first step compiles every block; warmup_steps="
                          f"{cfg.warmup_steps} would time it (need >= {COMPILE_WARMUP})")
    search = cfg.micro_batch_search
    if not 0 <= search.warmup_steps < search.steps:
        raise ConfigError("micro_batch_search: need 0 <= warmup_steps < steps")


def validate(cfg: SweepConfig) -> None:
    """The rules a type cannot express; the first one broken is a ConfigError."""
    if not cfg.sweep_name:
        raise ConfigError("no sweep chosen")
    if not _SWEEP_NAME.match(cfg.sweep_name) or cfg.sweep_name in (".", ".."):
        raise ConfigError(f"sweep_name={cfg.sweep_name!r}: a plain name (letters, digits, ._-), so the sweep "
                          "dir stays under results_root")
    _check_collectives(cfg.nccl)
    check_fields(cfg)
    _check_cluster(cfg.cluster)
    _check_launcher(cfg.launcher)
    _check_axes(cfg.axes, cfg.cluster)
    for i, rule in enumerate(cfg.exclude):
        if set(rule) - set(AXES):
            raise ConfigError(f"exclude[{i}] must map axis names ({', '.join(AXES)}) to values: {rule!r}")
    _check_steps(cfg)
    nccl = cfg.nccl
    if nccl.enabled and nccl.nodes and max(nccl.nodes) > cfg.cluster.max_nodes:
        raise ConfigError(f"nccl.nodes {list(nccl.nodes)} exceed cluster {cfg.cluster.name}'s max_nodes="
                          f"{cfg.cluster.max_nodes}")
    _check_probes(nccl, cfg.cluster)


def fabric_transport(cluster: ClusterConfig) -> str | None:
    """The transport of the cluster's network: its file's scale_out, else its preset's or instance type's
    published fabric's (bench/core/fabric.py FABRICS); None where neither says."""
    if cluster.fabric.scale_out is not None:
        return cluster.fabric.scale_out.transport
    name = cluster.fabric.preset or cluster.instance_type
    if cluster.fabric.preset and name not in FABRICS:
        raise ConfigError(f"cluster.fabric.preset: {name!r} is none of {', '.join(sorted(FABRICS))}")
    known = FABRICS.get(name)
    return known.scale_out.transport if known and known.scale_out else None


def _check_efa_fabric(cluster: ClusterConfig, efa: list[int], key: str) -> None:
    """EFA adapters only where the cluster's network is EFA (another fabric has none to choose)."""
    transport = fabric_transport(cluster)
    if cluster.efa_per_node and transport not in (None, "efa"):
        raise ConfigError(f"cluster.efa_per_node={cluster.efa_per_node}, but cluster {cluster.name}'s "
                          f"network is {transport}: set it to 0")
    if efa and transport not in (None, "efa"):
        raise ConfigError(f"{key}: {efa} EFA adapters, but cluster {cluster.name}'s network is {transport}: "
                          f"set {key}=[0] (its fabric is used whole)")
