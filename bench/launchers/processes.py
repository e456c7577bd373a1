"""The processes bench starts on this machine beside its runs: a worker command (`command_env`), each child
tied to the sweep's life (`die_with_parent`), and a sweep's warm process for its CPU workers (trainer/warm.py:
`WarmWorkers`), which the local and Slurm launchers share."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.core.records import can_set_death_signal, set_death_signal
from bench.core.warm import SOCKET_ENV
from bench.launchers.base import PROJECT_ROOT


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when this process dies (Linux); None elsewhere."""
    if not can_set_death_signal():
        return None
    parent = os.getpid()

    def preexec() -> None:
        set_death_signal(signal.SIGTERM)
        if os.getppid() != parent:  # the sweep died between fork and prctl
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


def command_env() -> dict[str, str]:
    """The environment of a worker command bench runs here (trainer.memory, trainer.census): this
    checkout's packages first on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                                      os.environ.get("PYTHONPATH")]))}


WARM_BIND_S = 10  # how long the warm process may take to listen (a worker that finds no socket runs cold)


@dataclass
class WarmProcess:
    """`python -m trainer.warm` on a socket in a directory of its own (removed with it)."""

    proc: subprocess.Popen
    socket: Path

    @classmethod
    def start(cls, python: str, env: dict[str, str], workdir: str | None) -> WarmProcess:
        home = Path(tempfile.mkdtemp(prefix="fsdpbench-warm-"))
        path = home / "socket"
        with open(home / "warm.log", "ab") as log:
            argv = [python, "-m", "trainer.warm", "--socket", str(path), "--own-dir"]
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=workdir, start_new_session=True,
                                    preexec_fn=die_with_parent())
        deadline = time.monotonic() + WARM_BIND_S  # it listens before its imports: a worker's connection
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:  # then waits
            time.sleep(0.01)
        return cls(proc, path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM (it kills any child still running), SIGKILL after 5 s; its directory removed."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.socket.parent, ignore_errors=True)


def cold_env(env: dict[str, str]) -> dict[str, str]:
    """`env` without a warm process's socket inherited from elsewhere: its workers start cold."""
    return {k: v for k, v in env.items() if k != SOCKET_ENV}


class WarmWorkers:
    """A sweep's warm process for its CPU workers (trainer/warm.py), run by `python`, started at the first
    run that asks for it and stopped by the launcher's close. No socket where the launcher's warm_workers is
    off (`enabled`) or none can be started: the workers then start cold."""

    def __init__(self, enabled: bool, python: str) -> None:
        self.enabled, self.python = enabled, python
        self.process: WarmProcess | None = None

    def socket(self, env: dict[str, str], workdir: str | None) -> str | None:
        """The warm process's socket (started now if not yet), or None."""
        if not self.enabled:
            return None
        if self.process is None or not self.process.alive():
            self.close()
            try:
                self.process = WarmProcess.start(self.python, env, workdir)
            except OSError:  # no temporary directory or process to be had: the workers start cold
                return None
        return str(self.process.socket)

    def env(self, env: dict[str, str], workdir: str | None) -> dict[str, str]:
        """`env` naming the warm process, and no other one inherited from elsewhere."""
        path = self.socket(env, workdir)
        return {**cold_env(env), SOCKET_ENV: path} if path else cold_env(env)

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
