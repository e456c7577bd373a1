"""The sweep configuration, typed once: the dataclasses below are the schema Hydra composes sweeps/ into
(registered in its ConfigStore as `sweep_schema`, the first entry of sweeps/config.yaml's defaults), and
`bench.core.load_config.from_dict` merges a composed config into them again with OmegaConf, so OmegaConf
itself refuses a wrong type or an unknown key, a `+key=` override included.

Every field's type, default and meaning is written here, once: the docstring under each field says what it
means and in what unit, a section's docstring is its class's, and `bench/core/config_doc.py` reads them
from this file's source for `python -m bench.sweep --help` and docs/study.md's reference. The YAML files
set only what differs. A field of fixed choices is typed with the `Literal` of its list's owner
(`bench/core/schema.py`: `SHARDINGS` is `get_args(Sharding)`); OmegaConf 2.3 reads no Literal, so it is
handed the same dataclasses with each Literal as its values' type (`load_config.omegaconf_schema`).

Every value is then checked against its Literal, with the rules a type cannot say (ranges, cross-field
rules, what a scheduler would refuse), by `bench/core/validation.py`. Every problem is a ConfigError of one
line; the sweep prints it, exit 2.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Union, get_args, get_origin

from omegaconf import MISSING

from bench.core.fabric import CpuVendor, ScaleUpKind, Transport
from bench.core.schema import (
    COLLECTIVES,
    Accumulation,
    ACMode,
    Collective,
    Fault,
    FaultCollective,
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
Admission = Literal["harness", "slurm"]
ADMISSIONS: tuple[Admission, ...] = get_args(Admission)  # cluster.slurm.admission
PreflightMode = Literal["auto", "on", "warn", "off"]
PREFLIGHT_MODES: tuple[PreflightMode, ...] = get_args(PreflightMode)  # preflight.mode


class ConfigError(ValueError):
    """A configuration problem, reported as one line before anything is launched (exit EXIT_CONFIG)."""


EXIT_CONFIG = 2  # every command's exit status for a ConfigError


@dataclass
class SlurmClusterConfig:
    """How the Slurm launcher submits each run: sbatch's options and the pyxis/enroot container."""

    partition: str | None = None
    """sbatch --partition; null: the cluster's default partition."""
    account: str | None = None
    """sbatch --account; null: the user's default account."""
    time_limit: str = "02:00:00"
    """sbatch --time of each run (Slurm's time format, e.g. HH:MM:SS); with admission=slurm only of a run
    that has no prediction, the others getting twice their predicted duration."""
    admission: Admission = "harness"
    """Who packs the study's runs onto nodes: `harness` (the runner submits what fits launcher.max_nodes,
    the largest first) or `slurm` (every run submitted at once, each with --time from its prediction, and
    Slurm's backfill packs them within the partition); `benchmarks/schedule_slurm.py` measures both."""
    exclusive: bool = True
    """sbatch --exclusive: no other job shares a benchmarked node."""
    gpus_per_node: int | None = None
    """sbatch --gpus-per-node; null: the cluster's GPUs per node where it names a GPU; 0: no GRES request
    (a cluster without GPU GRES)."""
    container_image: str | None = None
    """The pyxis/enroot image each run's srun starts in (e.g. a .sqsh file); null: run on the host."""
    container_mounts: str | None = None
    """pyxis mounts, SRC:DST[,...]: they must cover results_root, or nothing comes back."""
    container_workdir: str = "/workspace/fsdpbench"
    """The project's directory inside the image (the Dockerfile's WORKDIR)."""
    extra_sbatch: list[str] = field(default_factory=list)
    """Further `#SBATCH` options, one `--option[=value]` each, e.g. `--qos=high`."""
    conf: str | None = None
    """SLURM_CONF for the client commands (sbatch, squeue, sacct, ...); null: the environment's."""
    nccl_tests_binary: str = "all_reduce_perf"
    """nccl-tests' all-reduce binary, a name on the nodes' PATH or a path (GPU clusters; CPU clusters use
    the torch probe); all_gather_perf and reduce_scatter_perf are taken from beside it."""
    mpi: str = "pmix"
    """srun --mpi for the nccl-tests probes (one MPI rank per GPU)."""


@dataclass
class K8sClusterConfig:
    """How the Kubernetes launcher creates each run: a Kubeflow PyTorchJob per training run, an MPIJob per
    nccl-tests probe."""

    namespace: str = "default"
    """The namespace the jobs are created in (an RFC 1123 label)."""
    image: str | None = None
    """Your worker image, built from this repository's Dockerfile (registry/repo:tag); needed to launch."""
    instance_type_label: str = "node.kubernetes.io/instance-type"
    """The node label the pods select on, with the value cluster.instance_type."""
    shm_size: str = "64Gi"
    """Size of each worker's /dev/shm (a Kubernetes quantity; NCCL and data loaders need more than the
    default)."""
    hf_token_secret: str | None = None
    """Name of a Secret with key `token` (a Hugging Face token), referenced by the pods, never inlined;
    null: none."""
    image_pull_secret: str | None = None
    """Name of the Secret the pods pull the image with; null: none."""
    service_account: str | None = None
    """The ServiceAccount the pods run as; null: the namespace's default."""
    exclude_nodes: list[str] = field(default_factory=list)
    """Nodes the study's pods keep off, by node name as `kubectl get nodes` and the preflight name them (a
    required node affinity on each pod: metadata.name NotIn); the preflight leaves them out too."""


@dataclass
class ScaleUpConfig:
    """How a node's GPUs reach one another (cluster.fabric.scale_up)."""

    kind: ScaleUpKind = "nvswitch"
    """nvswitch (every GPU to every other at its full NVLink rate, HGX/DGX boards), nvlink (GPUs linked in
    pairs or a mesh), or pcie (no NVLink)."""
    gbs: float = 450.0
    """One-direction GB/s each GPU has into the domain: NVLink 4 (H100, H200) 18 links x 25 = 450, NVLink 3
    (A100) 300, NVLink 5 (B200) 900; a PCIe x16 link 24 (Gen4) or 48 (Gen5)."""
    gpus: int | None = None
    """GPUs one NVLink domain joins; null: the node's (GB200 NVL72: 72, trays of 4 GPUs)."""
    nvls: bool = False
    """NVLink SHARP in the switches (NVSwitch with H100, H200, B200), which NCCL's NVLS algorithms use."""


@dataclass
class ScaleOutConfig:
    """A node's GPU-facing network (cluster.fabric.scale_out)."""

    transport: Transport = "efa"
    """efa (AWS), infiniband, roce, tcp (NCCL's sockets over plain Ethernet), tcpx or tcpxo (GCP A3's
    GPUDirect-TCPX/-TCPXO)."""
    adapters: int = 1
    """GPU-facing adapters (or Ethernet ports NCCL uses) per node."""
    gbps: float = 100.0
    """Line rate per adapter, Gb/s."""
    rdma: bool = True
    """GPUDirect RDMA: the adapter reads and writes GPU memory (false for tcp)."""
    latency_us: float = 0.0
    """The latency NCCL's net plugin reports per network hop, us (aws-ofi-nccl: 75 on p4d/p5, 35 on p5en;
    NCCL's IB and socket transports: 0)."""


@dataclass
class FabricConfig:
    """The cluster's GPU network (cluster.fabric): a published fabric by name, or its two parts. Left empty,
    the instance type's published fabric where bench/core/fabric.py FABRICS has it, else the GPU's board
    with efa_per_node EFA adapters (0: NCCL's sockets over TCP)."""

    preset: str | None = None
    """A published fabric of bench/core/fabric.py FABRICS (p5.48xlarge, dgx-h100-ndr, a3-megagpu-8g, ...)."""
    scale_up: ScaleUpConfig | None = None
    """The node's GPUs among themselves; null: the preset's, else the GPU's board."""
    scale_out: ScaleOutConfig | None = None
    """The network between nodes; null: the preset's, else efa_per_node's."""
    pcie_gen: int = 5
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
    gpus_per_node: int = MISSING
    """Worker processes per node (locally: per simulated node)."""
    max_nodes: int = MISSING
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
    price_per_hour: float | None = None
    """On-demand price in USD per instance-hour, dated in the file; null: no dollars (the report asks for
    --price)."""
    energy_price: float | None = None
    """USD per kWh of the GPUs' measured energy (the report's energy cost to train); null: not priced, the
    kWh still shown."""
    socket_ifname: str | None = None
    """NCCL_SOCKET_IFNAME on every launcher, e.g. `^lo,docker,veth`; null: NCCL's choice."""
    slurm: SlurmClusterConfig = field(default_factory=SlurmClusterConfig)
    kubernetes: K8sClusterConfig = field(default_factory=K8sClusterConfig)


@dataclass
class LauncherConfig:
    """One file of sweeps/launcher/, chosen with launcher=NAME: how each run is started, watched and ended."""

    name: str = MISSING
    """The launcher, by name (the launcher file sets it): a built-in one (`bench.core.config.LAUNCHERS`), or
    one registered as docs/launchers.md says; an unknown name is refused when the sweep starts."""
    timeout_s: float = 900
    """Seconds a run may run, counted from when its job really runs (each execution of a requeued job from
    its own start); past it the run is ended: timeout."""
    collective_timeout_s: float | None = None
    """Seconds a collective may wait before it fails the run (NCCL's watchdog, gloo's timeout) and its
    ranks leave flight-recorder dumps naming who lagged; null: 2/3 of timeout_s, so it fires before the
    harness's."""
    queue_timeout_s: float = 6 * 3600
    """Seconds a job may wait in the scheduler's queue, each wait of a requeued job apart; past it:
    launch_error."""
    grace_s: float = 10
    """Seconds between SIGTERM (or delete) and SIGKILL when a run is ended."""
    poll_s: float = 0.2
    """Seconds between two looks at the runs in flight."""
    max_nodes: int | None = None
    """Node budget of the runs in flight at once; null: the cluster's max_nodes on Slurm and Kubernetes,
    one run at a time locally."""
    probes_alone: bool = True
    """nccl probes run with nothing else in flight (a shared fabric distorts them)."""
    warm_workers: bool = True
    """Local launcher, and Slurm where the nodes are this machine (the local test cluster): a run on CPU
    starts its workers from one warm process per sweep, which has torch, transformers and the trainer
    imported already (`python -m trainer.warm`), instead of each worker importing them (seconds of every
    run's wall time); torchrun still starts and watches each worker's process, and each child joins its
    worker's cgroups (a Slurm job's limits hold it). false: every worker starts cold. Runs on a GPU, and
    on a real cluster's nodes, always start cold."""
    rendezvous_timeout_s: float = 1800
    """Seconds torchrun's c10d rendezvous waits for every node to join and answer, so nodes that start
    apart (image pulls) still meet."""
    python: str | None = None
    """The interpreter on the nodes; null: this one (pyxis: the image's `python`)."""
    workdir: str | None = None
    """The project checkout on the nodes; null: this checkout."""
    kubeconfig: str | None = None
    """The kubeconfig file; null: $KUBECONFIG, else ~/.kube/config, else the in-cluster config."""
    context: str | None = None
    """The kubeconfig context; null: its current context."""


@dataclass
class Axes:
    """The study's axes: the plan is their cartesian product minus `exclude`."""

    model: list[str] = field(default_factory=lambda: ["tiny_llama"])
    """Models: presets of `bench/core/models.py`, files of sweeps/model/ (by name), or paths to a Hugging
    Face config.json or its directory (`bench.core.models.model_source`)."""
    nodes: list[int] = field(default_factory=lambda: [1])
    """Node counts."""
    gpus_per_node: list[int | None] = field(default_factory=lambda: [None])
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
    global_batch: list[int | None] = field(default_factory=lambda: [None])
    """Sequences per optimizer step over all ranks, the same at every node count (strong scaling): micro
    batch x accumulation steps x ranks equals it; null: one micro batch per rank per step (weak scaling)."""
    accumulation: list[Accumulation] = field(default_factory=lambda: ["sync_each"])
    """How a step of several micro-batches syncs, as FSDP2 sets it: sync_each reduce-scatters every
    micro-batch; sync_once holds gradients unsharded until the last one (set_requires_gradient_sync);
    allreduce_once runs HYBRID_SHARD's all-reduce across nodes once per step (set_requires_all_reduce);
    keep_gathered keeps parameters gathered between micro-batches (set_reshard_after_backward). Anything
    but sync_each needs a global batch."""
    seq_len: list[int] = field(default_factory=lambda: [128])
    """Sequence lengths in tokens."""
    efa_per_node: list[int | None] = field(default_factory=lambda: [None])
    """EFA adapters per node a run uses (at most the cluster's); null: the cluster's efa_per_node."""


AXES: tuple[str, ...] = tuple(f.name for f in fields(Axes))


@dataclass
class NcclSweepConfig:
    """Collective probes beside the training runs (nccl-tests where present, else the torch probe): one
    run per collective, node count, EFA count and repeat."""

    enabled: bool = False
    """Run the probes."""
    nodes: list[int] | None = None
    """Node counts probed; null: the training axes' nodes."""
    efa_per_node: list[int] | None = None
    """EFA adapters per node probed; null: the cluster's count alone."""
    gpus_per_node: list[int] | None = None
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

    max: int = 64
    """The largest micro batch the search considers."""
    steps: int = 4
    """Steps of each trial run after an OOM."""
    warmup_steps: int = 1
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
    workers: int = 2
    """Measuring processes side by side (each holds about 0.5 GiB; no GPU needed)."""
    timeout_s: float = 900
    """Seconds per configuration; past it that run is planned on the lower bound."""


@dataclass
class StudyConfig:
    """What a team sizing a training run asks of a strong-scaling study: days and dollars to train a token
    budget at its global batch, per node count, and the knee past which more nodes buy little."""

    train_tokens: float | None = None
    """Tokens the team will train, e.g. 1e12: the answer's days, dollars and kWh are for this budget; null:
    1e12, the plan saying it is unset (the report's --train-tokens overrides either)."""
    knee_share: float = 0.5
    """The knee: the node count past which going to the next planned one buys less than this share of the
    time linear scaling would save (1: as much, 0: nothing); in (0, 1]."""


@dataclass
class TraceConfig:
    """Each training run's profiler trace (`trainer/trace.py`): steps recorded after the timed ones, kept in
    the attempt dir and split into where the step went. Recording only: not in the run id."""

    enabled: bool = True
    """Record a trace of each training run."""
    ranks: TraceRanks = "all"
    """Which ranks record: all, or per_node (each node's local rank 0: large studies)."""
    steps: int = 2
    """Profiled steps per run (each costs a step and its trace's size: docs/trace.md, "What a trace
    costs")."""


@dataclass
class PreflightConfig:
    """Nodes checked before a study spends its reservation (`bench/preflight.py`): one short job per node,
    then all-reduce between pairs of nodes; a node that differs from the others refuses the study."""

    mode: PreflightMode = "auto"
    """auto: on for launchers that reach several machines (slurm, kubernetes), off for local and dryrun;
    on: refuse a study whose nodes disagree; warn: show the table and go on; off: no preflight."""
    tolerance: float = 0.25
    """A node this fraction below the median (local workload, pair bandwidth) is named; in a run, a node
    whose compute per step is this fraction above the others' median is named its straggler."""
    seconds: float = 2.0
    """Seconds of the timed local workload per node."""
    timeout_s: float = 300
    """Seconds per round of jobs, queueing included: a node silent past it is named."""
    pair_bytes: int = 1 << 25
    """The largest all-reduce between a pair of nodes, in bytes."""
    nodes: list[str] | None = None
    """The nodes to check; null: every node the launcher can reach."""


@dataclass
class FaultRule:
    """Test hook: each entry of `faults` injects a worker fault into the runs whose spec matches every key of
    `match`."""

    match: dict[str, Any] = field(default_factory=dict)
    """Run spec field -> a value or a list of values; the rule applies to the runs matching every key."""
    fault: Fault = MISSING
    """The fault to inject."""
    step: int = 1
    """The step at which the fault fires."""
    seconds: float = 0.0
    """sleep: seconds slept instead of working; slow_collective, slow_compute: the delay per call."""
    rank: int | None = None
    """Only this global rank (a lagging rank); null: every rank."""
    collective: FaultCollective = "all_gather"
    """slow_collective: the collective delayed."""


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
    repeats: int = 1
    """Runs of each configuration (and probe point)."""
    steps: int = 10
    """Training steps per run, warm-up included."""
    warmup_steps: int = 3
    """Steps before the timed window (compile and allocator warm-up)."""
    seed: int = 0
    """Seed of the model's weights and of the generated batches."""
    nccl: NcclSweepConfig = field(default_factory=NcclSweepConfig)
    micro_batch_search: MicroBatchSearch = field(default_factory=MicroBatchSearch)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    faults: list[FaultRule] = field(default_factory=list)
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
