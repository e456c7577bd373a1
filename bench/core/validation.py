"""The rules a sweep configuration's types cannot say, checked before anything is launched or written:
every value of a `Literal`-typed field is one of its values (OmegaConf reads such a field as a plain str),
ranges, cross-field rules, and the values a scheduler would refuse. The first rule broken is a ConfigError
of one line; the sweep prints it, exit 2. The fields themselves, with their types, defaults and meanings,
are `bench/core/config.py`'s.
"""
from __future__ import annotations

import math
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
    FaultRule,
    K8sClusterConfig,
    LauncherConfig,
    NcclSweepConfig,
    PreflightConfig,
    SweepConfig,
    TraceConfig,
    literal_choices,
)
from bench.core.hardware import GPUS, supports_fp8
from bench.core.models import ModelError, model_source
from bench.core.schema import COLLECTIVES, SPEC_FIELDS

_SWEEP_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _positive(where: str, value: float | None, kind: str = "integer") -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{where} must be a positive {kind}, got {value!r}")


def check_choices(node: Any, prefix: str = "", in_list: str | None = None) -> None:
    """Every value of a Literal-typed field, or of a list of them, is one of the Literal's values, in every
    section below `node`. A field of a list's entries (faults) is named by the list: "faults: unknown
    fault 'x'"."""
    hints = get_type_hints(type(node))
    for f in fields(node):
        value, hint, key = getattr(node, f.name), hints[f.name], f"{prefix}{f.name}"
        if is_dataclass(value):
            check_choices(value, key + ".")
        elif isinstance(value, list) and get_origin(hint) is list:
            known = literal_choices(get_args(hint)[0])
            for v in value:
                if is_dataclass(v):
                    check_choices(v, key + ".", in_list=key)
                elif known and v not in known:
                    raise ConfigError(f"{key}: unknown value {v!r}; known: {', '.join(known)}")
        elif value is not None and (known := literal_choices(hint)) and value not in known:
            if in_list:
                raise ConfigError(f"{in_list}: unknown {f.name} {value!r}; known: {', '.join(known)}")
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
    checks += [("exclude_nodes", node, _RFC1123_SUBDOMAIN, "a node name") for node in k.exclude_nodes]
    for key, value, pattern, what in checks:
        if value is not None and (not pattern.match(value) or len(value) > 253):
            raise ConfigError(f"cluster.kubernetes.{key}={value!r} is not {what}")


def _check_collectives(nccl: NcclSweepConfig) -> None:
    """Collectives the probes know, every unknown one named at once (before `check_choices`, which would
    name the first)."""
    if unknown := [c for c in nccl.collectives if c not in COLLECTIVES]:
        raise ConfigError(f"nccl.collectives: unknown collective(s) {unknown}; known: "
                          f"{', '.join(COLLECTIVES)}")


def _check_probes(nccl: NcclSweepConfig, cluster: ClusterConfig) -> None:
    """At least one collective; EFA counts the instance has (a cluster file that names its adapters: more
    than it has would measure nothing, or another count mislabelled)."""
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
    if not launcher.name:
        raise ConfigError(f"launcher.name is empty; built-in: {', '.join(LAUNCHERS)}")
    for key in ("timeout_s", "queue_timeout_s", "rendezvous_timeout_s", "grace_s", "poll_s"):
        _positive(f"launcher.{key}", getattr(launcher, key), "number of seconds")
    _positive("launcher.max_nodes", launcher.max_nodes)


def _check_faults(faults: list[FaultRule]) -> None:
    for f in faults:
        if unknown := sorted(set(f.match) - set(SPEC_FIELDS)):  # a misspelt key would silently never fire
            raise ConfigError(f"faults: unknown match key(s) {', '.join(unknown)}; keys are run spec fields: "
                              f"{', '.join(SPEC_FIELDS)}")


def _check_trace(t: TraceConfig) -> None:
    if t.steps < 1:
        raise ConfigError(f"trace.steps={t.steps} must be >= 1 (trace.enabled=false records none)")


def _check_preflight(p: PreflightConfig) -> None:
    if not 0 < p.tolerance < 1:
        raise ConfigError(f"preflight.tolerance={p.tolerance} must be a fraction between 0 and 1")
    for name in ("seconds", "timeout_s", "pair_bytes"):
        if getattr(p, name) <= 0:
            raise ConfigError(f"preflight.{name} must be > 0, got {getattr(p, name)}")


def _check_steps(cfg: SweepConfig) -> None:
    """Repeats, the timed window after the warm-up, and the auto micro batch's trial runs."""
    _positive("repeats", cfg.repeats)
    if not 0 <= cfg.warmup_steps < cfg.steps:
        raise ConfigError(f"need 0 <= warmup_steps < steps, got warmup_steps={cfg.warmup_steps}, "
                          f"steps={cfg.steps}")
    if True in cfg.axes.compile and cfg.warmup_steps < COMPILE_WARMUP:
        raise ConfigError(f"axes.compile: the first step compiles every block; warmup_steps="
                          f"{cfg.warmup_steps} would time it (need >= {COMPILE_WARMUP})")
    search = cfg.micro_batch_search
    _positive("micro_batch_search.max", search.max)
    _positive("micro_batch_search.steps", search.steps)
    if not 0 <= search.warmup_steps < search.steps:
        raise ConfigError("micro_batch_search: need 0 <= warmup_steps < steps")


def _check_money(cfg: SweepConfig) -> None:
    """The token budget, the prices and the knee's threshold: finite, and in their ranges."""
    tokens, price = cfg.study.train_tokens, cfg.cluster.price_per_hour
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        raise ConfigError(f"study.train_tokens must be a positive number of tokens, e.g. 1e12, got "
                          f"{tokens!r}")
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise ConfigError(f"cluster.price_per_hour must be USD per instance-hour (>= 0), got {price!r}")
    energy = cfg.cluster.energy_price
    if energy is not None and not (math.isfinite(energy) and energy >= 0):
        raise ConfigError(f"cluster.energy_price must be USD per kWh (>= 0), got {energy!r}")
    if not 0 < cfg.study.knee_share <= 1:
        raise ConfigError(f"study.knee_share must be in (0, 1], got {cfg.study.knee_share!r}")


def validate(cfg: SweepConfig) -> None:
    """The rules a type cannot express; the first one broken is a ConfigError."""
    if not cfg.sweep_name:
        raise ConfigError("no sweep chosen")
    if not _SWEEP_NAME.match(cfg.sweep_name) or cfg.sweep_name in (".", ".."):
        raise ConfigError(f"sweep_name={cfg.sweep_name!r}: a plain name (letters, digits, ._-), so the sweep "
                          "dir stays under results_root")
    _check_collectives(cfg.nccl)
    check_choices(cfg)
    _check_cluster(cfg.cluster)
    _check_launcher(cfg.launcher)
    _check_preflight(cfg.preflight)
    _check_axes(cfg.axes, cfg.cluster)
    for i, rule in enumerate(cfg.exclude):
        if set(rule) - set(AXES):
            raise ConfigError(f"exclude[{i}] must map axis names ({', '.join(AXES)}) to values: {rule!r}")
    _check_steps(cfg)
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
    _positive("launcher.collective_timeout_s", cfg.launcher.collective_timeout_s, "number")
    if (cfg.launcher.collective_timeout_s or 0) >= cfg.launcher.timeout_s:
        raise ConfigError(f"launcher.collective_timeout_s={cfg.launcher.collective_timeout_s:g} must be "
                          f"below launcher.timeout_s={cfg.launcher.timeout_s:g}: a hung collective must fail "
                          "(and dump) before the harness stops the run")
    _check_money(cfg)
    _positive("memory.workers", cfg.memory.workers)
    _positive("memory.timeout_s", cfg.memory.timeout_s, "number")
