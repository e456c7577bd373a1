"""The launcher protocol: render is pure (dry-run stops there); submit/wait/logs/cancel touch the world."""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.config import SweepConfig
from bench.schema import RunSpec

PROJECT_ROOT = Path(__file__).resolve().parents[2]


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
    """What the launcher saw; bench.classify turns it and the worker's records into a status."""

    returncodes: list[int | None]
    timed_out: bool = False
    cancelled: bool = False
    launch_error: str | None = None
    scheduler_state: str | None = None  # Slurm job state, Kubernetes condition/reason
    detail: str | None = None  # scheduler's reason text (OOMKilled, NodeFail ...)
    wall_s: float | None = None


class Launcher(Protocol):
    name: str

    def render(self, spec: RunSpec, run_dir: Path) -> Submission: ...

    def submit(self, submission: Submission, run_dir: Path) -> Any: ...

    def wait(self, handle: Any, timeout_s: float, stop: threading.Event) -> Outcome:
        """Block until the run ends, `timeout_s` passes (kill it) or `stop` is set (cancel it)."""

    def logs(self, handle: Any, run_dir: Path) -> None: ...

    def cancel(self, handle: Any) -> None: ...


def worker_module_argv(spec: RunSpec, run_dir: Path | None, extra: list[str]) -> list[str]:
    """`-m trainer ...` or `-m nccl.probe ...`: the module half of a worker command line."""
    module = "trainer" if spec.kind == "train" else "nccl.probe"
    argv = ["-m", module, *spec.to_argv()]
    if run_dir is not None:
        argv += ["--run-dir", str(run_dir)]
    return argv + extra


def torchrun_argv(python: str, spec: RunSpec, endpoint: str, rdzv_id: str) -> list[str]:
    """One torchrun agent (one per node) with c10d rendezvous at `endpoint`."""
    return [python, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}",
            f"--nproc-per-node={spec.gpus_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", "--max-restarts=0",
            "--monitor-interval=0.5"]


def fault_args(cfg: SweepConfig, spec: RunSpec) -> list[str]:
    """Worker arguments of the first fault rule matching this run (test hook), else none."""
    for rule in cfg.faults:
        if all(getattr(spec, k, None) in (v if isinstance(v, (list, tuple)) else [v])
               for k, v in rule.match.items()):
            return ["--fault", rule.fault, "--fault-step", str(rule.step)]
    return []


def python_executable(cfg: SweepConfig) -> str:
    return cfg.launcher.python or sys.executable
