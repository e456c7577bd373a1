"""Local launcher: one torchrun agent per simulated node, c10d rendezvous on 127.0.0.1.

Each agent runs in its own process session, so a timeout or Ctrl-C kills its whole tree and nothing
is left behind; its stdout and stderr stream to logs/node<k>.log in the run dir.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench import rundir
from bench.config import SweepConfig
from bench.launchers.base import (Outcome, Submission, fault_args, python_executable, torchrun_argv,
                                  worker_module_argv)
from bench.schema import RunSpec

PORT_TOKEN = "@RDZV_PORT@"  # replaced by a free port when the run is submitted (render stays pure)
WORKER_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again for torchrun to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalHandle:
    procs: list[subprocess.Popen]
    logs: list[IO[bytes]]
    started: float = field(default_factory=time.monotonic)


class LocalLauncher:
    name = "local"

    def __init__(self, cfg: SweepConfig) -> None:
        self.cfg = cfg

    def render(self, spec: RunSpec, run_dir: Path) -> Submission:
        py = python_executable(self.cfg)
        worker = worker_module_argv(spec, run_dir, fault_args(self.cfg, spec))
        agent = torchrun_argv(py, spec, f"127.0.0.1:{PORT_TOKEN}", spec.run_id)
        argvs = tuple(tuple(agent + worker) for _ in range(spec.nodes))
        return Submission(run_id=spec.run_id, argvs=argvs, env=dict(WORKER_ENV))

    def submit(self, submission: Submission, run_dir: Path) -> LocalHandle:
        port = str(free_port())
        env = {**os.environ, **submission.env}
        handle = LocalHandle([], [])
        for k, argv in enumerate(submission.argvs):
            path = rundir.log_path(run_dir, f"node{k}")
            path.parent.mkdir(parents=True, exist_ok=True)
            log = open(path, "ab")
            handle.logs.append(log)
            cmd = [a.replace(PORT_TOKEN, port) for a in argv]
            handle.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                 cwd=submission.workdir, start_new_session=True))
        return handle

    def wait(self, handle: LocalHandle, timeout_s: float, stop: threading.Event) -> Outcome:
        """Until every agent exits, one fails and the rest do not follow within grace_s, timeout or stop."""
        deadline = handle.started + timeout_s
        first_failure: float | None = None
        while True:
            codes = [p.poll() for p in handle.procs]
            now = time.monotonic()
            if all(c is not None for c in codes):
                return self._done(handle, codes)
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = now
            if first_failure is not None and now - first_failure > self.cfg.launcher.grace_s:
                self.cancel(handle)
                return self._done(handle, [p.poll() for p in handle.procs])
            if stop.is_set():
                self.cancel(handle)
                outcome = self._done(handle, [p.poll() for p in handle.procs])
                outcome.cancelled = True
                return outcome
            if now > deadline:
                self.cancel(handle)
                outcome = self._done(handle, [p.poll() for p in handle.procs])
                outcome.timed_out = True
                return outcome
            stop.wait(self.cfg.launcher.poll_s)

    def _done(self, handle: LocalHandle, codes: list[int | None]) -> Outcome:
        for log in handle.logs:
            log.close()
        return Outcome(returncodes=codes, wall_s=time.monotonic() - handle.started)

    def logs(self, handle: LocalHandle, run_dir: Path) -> None:
        """Nothing to fetch: the agents wrote straight into the run dir."""

    def cancel(self, handle: LocalHandle) -> None:
        """SIGTERM every agent's process group, SIGKILL what is still there after grace_s."""
        alive = [p for p in handle.procs if p.poll() is None]
        for p in alive:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.launcher.grace_s
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in handle.procs:
            _signal_group(p, signal.SIGKILL)  # also reaps workers an agent left behind
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
