"""The published FSDP rows collected for issue 77 (benchmarks/published/fsdp/rows.yaml; its README gives the
schema and every mapping rule), read as the runs they are in this harness's axes: `fsdp_rows`. The file is
data, not code: a row the loader cannot read stops it with a one-line FsdpRowError naming the row."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from bench.core.fabric import FABRICS, TRANSPORTS, Fabric, ScaleOut, ScaleUp
from bench.core.hardware import GPUS, INSTANCES, GpuSpec
from bench.core.models import PRESETS, ModelArch
from bench.core.schema import AC_MODES, ACCUMULATIONS, PRECISIONS, SHARDINGS, RunSpec
from bench.predict.comm import Network
from bench.predict.network import network_for
from bench.predict.perf import Stack
from bench.predict.published import FOUNDRY_2023, H100_96GB_500W, PublishedRow

FSDP_ROWS = Path(__file__).resolve().parents[2] / "benchmarks" / "published" / "fsdp" / "rows.yaml"
CONFIDENCES = ("high", "medium", "low")
FSDP_STACKS = ("torchtitan", "fms-fsdp", "fsdp1", "vectorlm", "kempnerforge", "hf-accelerate",
               "llm-foundry-fa1", "other")
# The stacks the model reads as another training stack (perf.Stack) than its eager Hugging Face model:
# Composer's MosaicGPT and llm-foundry's MPT blocks with a FlashAttention-1 class kernel (flash-attn 1.x, its
# CUDA kernel or its Triton one), as published.py says
PERF_STACKS: dict[str, Stack] = {"llm-foundry-fa1": FOUNDRY_2023}
MEASURED_AS = ("tokens", "mfu", "tflops", "step_time", "efficiency")  # what the source published
FABRIC_BASES = ("stated", "system", "assumed")  # the source says it; the named system publishes it; neither
ROW_GPUS = {**GPUS, H100_96GB_500W.name: H100_96GB_500W}
# A node's scale-up domain by GPU where a row names none (its scale_up): NVSwitch joining the GPUs in use,
# each at half its datasheet's bidirectional NVLink figure (A100 NVLink3 600 GB/s, H100/H200 NVLink4 900,
# B200 NVLink5 1800), NVLink SHARP from H100's NVSwitch generation on; then the compute capability and the
# PCIe generation
NODE_FACTS: dict[str, tuple[float, bool, int, int]] = {
    "A100-SXM4-40GB": (300.0, False, 80, 4), "A100-SXM4-80GB": (300.0, False, 80, 4),
    "H100-SXM": (450.0, True, 90, 5), "H100-96GB-500W": (450.0, True, 90, 5), "H200": (450.0, True, 90, 5),
    "B200": (900.0, True, 100, 5)}
_ROW_KEYS = ("id", "series", "source", "confidence", "already_used", "params_b", "gpu", "nodes",
             "gpus_per_node", "fabric", "sharding", "precision", "activation_checkpointing", "compile",
             "micro_batch", "seq_len", "grad_accum", "accumulation", "global_batch", "stack",
             "tokens_per_s_per_gpu", "measured_as", "scaling_efficiency", "efficiency_base", "modelled",
             "why_not", "notes")
_ROW_OPTIONAL = ("model", "arch", "scale_up", "shard_group", "efficiency_base_nodes")
_ARCH_KEYS = ("name", "hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab", "tied",
              "max_seq")
_FABRIC_KEYS = ("transport", "adapters", "gbps", "rdma", "basis")
_SCALE_UP_KEYS = ("kind", "gpus", "gbs", "nvls")


class FsdpRowError(ValueError):
    """A row of the published FSDP rows file that cannot be read: one line naming the file and the row."""


@dataclass(frozen=True)
class PublishedFsdpRow:
    """One published FSDP row as benchmarks/published/fsdp/rows.yaml maps it: the run it is (spec, arch, GPU,
    the network published._row would build, the fabric NCCL would see), what was measured, and against
    which base."""

    id: str
    series: str  # the rows of one configuration at different GPU counts share it
    source: str
    confidence: str
    already_used: bool  # also among CALIBRATION_ROWS / CHECK_ROWS
    nodes: int
    gpus_per_node: int
    arch: ModelArch
    gpu: GpuSpec | None  # None: a GPU this project has no row for
    spec: RunSpec | None  # None: a field a run needs was not published
    fabric: Fabric | None  # None only without a GPU; a one-node row's has no scale_out
    network: Network
    stack: str  # what trained it (FSDP_STACKS)
    tokens_per_s_per_gpu: float | None
    measured_as: str  # what the source published (MEASURED_AS); tokens converted from it where not tokens
    scaling_efficiency: float | None  # a published figure only, against base_spec
    efficiency_base: str | None  # the base's row id, where the base is a row
    base_spec: RunSpec | None  # the configuration the efficiency is against
    base_network: Network | None  # and its network
    modelled: bool
    why_not: str
    notes: str

    @property
    def perf_stack(self) -> Stack | None:
        """The training stack the model reads the row with (PERF_STACKS), None for its own."""
        return PERF_STACKS.get(self.stack)

    @property
    def published_row(self) -> PublishedRow:
        """The row as CALIBRATION_ROWS holds its rows (a modelled row only)."""
        if not self.modelled or self.spec is None or self.gpu is None:
            raise ValueError(f"row {self.id} is not modelled: {self.why_not}")
        return PublishedRow(self.source, self.arch, self.gpu, self.spec, self.network,
                            self.tokens_per_s_per_gpu, self.scaling_efficiency,
                            self.base_spec.nodes if self.base_spec else 1, stack=self.perf_stack)


class _Fields:
    """One mapping of the file: its keys checked against the schema, and every read naming the row in its
    error."""

    def __init__(self, raw: object, where: str, keys: tuple[str, ...],
                 optional: tuple[str, ...] = ()) -> None:
        if not isinstance(raw, dict):
            raise FsdpRowError(f"{where}: a mapping of {', '.join(keys)} expected, got {raw!r}")
        self.raw, self.where = raw, where
        if unknown := sorted(set(raw) - set(keys) - set(optional)):
            self.fail(f"unknown field {unknown[0]!r}")
        if missing := [k for k in keys if k not in raw]:
            self.fail(f"missing field {missing[0]!r}")

    def fail(self, why: str) -> NoReturn:
        raise FsdpRowError(f"{self.where}: {why}")

    def get(self, key: str, kind: type | tuple[type, ...], optional: bool = False,
            choices: tuple[str, ...] = ()) -> Any:
        """The value, of its type (a number positive; true/false no number), one of `choices` where given."""
        value = self.raw.get(key)
        if value is None and optional:
            return None
        number = kind in (int, float) or kind == (int, float)
        if not isinstance(value, kind) or number and (isinstance(value, bool) or value <= 0):
            what = "a positive number" if number else getattr(kind, "__name__", str(kind))
            self.fail(f"{key}={value!r} is not {what}")
        if choices and value not in choices:
            self.fail(f"{key}={value!r} is not one of: {', '.join(choices)}")
        return value

    def sub(self, key: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> _Fields:
        return _Fields(self.raw[key], f"{self.where}: {key}", keys, optional)


def _row_arch(r: _Fields) -> ModelArch:
    """A preset by name, or the architecture the row spells out."""
    if ("model" in r.raw) == ("arch" in r.raw):
        r.fail("give exactly one of model (a preset) and arch")
    if "model" in r.raw:
        return PRESETS[r.get("model", str, choices=tuple(PRESETS))]
    a = r.sub("arch", _ARCH_KEYS, ("family", "t5_ff"))
    family = a.get("family", str, optional=True, choices=("llama", "t5")) or "llama"
    t5_ff = a.get("t5_ff", str, optional=True, choices=("relu", "gated-gelu"))
    if t5_ff and family != "t5":
        a.fail("t5_ff is a T5 family's field")
    n = {k: a.get(k, int) for k in _ARCH_KEYS if k not in ("name", "tied")}
    return ModelArch(a.get("name", str), family, n["hidden"], n["intermediate"], n["layers"], n["heads"],
                     n["kv_heads"], n["head_dim"], n["vocab"], a.get("tied", bool), n["max_seq"],
                     t5_ff=t5_ff or "relu")


def _row_fabric(r: _Fields, gpu: GpuSpec | None, nodes: int, gpus: int) -> Fabric | None:
    """FABRICS' preset, or the row's adapters over its GPU's scale-up domain (no adapters on one node)."""
    value = r.raw["fabric"]
    if (value is None) != (nodes == 1):
        r.fail("fabric is null for one node and given for several")
    if isinstance(value, str):
        preset = FABRICS[r.get("fabric", str, choices=tuple(FABRICS))]
        if preset.gpus_per_node != gpus:
            r.fail(f"fabric {value} has {preset.gpus_per_node} GPUs per node, the row {gpus}")
        return preset
    out = None
    if value is not None:
        f = r.sub("fabric", _FABRIC_KEYS)
        f.get("basis", str, choices=FABRIC_BASES)
        try:
            out = ScaleOut(f.get("transport", str, choices=TRANSPORTS), f.get("adapters", int),
                           f.get("gbps", (int, float)), f.get("rdma", bool))
        except ValueError as e:
            f.fail(str(e))
    if gpu is None:
        return None
    gbs, nvls, capability, pcie = NODE_FACTS[gpu.name]
    up = ScaleUp("nvswitch", gpus, gbs, nvls=nvls)
    if r.raw.get("scale_up") is not None:
        s = r.sub("scale_up", _SCALE_UP_KEYS)
        try:
            up = ScaleUp(s.get("kind", str), s.get("gpus", int), s.get("gbs", (int, float)),
                         s.get("nvls", bool))
        except ValueError as e:
            s.fail(str(e))
    return Fabric(up, out, gpus, capability, pcie_gen=pcie, name=r.raw["id"], source=r.raw["source"])


def _row_network(fabric: Fabric | None, spec: RunSpec | None, nodes: int) -> Network:
    """A row's network: its fabric with every adapter it has (an EFA instance's all of them), NCCL's model of
    it at the row's node count."""
    efa = spec.efa_per_node if spec is not None else 0
    out = fabric.scale_out if fabric is not None else None
    if out is not None and out.transport == "efa" and not efa:
        efa = fabric.scale_out.adapters
    return network_for(fabric, efa, nodes)


def _row_spec(r: _Fields, arch: ModelArch, nodes: int, gpus: int) -> RunSpec | None:
    """The run, where every field a run needs was published; refused where the fields contradict one another.
    A preset's run names it; another architecture's names it too (the row's arch is what counts)."""
    mb = r.get("micro_batch", int, optional=True)
    ac = r.get("activation_checkpointing", str, optional=True, choices=AC_MODES)
    accumulation, steps = r.get("accumulation", str, choices=ACCUMULATIONS), r.get("grad_accum", int)
    stated = r.get("global_batch", int, optional=True)
    if mb and stated and stated != mb * steps * nodes * gpus:
        r.fail(f"global_batch {stated} is not micro_batch x grad_accum x GPUs = {mb * steps * nodes * gpus}")
    if mb is None or ac is None:
        return None
    fabric = r.raw["fabric"]
    aws = fabric if isinstance(fabric, str) and fabric in INSTANCES else ""
    try:
        return RunSpec(model=arch.name, nodes=nodes, gpus_per_node=gpus, sharding=r.raw["sharding"],
                       precision=r.raw["precision"], activation_checkpointing=ac, compile=r.raw["compile"],
                       micro_batch=mb, seq_len=r.raw["seq_len"], accumulation=accumulation,
                       global_batch=mb * steps * nodes * gpus if steps > 1 else 0,
                       efa_per_node=INSTANCES[aws].efa if aws else 0, cluster=aws or "local")
    except ValueError as e:
        r.fail(str(e))


def _row_efficiency(r: _Fields, nodes: int, measured: str) -> tuple[float | None, str | None, int | None]:
    """The published efficiency and its base: a row (its id) or this configuration on fewer nodes."""
    efficiency = r.get("scaling_efficiency", (int, float), optional=True)
    base = r.get("efficiency_base", str, optional=True)
    base_nodes = r.get("efficiency_base_nodes", int, optional=True)
    if (efficiency is None) != (base is None and base_nodes is None) or (base and base_nodes):
        r.fail("a scaling_efficiency takes exactly one of efficiency_base (a row) and efficiency_base_nodes")
    if efficiency is None and measured == "efficiency":
        r.fail("measured_as efficiency without a scaling_efficiency")
    if base_nodes is not None and base_nodes >= nodes:
        r.fail(f"efficiency_base_nodes {base_nodes} is not fewer than the row's {nodes} nodes")
    return efficiency, base, base_nodes


def _read_row(r: _Fields) -> PublishedFsdpRow:
    """A row checked field by field, then as a whole, and mapped."""
    for key in ("id", "series", "source", "notes"):
        r.get(key, str)
    if not re.fullmatch(r"[a-z0-9_]+", r.raw["id"]):
        r.fail(f"id {r.raw['id']!r}: lower-case letters, digits and _ only")
    for key in ("already_used", "compile", "modelled"):
        r.get(key, bool)
    r.get("confidence", str, choices=CONFIDENCES)
    r.get("stack", str, choices=FSDP_STACKS)
    measured = r.get("measured_as", str, choices=MEASURED_AS)
    r.get("params_b", (int, float), optional=True)
    r.get("seq_len", int)
    r.get("precision", str, choices=PRECISIONS)
    nodes, gpus = r.get("nodes", int), r.get("gpus_per_node", int)
    sharding = r.get("sharding", str, choices=SHARDINGS)
    group = r.get("shard_group", int, optional=True)
    if group is not None and sharding != "HYBRID_SHARD":
        r.fail("shard_group is HYBRID_SHARD's field")
    if group not in (None, gpus) and r.raw["modelled"]:
        r.fail(f"shard_group {group} is not one node's {gpus} GPUs, the project's HYBRID_SHARD: not modelled")
    gpu_name = r.get("gpu", str, optional=True, choices=tuple(ROW_GPUS))
    gpu = ROW_GPUS[gpu_name] if gpu_name else None
    if gpu is not None and gpu.name not in NODE_FACTS:
        r.fail(f"gpu {gpu.name} has no node facts (NODE_FACTS)")
    arch = _row_arch(r)
    fabric, spec = _row_fabric(r, gpu, nodes, gpus), _row_spec(r, arch, nodes, gpus)
    tokens = r.get("tokens_per_s_per_gpu", (int, float), optional=True)
    if (tokens is None) != (measured == "efficiency"):
        r.fail("tokens_per_s_per_gpu is null where, and only where, measured_as is efficiency")
    efficiency, base, base_nodes = _row_efficiency(r, nodes, measured)
    why = r.get("why_not", str, optional=True)
    if r.raw["modelled"] and why is not None:
        r.fail("a modelled row has no why_not")
    if r.raw["modelled"] and (gpu is None or spec is None):
        r.fail("a modelled row needs its GPU, micro batch and activation checkpointing")
    if not r.raw["modelled"] and not why:
        r.fail("a row not modelled says why_not")
    return PublishedFsdpRow(
        r.raw["id"], r.raw["series"], r.raw["source"], r.raw["confidence"], r.raw["already_used"], nodes,
        gpus, arch, gpu, spec, fabric, _row_network(fabric, spec, nodes), r.raw["stack"], tokens, measured,
        efficiency, base, spec.at_nodes(base_nodes) if spec and base_nodes else None,
        _row_network(fabric, spec, base_nodes) if base_nodes else None, r.raw["modelled"], why or "",
        r.raw["notes"])


def _with_base(row: PublishedFsdpRow, rows: dict[str, PublishedFsdpRow], where: str) -> PublishedFsdpRow:
    """An efficiency's base row: of the same series, on fewer GPUs; its spec and network are the row's
    base_spec and base_network."""
    if row.efficiency_base is None:
        return row
    base = rows.get(row.efficiency_base)
    if base is None:
        raise FsdpRowError(f"{where}: row {row.id}: efficiency_base {row.efficiency_base!r} is no row")
    if base.series != row.series or base.nodes * base.gpus_per_node >= row.nodes * row.gpus_per_node:
        raise FsdpRowError(f"{where}: row {row.id}: efficiency_base {base.id} is not a row of series "
                           f"{row.series} on fewer GPUs")
    return replace(row, base_spec=base.spec, base_network=base.network)


def fsdp_rows(path: Path = FSDP_ROWS) -> list[PublishedFsdpRow]:
    """Every row of the published FSDP rows file, checked: an unknown field or value, or fields that
    contradict one another, is a one-line FsdpRowError naming the row."""
    import yaml  # as bench/core/models.py reads a model file: only where rows are read

    from bench.core.yaml_text import safe_load
    try:
        raw = safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise FsdpRowError(f"{path}: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, list):
        raise FsdpRowError(f"{path}: a list of rows expected")
    rows: dict[str, PublishedFsdpRow] = {}
    for i, item in enumerate(raw, 1):
        name = item.get("id") if isinstance(item, dict) else None
        row = _read_row(_Fields(item, f"{path.name}: row {name or i}", _ROW_KEYS, _ROW_OPTIONAL))
        if row.id in rows:
            raise FsdpRowError(f"{path.name}: row {row.id}: the id is used twice")
        rows[row.id] = row
    return [_with_base(row, rows, path.name) for row in rows.values()]


def fsdp_counts(rows: list[PublishedFsdpRow]) -> dict[str, int]:
    """What the rows cover, as benchmarks/published/fsdp/README.md counts them (all rows, and those not
    already_used)."""
    one_node = [r for r in rows if r.nodes == 1]
    counts = {"rows": len(rows), "modelled rows": sum(r.modelled for r in rows),
              "rows above 8 nodes": sum(r.nodes > 8 for r in rows),
              "modelled rows above 8 nodes": sum(r.nodes > 8 and r.modelled for r in rows),
              "one-node rows": len(one_node)}
    for g in sorted({r.gpus_per_node for r in one_node}):
        counts[f"one-node rows on {g} GPU{'s' * (g > 1)}"] = sum(r.gpus_per_node == g for r in one_node)
    counts["series"] = len({r.series for r in rows})
    counts["series with a published scaling efficiency"] = len({r.series for r in rows
                                                                 if r.scaling_efficiency})
    return counts
