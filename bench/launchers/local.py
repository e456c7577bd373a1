"""Local launcher: one torchrun agent per simulated node, c10d rendezvous on 127.0.0.1.

Each agent runs in its own process group, so cleanup kills its whole tree; its stdout and stderr stream to
logs/node<k>.log in the attempt dir. Agents also die with the sweep, whatever kills it (`kill -9`
included): the kernel sends them SIGTERM when the sweep's main thread exits (PR_SET_PDEATHSIG), and
torchrun passes that on to its workers. So a local job never outlives its sweep, and a resumed sweep has
nothing to re-attach to: a survivor it still finds through the ledger is killed.

Warm workers (launcher.local.warm_workers, on by default): an agent that runs on CPU names the sweep's warm
process (`python -m trainer.warm`, started at the first such run, stopped by `close`) in
FSDPBENCH_WARM_SOCKET; the agent (`python -m bench.core.torchrun`) and each worker it starts hand
themselves to it (bench/core/warm.py) and run in children that have their imports done.

GPUs: each agent gets its own devices (CUDA_VISIBLE_DEVICES per agent), so two simulated nodes never put
two ranks on one GPU. A run that needs more GPUs than the machine has runs on CPU (gloo) when the local
cluster names no GPU (`cluster.gpu: null`, the smoke sweep's), and is refused before launch when it does
(measurements on that GPU were asked for).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from bench.core import rundir
from bench.core.config import ConfigError, SweepConfig
from bench.core.gpus import agent_devices, local_gpus
from bench.core.records import process_start_time
from bench.core.schema import RunSpec
from bench.launchers.base import (
    DONE,
    MACHINE_STARTUP_S,
    RUNNING,
    WARM_AGENT_MODULE,
    Launcher,
    Outcome,
    Placement,
    Poll,
    Submission,
    job_env,
    rendezvous_conf,
    torchrun_argv,
    worker_args,
    worker_module_argv,
)
from bench.launchers.processes import WarmWorkers, cold_env, die_with_parent

PORT_TOKEN = "@RDZV_PORT@"  # replaced by a free port when the run is submitted (render stays pure)
MONITOR_S = 0.1  # torchrun's look at its workers: a local run lasts seconds, its exit is seen within this


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again for torchrun to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalSettings:
    """The local launcher's own keys (launcher=local and launcher=dryrun): how it starts its torchrun
    agents on this machine."""

    python: str | None = None
    """The interpreter that runs torchrun and the workers; null: this one."""
    warm_workers: bool = True
    """A run on CPU starts its torchrun agents and their workers from one warm process per sweep, which has
    torch, transformers and the trainer imported already (`python -m trainer.warm`), instead of each
    importing them (seconds of every run's wall time); torchrun still starts and watches each worker's
    process. false: every agent and worker starts cold. Runs on a GPU always start cold."""


@dataclass
class LocalHandle:
    procs: list[subprocess.Popen]
    logs: list[IO[bytes]]
    started: float = field(default_factory=time.monotonic)
    first_failure: float | None = None


class LocalLauncher(Launcher):
    name = "local"
    settings = LocalSettings

    def __init__(self, cfg: SweepConfig, gpus: list[str] | None = None) -> None:
        self.cfg = cfg
        own: LocalSettings = cfg.launcher.local  # launcher.local: this launcher's keys (dryrun's too)
        self.python = own.python or sys.executable
        self.gpus = local_gpus() if gpus is None else gpus
        self.warm = WarmWorkers(own.warm_workers, self.python)

    @classmethod
    def placement(cls, cfg: SweepConfig) -> Placement:
        """Every simulated node on this machine, one run at a time unless launcher.max_nodes says how many
        nodes' worth may run side by side; no preflight (one machine)."""
        return Placement(startup_s=MACHINE_STARTUP_S, run_launcher="local", this_machine=True, one_host=True,
                         node_budget=cfg.launcher.max_nodes)

    def devices(self, spec: RunSpec) -> list[str]:
        """CUDA_VISIBLE_DEVICES of each agent: its own GPUs, or "" (CPU) when the run does not fit them."""
        placed = agent_devices(spec.world_size, spec.nodes, self.gpus)
        if placed is not None:
            return placed
        if self.gpus and self.cfg.cluster.gpu is not None:
            raise ConfigError(f"run {spec.label} needs {spec.world_size} GPUs, this machine has "
                              f"{len(self.gpus)} ({','.join(self.gpus)}); lower axes.nodes or "
                              "cluster.gpus_per_node, or set cluster.gpu=null to run what does not fit "
                              "on CPU")
        return [""] * spec.nodes

    def plan_note(self, specs: list[RunSpec]) -> str:
        """Where the runs will execute, for the plan output."""
        if not self.gpus:
            return "devices: no GPU here (CUDA_VISIBLE_DEVICES / nvidia-smi -L): every run on CPU (gloo)"
        on_gpu = sum(agent_devices(s.world_size, s.nodes, self.gpus) is not None for s in specs)
        return (f"devices: {len(self.gpus)} GPU(s) here ({','.join(self.gpus)}): "
                f"{on_gpu} run(s) on GPU (NCCL), "
                f"{len(specs) - on_gpu} on CPU (gloo; they need more ranks than GPUs)")

    def render(self, spec: RunSpec, run_dir: Path, seconds: float | None = None) -> Submission:
        run_dir = Path(os.path.abspath(run_dir))  # the workers start in the project root, not the sweep's cwd
        worker = worker_module_argv(spec, run_dir, worker_args(self.cfg, spec))
        agent = torchrun_argv(self.python, spec, f"127.0.0.1:{PORT_TOKEN}", spec.run_id,
                              rendezvous_conf(self.cfg), str(run_dir / rundir.TORCHELASTIC_DIR), MONITOR_S,
                              module=WARM_AGENT_MODULE)
        # `env` sets each agent's devices without a shell, and a simulated node's name where there are
        # several (one host name for all of them otherwise); torchrun's workers inherit them
        argvs = tuple(tuple(["env", f"CUDA_VISIBLE_DEVICES={devices}",
                             *([f"FSDPBENCH_NODE_NAME=local{i}"] if spec.nodes > 1 else []), *agent, *worker])
                      for i, devices in enumerate(self.devices(spec)))
        return Submission(run_id=spec.run_id, argvs=argvs,
                          env=job_env(self.cfg, spec, str(run_dir)))

    def submit(self, submission: Submission, run_dir: Path) -> LocalHandle:
        port = str(free_port())
        env = {**os.environ, **submission.env}
        handle = LocalHandle([], [])
        preexec = die_with_parent()
        for k, argv in enumerate(submission.argvs):
            path = rundir.log_path(run_dir, f"node{k}")
            path.parent.mkdir(parents=True, exist_ok=True)
            log = open(path, "ab")
            handle.logs.append(log)
            cmd = [a.replace(PORT_TOKEN, port) for a in argv]
            on_cpu = "CUDA_VISIBLE_DEVICES=" in argv  # a GPU agent's workers start cold
            handle.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                 env=self.warm.env(env, submission.workdir) if on_cpu
                                                 else cold_env(env),
                                                 cwd=submission.workdir, start_new_session=True,
                                                 preexec_fn=preexec))
        return handle

    def close(self) -> None:
        """Stop the warm process, if one was started."""
        self.warm.close()

    def locate(self, handle: LocalHandle) -> dict[str, Any]:
        return {"host": socket.gethostname(),
                "pgids": [p.pid for p in handle.procs],
                "start_times": [process_start_time(p.pid) for p in handle.procs]}

    def attach(self, where: dict[str, Any], run_dir: Path) -> None:
        """Kill any agent group of an earlier sweep that is somehow still alive; never re-attach."""
        if where.get("host") != socket.gethostname():
            return None
        for pgid, started in zip(where.get("pgids", []), where.get("start_times", [])):
            if started is not None and process_start_time(pgid) == started:
                _signal_group(pgid, signal.SIGKILL)
        return None

    def poll(self, handle: LocalHandle) -> Poll:
        """Done when every agent has exited, or one failed and the rest did not follow within grace_s."""
        codes = [p.poll() for p in handle.procs]
        now = time.monotonic()
        if handle.first_failure is None and any(c not in (None, 0) for c in codes):
            handle.first_failure = now
        if all(c is not None for c in codes) or (
                handle.first_failure is not None and now - handle.first_failure > self.cfg.launcher.grace_s):
            return Poll(DONE, outcome=Outcome(returncodes=codes))
        return Poll(RUNNING)

    def logs(self, handle: LocalHandle, run_dir: Path) -> None:
        """Nothing to fetch: the agents wrote straight into the run dir."""

    def cleanup(self, handle: LocalHandle) -> None:
        """SIGTERM every agent's process group, SIGKILL what is still there after grace_s, close logs."""
        alive = [p for p in handle.procs if p.poll() is None]
        for p in alive:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.launcher.grace_s
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in handle.procs:
            _signal_group(p.pid, signal.SIGKILL)  # also reaps workers an agent left behind
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for log in handle.logs:
            log.close()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class DryRunLauncher(LocalLauncher):
    """launcher=dryrun: the local launcher's plan and submissions, nothing launched (the runs it plans are
    the local launcher's, with their run ids)."""

    name = "dryrun"

    @classmethod
    def placement(cls, cfg: SweepConfig) -> Placement:
        return replace(super().placement(cfg), launches=False)
