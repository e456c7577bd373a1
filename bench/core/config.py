"""The sweep configuration, typed once: the dataclasses below are the schema Hydra composes sweeps/ into
(registered in its ConfigStore as `sweep_schema`, the first entry of sweeps/config.yaml's defaults), and
`bench.core.load_config.from_dict` merges a composed config into them again with OmegaConf, so OmegaConf
itself refuses a wrong type or an unknown key, a `+key=` override included.

Every field's type, default and meaning is written here, once: the docstring under each field says what it
means and in what unit, a section's docstring is its class's, and `bench/core/config_doc.py` reads them
from the source for `python -m bench.sweep --help` and docs/study.md's reference. The YAML files set only
what differs. A field of fixed choices is typed with the `Literal` of its list's owner
(`bench/core/schema.py`: `SHARDINGS` is `get_args(Sharding)`); OmegaConf 2.3 reads no Literal, so it is
handed the same dataclasses with each Literal as its values' type (`load_config.omegaconf_schema`). A number's
range, or a string's form, is declared on its field (`Annotated[float, POSITIVE]`: a `Range` or a `Matches`),
checked by one rule (`bench.core.validation.check_fields`) and printed beside the type by --help-config.

Each launcher owns its settings: the keys every launcher reads are `LauncherConfig`'s, and a launcher's own
keys are a dataclass of its module (its class's `settings`), the section `launcher.<its name>`
(`bench.launchers.launcher_sections`; a plug-in launcher brings its own the same way). Those sections join
the schema when it is loaded (`load_config.with_sections`).

Every value is then checked against its Literal and its declared range, with the rules a type cannot say
(cross-field rules, what a scheduler would refuse), by `bench/core/validation.py`. Every problem is a
ConfigError of one line; the sweep prints it, exit 2.
"""
from __future__ import annotations

import math
import re
import types
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from omegaconf import MISSING

from bench.core.fabric import CpuVendor, NicPath, ScaleUpKind, Transport
from bench.core.schema import (
    COLLECTIVES,
    Accumulation,
    ACMode,
    Collective,
    Offload,
    Precision,
    Sharding,
    TraceRanks,
    WrapPolicy,
)

Auto = Literal["auto"]
AUTO: Auto = get_args(Auto)[0]  # axes.micro_batch value: search the largest micro batch that fits
COMPILE_WARMUP = 1  # compile=true: step 0 compiles forward and backward; later steps reuse it (measured)
LAUNCHERS = ("local", "dryrun", "slurm", "kubernetes")  # the built-in launchers (bench/launchers/__init__.py)
PreflightMode = Literal["auto", "on", "warn", "off"]
PREFLIGHT_MODES: tuple[PreflightMode, ...] = get_args(PreflightMode)  # preflight.mode


class ConfigError(ValueError):
    """A configuration problem, reported as one line before anything is launched (exit EXIT_CONFIG)."""


EXIT_CONFIG = 2  # every command's exit status for a ConfigError


@dataclass(frozen=True)
class Range:
    """The numbers a field allows, declared on it (`Annotated[int, Range(ge=1)]`; on a list, each entry's;
    null always passes): finite, above `gt` or from `ge`, below `lt` or up to `le`."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def text(self) -> str:
        """As --help-config prints it: `> 0`, `>= 1`, `in (0, 1]` (one bound below, one above, at most)."""
        bounds = [(op, v) for op, v in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le))
                  if v is not None]
        if len(bounds) == 2:
            (low_op, low), (high_op, high) = bounds
            return f"in {'(' if low_op == '>' else '['}{low:g}, {high:g}{')' if high_op == '<' else ']'}"
        op, value = bounds[0]
        return f"{op} {value:g}"

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def problem(self, key: str, value: Any) -> str:
        finite = isinstance(value, float) and not math.isfinite(value)
        return f"{key}={value!r} must be {'a finite number ' if finite else ''}{self.text()}"


@dataclass(frozen=True)
class Matches:
    """The form a string field takes, declared on it (`Annotated[str, Matches(pattern, "a Secret name")]`;
    on a list, each entry's; null always passes): the whole string matches `pattern`."""

    pattern: str
    what: str  # the form in words, as the error and --help-config say it

    def text(self) -> str:
        return self.what

    def holds(self, value: Any) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None

    def problem(self, key: str, value: Any) -> str:
        return f"{key}={value!r} is not {self.what}"


Constraint = Range | Matches
POSITIVE = Range(gt=0)
NON_NEGATIVE = Range(ge=0)


def constraint_of(hint: Any) -> Constraint | None:
    """The Range or Matches a field's type declares (`Annotated[..., POSITIVE]`), or None. Read with
    get_type_hints(cls, include_extras=True); without it Python drops the annotation, as OmegaConf's reading
    and every other use of the type do."""
    if get_origin(hint) is Annotated:
        return next((m for m in hint.__metadata__ if isinstance(m, (Range, Matches))), None)
    return None


@dataclass
class ScaleUpConfig:
    """How a node's GPUs reach one another (cluster.fabric.scale_up)."""

    kind: ScaleUpKind = "nvswitch"
    """nvswitch (every GPU to every other at its full NVLink rate, HGX/DGX boards), nvlink (GPUs linked in
    pairs or a mesh: a run on part of a mesh has only the links between its GPUs), or pcie (no NVLink)."""
    gbs: Annotated[float, POSITIVE] = 450.0
    """One-direction GB/s each GPU has into the domain: NVLink 4 (H100, H200) 18 links x 25 = 450, NVLink 3
    (A100) 300, NVLink 5 (B200) 900; a PCIe x16 link 24 (Gen4) or 48 (Gen5)."""
    gpus: Annotated[int | None, Range(ge=1)] = None
    """GPUs one NVLink domain joins; null: the node's (GB200 NVL72: 72, trays of 4 GPUs)."""
    nvls: bool = False
    """NVLink SHARP in the switches (NVSwitch with H100, H200, B200), which NCCL's NVLS algorithms use."""


@dataclass
class ScaleOutConfig:
    """A node's GPU-facing network (cluster.fabric.scale_out)."""

    transport: Transport = "efa"
    """efa (AWS), infiniband, roce, tcp (NCCL's sockets over plain Ethernet), tcpx or tcpxo (GCP A3's
    GPUDirect-TCPX/-TCPXO)."""
    adapters: Annotated[int, Range(ge=1)] = 1
    """GPU-facing adapters (or Ethernet ports NCCL uses) per node."""
    gbps: Annotated[float, POSITIVE] = 100.0
    """Line rate per adapter, Gb/s."""
    rdma: bool = True
    """GPUDirect RDMA: the adapter reads and writes GPU memory (false for tcp)."""
    latency_us: Annotated[float, NON_NEGATIVE] = 0.0
    """The latency NCCL's net plugin reports per network hop, us (aws-ofi-nccl: 75 on p4d/p5, 35 on p5en;
    NCCL's IB and socket transports: 0)."""
    nic_path: NicPath = "pxb"
    """How a GPU reaches its nearest adapter, as `nvidia-smi topo -m` prints it: pix or pxb (HGX and DGX
    boards), c2c (a Grace Hopper/Blackwell superchip's NIC on its Grace CPU), phb (through the CPU's host
    bridge), sys. NCCL runs its LL128 protocol across nodes only over pix or pxb (and from Hopper on c2c with
    NCCL 2.27+)."""


@dataclass
class FabricConfig:
    """The cluster's GPU network (cluster.fabric): a published fabric by name, or its two parts. Left empty,
    the instance type's published fabric where bench/core/fabric.py FABRICS has it, else the GPU's board
    with efa_per_node EFA adapters (0: NCCL's sockets over TCP). On the command line a part the cluster
    leaves empty is set whole: `cluster.fabric.scale_out={transport:infiniband,adapters:8,gbps:400}`."""

    preset: str | None = None
    """A published fabric of bench/core/fabric.py FABRICS (p5.48xlarge, dgx-h100-ndr, a3-megagpu-8g, ...)."""
    scale_up: ScaleUpConfig | None = None
    """The node's GPUs among themselves; null: the preset's, else the GPU's board."""
    scale_out: ScaleOutConfig | None = None
    """The network between nodes; null: the preset's, else efa_per_node's."""
    pcie_gen: Annotated[int, Range(ge=3, le=6)] = 5
    """PCIe generation of the GPUs' and adapters' x16 links (4 A100 nodes, 5 H100 nodes)."""
    cpu: CpuVendor = "intel"
    """The host CPU's vendor (NCCL's LL bandwidth and per-step network overhead depend on it)."""


@dataclass
class ClusterConfig:
    """One file of sweeps/cluster/, chosen with cluster=NAME: the machine type and how many of it there
    are."""

    name: str = MISSING
    """The cluster's name, in every run's spec and label and in messages."""
    instance_type: str = MISSING
    """The machine type, e.g. p5.48xlarge (Kubernetes: the value of the node label the pods select on)."""
    gpus_per_node: Annotated[int, POSITIVE] = MISSING
    """Worker processes per node (locally: per simulated node)."""
    max_nodes: Annotated[int, POSITIVE] = MISSING
    """The reservation's size in nodes: no run, probe or node budget may exceed it."""
    gpu: str | None = None
    """The GPU, a row of `bench/core/hardware.py` (e.g. H100-SXM): MFU's peak and the predictions' device;
    null: on a remote cluster no peak, no MFU and no step-time prediction, on this machine its own GPU
    where a run fits on it, else its CPU."""
    gpu_memory_gib: float | None = None
    """GPU memory per GPU in GiB, what a run's predicted need must fit; null: no run is pruned as
    infeasible."""
    host_memory_gib: float | None = None
    """Host memory per node in GiB, what offload=cpu's state must fit; null: unchecked."""
    efa_per_node: int = 0
    """EFA adapters per node a run uses unless axes.efa_per_node says otherwise (0: NCCL's sockets over TCP);
    an EFA fabric's adapters at most. 0 on other fabrics."""
    fabric: FabricConfig = field(default_factory=FabricConfig)
    price_per_hour: Annotated[float | None, NON_NEGATIVE] = None
    """On-demand price in USD per instance-hour, dated in the file; null: no dollars (the report asks for
    --price)."""
    energy_price: Annotated[float | None, NON_NEGATIVE] = None
    """USD per kWh of the GPUs' measured energy (the report's energy cost to train); null: not priced, the
    kWh still shown."""
    socket_ifname: str | None = None
    """NCCL_SOCKET_IFNAME on every launcher, e.g. `^lo,docker,veth`; null: NCCL's choice."""


@dataclass
class LauncherConfig:
    """One file of sweeps/launcher/, chosen with launcher=NAME: how each run is started, watched and ended,
    the same on every launcher. A launcher's own keys are its section below, launcher.<its name>."""

    name: str = MISSING
    """The launcher, by name (the launcher file sets it): a built-in one (`bench.core.config.LAUNCHERS`), or
    one registered as docs/launchers.md says; an unknown name is refused when the sweep starts."""
    timeout_s: Annotated[float, POSITIVE] = 900
    """Seconds a run may run, counted from when its job really runs (each execution of a requeued job from
    its own start); past it the run is ended: timeout."""
    collective_timeout_s: Annotated[float | None, POSITIVE] = None
    """Seconds a collective may wait before it fails the run (NCCL's watchdog, gloo's timeout) and its
    ranks leave flight-recorder dumps naming who lagged; null: 2/3 of timeout_s, so it fires before the
    harness's."""
    queue_timeout_s: Annotated[float, POSITIVE] = 6 * 3600
    """Seconds a job may wait in the scheduler's queue, each wait of a requeued job apart; past it:
    launch_error."""
    grace_s: Annotated[float, POSITIVE] = 10
    """Seconds between SIGTERM (or delete) and SIGKILL when a run is ended."""
    poll_s: Annotated[float, POSITIVE] = 0.2
    """Seconds between two looks at the runs in flight."""
    max_nodes: Annotated[int | None, POSITIVE] = None
    """Node budget of the runs in flight at once; null: the cluster's max_nodes on Slurm and Kubernetes,
    one run at a time locally."""
    probes_alone: bool = True
    """nccl probes run with nothing else in flight (a shared fabric distorts them)."""
    rendezvous_timeout_s: Annotated[float, POSITIVE] = 1800
    """Seconds torchrun's c10d rendezvous waits for every node to join and answer, so nodes that start
    apart (image pulls) still meet."""


@dataclass
class Axes:
    """The study's axes: the plan is their cartesian product minus `exclude`."""

    model: list[str] = field(default_factory=lambda: ["tiny_llama"])
    """Models: presets of `bench/core/models.py`, files of sweeps/model/ (by name), or paths to a Hugging
    Face config.json or its directory (`bench.core.models.model_source`)."""
    nodes: Annotated[list[int], POSITIVE] = field(default_factory=lambda: [1])
    """Node counts."""
    gpus_per_node: Annotated[list[int | None], POSITIVE] = field(default_factory=lambda: [None])
    """Ranks per node; null: the cluster's gpus_per_node."""
    sharding: list[Sharding] = field(default_factory=lambda: ["FULL_SHARD"])
    """FSDP2 sharding strategies (docs/worker.md, "FSDP2 mapping")."""
    precision: list[Precision] = field(default_factory=lambda: ["bf16_mixed"])
    """Mixed-precision policies; fp8_tensorwise: bf16_mixed with torchao's Float8 linears (FP8 GPUs only)."""
    activation_checkpointing: list[ACMode] = field(default_factory=lambda: ["none"])
    """Activation checkpointing: full (every block), selective (every second block), selective_op (every
    block, by operator)."""
    wrap_policy: list[WrapPolicy] = field(default_factory=lambda: ["transformer_block"])
    """FSDP units: each transformer block, or the whole model as one."""
    compile: list[bool] = field(default_factory=lambda: [False])
    """torch.compile each block (regional, after AC and before sharding); needs warmup_steps >= 1."""
    offload: list[Offload] = field(default_factory=lambda: ["none"])
    """cpu: FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer state in host memory)."""
    micro_batch: list[int | Auto] = field(default_factory=lambda: [1])
    """Sequences per GPU per forward; auto: the largest that fits (and, with a global batch, divides each
    rank's share of it)."""
    global_batch: Annotated[list[int | None], POSITIVE] = field(default_factory=lambda: [None])
    """Sequences per optimizer step over all ranks, the same at every node count (strong scaling): micro
    batch x accumulation steps x ranks equals it; null: one micro batch per rank per step (weak scaling)."""
    accumulation: list[Accumulation] = field(default_factory=lambda: ["sync_each"])
    """How a step of several micro-batches syncs, as FSDP2 sets it: sync_each reduce-scatters every
    micro-batch; sync_once holds gradients unsharded until the last one (set_requires_gradient_sync);
    allreduce_once runs HYBRID_SHARD's all-reduce across nodes once per step (set_requires_all_reduce);
    keep_gathered keeps parameters gathered between micro-batches (set_reshard_after_backward). Anything
    but sync_each needs a global batch."""
    seq_len: Annotated[list[int], POSITIVE] = field(default_factory=lambda: [128])
    """Sequence lengths in tokens."""
    efa_per_node: Annotated[list[int | None], NON_NEGATIVE] = field(default_factory=lambda: [None])
    """EFA adapters per node a run uses (at most the cluster's); null: the cluster's efa_per_node."""


AXES: tuple[str, ...] = tuple(f.name for f in fields(Axes))


@dataclass
class NcclSweepConfig:
    """Collective probes beside the training runs (nccl-tests where present, else the torch probe): one
    run per collective, node count, EFA count and repeat."""

    enabled: bool = False
    """Run the probes."""
    nodes: Annotated[list[int] | None, POSITIVE] = None
    """Node counts probed; null: the training axes' nodes."""
    efa_per_node: Annotated[list[int] | None, NON_NEGATIVE] = None
    """EFA adapters per node probed; null: the cluster's count alone."""
    gpus_per_node: Annotated[list[int] | None, POSITIVE] = None
    """Ranks per node probed; null: the cluster's gpus_per_node."""
    min_bytes: int = 8
    """Smallest message in bytes of the doubling sweep."""
    max_bytes: int = 1 << 26
    """Largest message in bytes of the doubling sweep."""
    iters: int = 20
    """Timed iterations per message size."""
    split_per_node: bool = False
    """NCCL_TESTS_SPLIT="MOD <gpus/node>": measure the bandwidth between nodes only."""
    collectives: list[Collective] = field(default_factory=lambda: list(COLLECTIVES))
    """The collectives each probe point measures: the all-reduce, and the all-gather and reduce-scatter
    FULL_SHARD and SHARD_GRAD_OP run, at the study's own message sizes too."""


@dataclass
class MicroBatchSearch:
    """`micro_batch: auto`: the run starts at the largest size the measured memory fits (at most `max`); on
    OOM, short runs of `steps` at the smaller sizes find the one that fits."""

    max: Annotated[int, POSITIVE] = 64
    """The largest micro batch the search considers."""
    steps: Annotated[int, POSITIVE] = 4
    """Steps of each trial run after an OOM."""
    warmup_steps: Annotated[int, NON_NEGATIVE] = 1
    """Steps of each trial run before its timed window."""


@dataclass
class MemoryConfig:
    """How the planner knows each run's memory before launch (`bench/predict/memory.py`): the worker's own
    step on fake tensors, per distinct configuration, cached; the lower bound of the state where it cannot
    run."""

    measure: bool = True
    """Measure each configuration's peak; false: the lower bound only (instant; prunes only what surely
    cannot fit)."""
    cache_dir: str | None = None
    """Where measurements and censuses are cached; null: $XDG_CACHE_HOME/fsdpbench, else
    ~/.cache/fsdpbench."""
    workers: Annotated[int, POSITIVE] = 2
    """Measuring processes side by side (each holds about 0.5 GiB; no GPU needed)."""
    timeout_s: Annotated[float, POSITIVE] = 900
    """Seconds per configuration; past it that run is planned on the lower bound."""


@dataclass
class StudyConfig:
    """What a team sizing a training run asks of a strong-scaling study: days and dollars to train a token
    budget at its global batch, per node count, and the knee past which more nodes buy little."""

    train_tokens: Annotated[float | None, POSITIVE] = None
    """Tokens the team will train, e.g. 1e12: the answer's days, dollars and kWh are for this budget; null:
    1e12, the plan saying it is unset (the report's --train-tokens overrides either)."""
    knee_share: Annotated[float, Range(gt=0, le=1)] = 0.5
    """The knee: the node count past which going to the next planned one buys less than this share of the
    time linear scaling would save (1: as much, 0: nothing); in (0, 1]."""


@dataclass
class TraceConfig:
    """Each training run's profiler trace (`trainer/trace_record.py`): steps recorded after the timed ones,
    kept in the attempt dir and split into where the step went. Recording only: not in the run id."""

    enabled: bool = True
    """Record a trace of each training run."""
    ranks: TraceRanks = "all"
    """Which ranks record: all, or per_node (each node's local rank 0: large studies)."""
    steps: Annotated[int, Range(ge=1)] = 2
    """Profiled steps per run (each costs a step and its trace's size: docs/trace.md, "What a trace
    costs")."""


@dataclass
class PreflightConfig:
    """Nodes checked before a study spends its reservation (`bench/preflight.py`): one short job per node,
    then all-reduce between pairs of nodes; a node that differs from the others refuses the study."""

    mode: PreflightMode = "auto"
    """auto: on for launchers that reach several machines (slurm, kubernetes), off for local and dryrun;
    on: refuse a study whose nodes disagree; warn: show the table and go on; off: no preflight."""
    tolerance: Annotated[float, Range(gt=0, lt=1)] = 0.25
    """A node this fraction below the median (local workload, pair bandwidth) is named; in a run, a node
    whose compute per step is this fraction above the others' median is named its straggler."""
    seconds: Annotated[float, POSITIVE] = 2.0
    """Seconds of the timed local workload per node."""
    timeout_s: Annotated[float, POSITIVE] = 300
    """Seconds per round of jobs, queueing included: a node silent past it is named."""
    pair_bytes: Annotated[int, POSITIVE] = 1 << 25
    """The largest all-reduce between a pair of nodes, in bytes."""
    nodes: list[str] | None = None
    """The nodes to check; null: every node the launcher can reach."""


@dataclass
class SweepConfig:
    """The whole sweep: sweeps/config.yaml, a sweep of sweeps/sweep/, a cluster, a launcher, overrides."""

    sweep_name: str | None = None
    """Set by the chosen sweep (+sweep=NAME); also the sweep dir's name under results_root."""
    results_root: str = "results"
    """The directory the sweep dir is made in."""
    dry_run: bool = False
    """Plan, render every submission, launch nothing (also: --dry-run)."""
    rerun_failed: bool = False
    """Retry runs that ended other than ok (also: --rerun-failed)."""
    force: bool = False
    """Redo every run, finished ones too (also: --force)."""
    progress: bool = True
    """Show live progress (a bar on a terminal, a line per event otherwise)."""
    axes: Axes = field(default_factory=Axes)
    exclude: list[dict[str, Any]] = field(default_factory=list)
    """Each entry maps axis names to a value or a list of values and removes the runs matching all its
    keys."""
    repeats: Annotated[int, POSITIVE] = 1
    """Runs of each configuration (and probe point)."""
    steps: int = 10
    """Training steps per run, warm-up included."""
    warmup_steps: Annotated[int, NON_NEGATIVE] = 3
    """Steps before the timed window (compile and allocator warm-up)."""
    seed: int = 0
    """Seed of the model's weights and of the generated batches."""
    nccl: NcclSweepConfig = field(default_factory=NcclSweepConfig)
    micro_batch_search: MicroBatchSearch = field(default_factory=MicroBatchSearch)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    cluster: ClusterConfig = MISSING
    launcher: LauncherConfig = MISSING


def literal_choices(hint: Any) -> tuple[Any, ...] | None:
    """The values a Literal type (or an optional one) allows; None for any other type."""
    if get_origin(hint) is Literal:
        return get_args(hint)
    if is_union(hint):
        args = [a for a in get_args(hint) if a is not type(None)]
        return literal_choices(args[0]) if len(args) == 1 else None
    return None


def is_union(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType)
