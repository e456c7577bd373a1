"""The launcher protocol: render is pure (dry-run stops there); submit/poll/logs/cleanup touch the world.

The runner drives every launcher the same way: render -> write the submission -> submit -> locate (the
ledger records where the job is) -> poll until done -> logs -> cleanup (always). A launcher never cancels
or deletes on its own account inside poll; the runner decides on timeouts and stops, and cleanup acts.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from bench.core import faults, rundir, torchrun
from bench.core.config import SweepConfig
from bench.core.records import COLLECTIVE_TIMEOUT_ENV
from bench.core.schema import RunSpec
from bench.core.system import IMAGE_ENV
from bench.probes.command import nccl_env, split_env

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The worker image (Dockerfile), as Kubernetes pods and pyxis containers run it.
IMAGE_WORKDIR = "/workspace/fsdpbench"  # its WORKDIR: the project
IMAGE_PYTHON = "python"  # its interpreter


@dataclass(frozen=True)
class Submission:
    """Everything needed to start one run, as data: argument lists, environment, files to write."""

    run_id: str
    argvs: tuple[tuple[str, ...], ...]  # one argument list per process the launcher starts
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # file name -> content (sbatch script, manifest)
    workdir: str = str(PROJECT_ROOT)

    def describe(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "argvs": [list(a) for a in self.argvs], "env": self.env,
                "files": sorted(self.files), "workdir": self.workdir}


@dataclass
class Outcome:
    """What the launcher saw; bench.run.classify turns it and the worker's records into a status."""

    returncodes: list[int | None]
    timed_out: bool = False
    cancelled: bool = False
    launch_error: str | None = None  # never started: render/submit failed, or given up in the queue
    queue_timed_out: bool = False  # the runner gave up on it in the queue (launch_error says how long)
    error: str | None = None  # the launcher itself failed while the job ran (API error, command timeout)
    scheduler_state: str | None = None  # Slurm job state, Kubernetes condition/reason
    detail: str | None = None  # scheduler's reason text (OOMKilled, NodeFail ...)
    wall_s: float | None = None  # from when the job really started running
    queue_s: float | None = None  # time spent pending in the scheduler's queue
    # Each time the scheduler ran the job, oldest first, where it can tell (a Slurm job requeued after
    # NODE_FAIL runs again under its id): state, nodes, start, end (ISO), and the nodes that failed
    executions: list[dict[str, Any]] = field(default_factory=list)
    execution: int | None = None  # the runner's count of executions it saw (a requeued job runs again)
    # The scheduler's own last word on the job where it keeps one (Kubernetes: the job's terminal
    # condition, {"type", "reason", "message"}), and who ended the job (ENDED_BY_*)
    condition: dict[str, str] | None = None
    ended_by: str | None = None
    never_ran: bool = False  # it ended before any of its processes started: all its time was in the queue
    left_behind: str | None = None  # what cleanup could not remove in its wait, and the command that does


PENDING, RUNNING, DONE = "pending", "running", "done"
# Who ended a job, where the scheduler says (Outcome.ended_by): its controller judged it (a Kubeflow
# operator's Succeeded or Failed), its own time limit, or a deletion by someone outside the sweep
ENDED_BY_OPERATOR, ENDED_BY_DEADLINE, ENDED_BY_DELETION = "operator", "deadline", "deleted outside the sweep"


def condition_text(condition: dict[str, str]) -> str:
    """A scheduler's condition in its own words: 'PyTorchJobFailed: PyTorchJob x is failed because ...'."""
    words = (condition.get("reason") or condition.get("type"), condition.get("message"))
    return ": ".join(p for p in words if p)


# A run's cost beyond its steps, as a plan counts it (its time, cost and schedule): on a cluster, a job's
# scheduling, image start, rendezvous and materialisation, and a probe's size sweep after it; on this
# machine, a torchrun's start-up (the smoke sweep's runs: benchmarks/run_cost.py prints where it goes).
CLUSTER_STARTUP_S = 120.0
CLUSTER_PROBE_S = 60.0
MACHINE_STARTUP_S = 8.0


@dataclass(frozen=True)
class Placement:
    """Where and how a study's runs run, as its launcher answers for its cluster: resolved once when the
    sweep starts (`Launcher.placement`) and handed to every layer that asks, so none of them tells
    launchers apart by name."""

    startup_s: float
    """What a run costs beyond its steps (seconds): launch, rendezvous, model materialisation."""
    probe_s: float = 0.0
    """What a collective probe's size sweep adds to its start-up (seconds)."""
    launches: bool = True
    """Whether the launcher submits anything (a dry-run launcher plans and renders only)."""
    run_launcher: str = ""
    """The launcher each run records in its spec (and so in its run id)."""
    this_machine: bool = False
    """The runs run on this machine's devices (its GPUs where a run fits them, else its CPU cores): what
    predictions are made for where the cluster file names no GPU."""
    one_host: bool = False
    """Every node of a run is this one host, so one loopback network joins them all."""
    node_budget: int | None = None
    """Nodes the runs in flight may hold together; None: one run at a time."""
    admits_all: bool = False
    """Every run is submitted at once and the scheduler packs them (else the harness admits what fits)."""
    preflight: bool = False
    """preflight.mode=auto checks every node first (a launcher that reaches several machines)."""


@dataclass(frozen=True)
class Remains:
    """What a cleanup has not removed yet: `what` names it and the command that removes it by hand (once
    `final`: the launcher has stopped waiting for it to go)."""

    what: str
    final: bool = False


@dataclass
class Poll:
    """One look at a job: pending (with the scheduler's reason), running, or done with its outcome."""

    state: str
    reason: str | None = None
    outcome: Outcome | None = None


class Launcher(Protocol):
    """What the runner and the sweep call on a launcher; the concrete launchers subclass it for its
    defaults."""

    name: str
    settings: ClassVar[type | None] = None
    """The dataclass of this launcher's own keys, the configuration's section launcher.<name> (a field and
    the docstring under it per key, ranges annotated on the fields, as bench/core/config.py writes them);
    None: it has none."""

    @classmethod
    def placement(cls, cfg: SweepConfig) -> Placement:
        """Where and how this launcher runs the study's runs on its cluster (bench.launchers.launcher_for
        finds the class by launcher.name; the sweep asks this once)."""
        ...

    def render(self, spec: RunSpec, run_dir: Path, seconds: float | None = None) -> Submission:
        """The run's job, ready to submit; `seconds`, its predicted duration where known, is for a scheduler
        that packs jobs by their time limits (Slurm with launcher.slurm.admission=slurm)."""
        ...

    def submit(self, submission: Submission, run_dir: Path) -> Any: ...

    def locate(self, handle: Any) -> dict[str, Any]:
        """What the run ledger records to find this job again after a crash (JSON-able)."""

    def attach(self, where: dict[str, Any], run_dir: Path) -> Any | None:
        """A handle on the job the ledger names if the scheduler still knows it (alive or ended but not
        yet collected); None when it is gone."""

    def poll(self, handle: Any) -> Poll: ...

    def logs(self, handle: Any, run_dir: Path) -> None: ...

    def cleanup(self, handle: Any) -> None:
        """Stop whatever of the job still runs and free what it holds; safe to call more than once."""

    def remains(self, handle: Any) -> Remains | None:
        """What cleanup() has not removed yet, None once it is gone: a deletion the scheduler finishes in its
        own time (Kubernetes) is waited for between the runner's looks at the other runs, until the launcher
        calls what is left final. The default: a cleanup that waits itself, nothing left."""
        return None

    # What a launcher may have to add; the defaults are for a launcher with nothing to do there.

    def preflight(self) -> None:
        """Fail with one ConfigError before anything is launched if the scheduler cannot be reached."""

    def admit(self, submission: Submission) -> None:
        """Let the scheduler judge a rendered submission without running it (ConfigError if refused)."""

    def plan_note(self, specs: list[RunSpec]) -> str | None:
        """One line for the plan's output about where the runs will execute, or None."""
        return None

    def node_names(self) -> tuple[list[str], dict[str, str]]:
        """The nodes the preflight checks, and those the scheduler holds down (by state): this machine."""
        return [socket.gethostname()], {}

    def leave_out(self, nodes: list[str]) -> str:
        """The setting that keeps the study's runs off these nodes, as the preflight's refusal advises it."""
        return f"take {', '.join(nodes)} out of the cluster"

    def executions(self, handle: Any) -> list[dict[str, Any]]:
        """Every time the scheduler ran the job (a requeued job runs again), as it recorded them."""
        return []

    def close(self) -> None:
        """Free what the launcher holds for the whole study, once its last run has ended."""


def nodes_are_this_machine(cfg: SweepConfig) -> bool:
    """Whether the cluster's nodes are this machine (instance type "local": the local Slurm test cluster)."""
    return cfg.cluster.instance_type == "local"


def cluster_placement(cfg: SweepConfig, name: str, admits_all: bool = False) -> Placement:
    """A scheduler's placement: runs side by side up to the node budget (launcher.max_nodes, else the
    cluster's), every node checked first. Where its nodes are this machine (instance type "local": the local
    Slurm test cluster) a run starts as a local one does and is predicted on this machine's devices."""
    here = nodes_are_this_machine(cfg)
    budget = cfg.launcher.max_nodes if cfg.launcher.max_nodes is not None else cfg.cluster.max_nodes
    return Placement(startup_s=MACHINE_STARTUP_S if here else CLUSTER_STARTUP_S,
                     probe_s=0.0 if here else CLUSTER_PROBE_S, run_launcher=name, this_machine=here,
                     node_budget=budget, admits_all=admits_all, preflight=True)


def worker_module_argv(spec: RunSpec, run_dir: Path | None, extra: list[str]) -> list[str]:
    """`-m trainer ...` or `-m nccl.probe ...`: the module half of a worker command line."""
    module = {"train": "trainer", "nccl": "nccl.probe", "preflight": "trainer.preflight"}[spec.kind]
    argv = ["-m", module, *spec.to_argv()]
    if run_dir is not None:
        argv += ["--run-dir", str(run_dir)]
    return argv + extra


def rendezvous_conf(cfg: SweepConfig) -> dict[str, str]:
    """c10d rendezvous timeouts: torch waits 60 s (read_timeout) for the store on the first node and 600 s
    (join_timeout) for every node; nodes that start minutes apart (image pulls, container imports) would
    fail the run. One setting for every launcher."""
    seconds = str(int(cfg.launcher.rendezvous_timeout_s))
    return {"join_timeout": seconds, "read_timeout": seconds}


TORCHRUN_MODULE = torchrun.TORCHRUN  # torchrun's agent: every launcher's, the PyTorchJob's included
# torchrun, run in the warm process where the agent's environment names one (bench/core/torchrun.py): the
# agent of a CPU run on this machine (local, or the local Slurm test cluster)
WARM_AGENT_MODULE = torchrun.__name__


def torchrun_argv(python: str, spec: RunSpec, endpoint: str, rdzv_id: str, rdzv_conf: dict[str, str],
                  log_dir: str, monitor_s: float = 0.5, module: str = TORCHRUN_MODULE) -> list[str]:
    """One torchrun agent (one per node) with c10d rendezvous at `endpoint`; it looks at its workers every
    `monitor_s` seconds, so a run's exit is seen that much later at most; its error files go under
    `log_dir` (without it, torchrun leaves a torchelastic_* dir in /tmp on every node of every run).
    `module`: torchrun's, or bench.core.torchrun's (the same agent, in a local sweep's warm process)."""
    return [python, "-m", module, f"--nnodes={spec.nodes}",
            f"--nproc-per-node={spec.gpus_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", "--max-restarts=0",
            f"--monitor-interval={monitor_s:g}", f"--log-dir={log_dir}",
            "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in rdzv_conf.items())]


TRACE_PREFIX = "nccl_trace_rank_"  # torch appends the rank: the flight recorder's dump of each rank


def collective_timeout_s(cfg: SweepConfig) -> float:
    """How long a collective may wait before it fails the run: set, else 2/3 of the run's timeout."""
    return cfg.launcher.collective_timeout_s or cfg.launcher.timeout_s * 2 / 3


def job_env(cfg: SweepConfig, spec: RunSpec, run_dir: str | None, image: str | None = None) -> dict[str, str]:
    """The environment of every worker, the same on every launcher.

    Training runs keep torch's NCCL flight recorder (as AWS's reference PyTorchJob does): on a watchdog
    timeout each rank dumps its last collectives to `<run_dir>/nccl_trace_rank_<N>` (run_dir as the worker
    sees it; None where the worker has no shared run dir, then torch's default under /tmp), which says
    which rank lagged. GPU clusters get the NCCL/EFA environment of the run's adapter count. A worker in a
    container learns its `image` (FSDPBENCH_IMAGE, for its system record: bench/core/system.py).
    """
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if image:
        env[IMAGE_ENV] = image
    if spec.kind == "train":
        env.update({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
                    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                    COLLECTIVE_TIMEOUT_ENV: f"{collective_timeout_s(cfg):g}"})
        if run_dir:
            env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = f"{run_dir.rstrip('/')}/{TRACE_PREFIX}"
    if cfg.cluster.gpu is not None:
        env.update(nccl_env(spec.efa_per_node, cfg.cluster.socket_ifname))
        if spec.kind == "nccl" and cfg.nccl.split_per_node:
            env.update(split_env(spec.gpus_per_node))
    return env


def fault_args(spec: RunSpec) -> list[str]:
    """Worker arguments of the first fault rule matching this run (the test hook's: bench/core/faults.py),
    else none."""
    for rule in faults.rules():
        if all(getattr(spec, k, None) in (v if isinstance(v, (list, tuple)) else [v])
               for k, v in rule.match.items()):
            argv = ["--fault", rule.fault, "--fault-step", str(rule.step)]
            argv += ["--fault-rank", str(rule.rank)] if rule.rank is not None else []
            if rule.fault == "slow_collective":
                argv += ["--fault-collective", rule.collective]
            timed = ("sleep", "slow_collective", "slow_compute")
            return argv + (["--fault-seconds", str(rule.seconds)] if rule.fault in timed else [])
    return []


def preflight_args(cfg: SweepConfig, spec: RunSpec) -> list[str]:
    """A preflight node job's timed workload: its length, and where the cluster's nodes are this machine
    (instance type "local"), the directory where their ranks meet before timing it: nodes that share its
    cores are timed under the same load, not one while the others still start."""
    if spec.kind != "preflight":
        return []
    argv = ["--seconds", f"{cfg.preflight.seconds:g}"]
    if nodes_are_this_machine(cfg):
        sweep_dir = Path(os.path.abspath(cfg.results_root)) / cfg.sweep_name
        argv += ["--ready-dir", str(rundir.preflight_ready_dir(sweep_dir))]
    return argv


def worker_args(cfg: SweepConfig, spec: RunSpec) -> list[str]:
    """What the configuration adds to a worker's command line: a fault (test hook), a trace, the
    preflight's workload."""
    return fault_args(spec) + trace_args(cfg, spec) + preflight_args(cfg, spec)


def trace_args(cfg: SweepConfig, spec: RunSpec) -> list[str]:
    """A training run's profiler trace (cfg.trace), on the worker's command line and not in its spec: it
    changes what is recorded, not what is measured, so the run id stays."""
    if spec.kind != "train" or not cfg.trace.enabled:
        return []
    return ["--trace-steps", str(cfg.trace.steps), "--trace-ranks", cfg.trace.ranks]
