"""A worker command's way into a warm process (`python -m trainer.warm`, which the local launcher starts
once per sweep): the command's process, started by torchrun as always, hands its module, arguments,
environment, working directory and standard streams to the warm process, which forks a child that has torch,
transformers and the trainer imported already and runs the module there. This process stays what torchrun
watches: it passes on the signals it gets, and exits as the child did (its code, or killed by its signal).

Without the warm process (none named in FSDPBENCH_WARM_SOCKET, or it cannot be reached, runs another
interpreter or checkout, cannot place the child in this process's cgroups, or fails before the child
starts), the caller goes on and runs the module itself, cold. Standard library only: it runs before torch
is imported, and the whole point is not to import it."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "FSDPBENCH_WARM_SOCKET"
STARTED_ENV = "FSDPBENCH_STARTED_WARM"  # set in a warm child: its run's meta record says it started warm
HEADER = struct.Struct("!I")  # the request's length, sent with the three standard streams' descriptors
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def identity() -> dict[str, str]:
    """What must be the same on both sides for the warm process to run this command's code: the interpreter
    and the checkout (a command of another torch or another revision runs cold)."""
    return {"python": os.path.realpath(sys.executable), "project": PROJECT}


def request(module: str, keep_socket: bool = False) -> bytes:
    """What the warm process needs to run `python -m module` as this process would: the socket left out of
    its environment (its module asks for no warm process again), unless `keep_socket` (a torchrun agent's,
    whose workers ask for theirs)."""
    env = {k: v for k, v in os.environ.items() if keep_socket or k != SOCKET_ENV}
    return json.dumps({"module": module, "argv": sys.argv, "env": env, "cwd": os.getcwd(),
                       **identity()}).encode()


def exit_as(status: int) -> None:
    """Leave as the child left: its exit code, or killed by the same signal (torchrun tells them apart)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep their default anyway
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status if status >= 0 else 128 - status)


def run_warm(module: str, keep_socket: bool = False) -> None:
    """Run `python -m module` in the warm process and exit as it did; return (having done nothing) when
    there is none to run it. `keep_socket`: the module's own children may ask it too (see `request`)."""
    path = os.environ.get(SOCKET_ENV) if keep_socket else os.environ.pop(SOCKET_ENV, None)
    if not path:
        return
    os.environ.pop(STARTED_ENV, None)  # inherited from a warm agent: this command has not started warm yet
    child: list[int] = []  # its pid, once the warm process has forked it
    pending: list[int] = []  # signals that came before: passed on once it is known

    def forward(sig: int, _frame: object) -> None:
        if not child:
            pending.append(sig)
            return
        with contextlib.suppress(ProcessLookupError):  # the child has just ended: its status is on its way
            os.kill(child[0], sig)
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        payload = request(module, keep_socket)
        socket.send_fds(conn, [HEADER.pack(len(payload))], [0, 1, 2])
        conn.sendall(payload)
        lines = conn.makefile("r")
        started = lines.readline()  # the child's pid once forked: blocks while the warm process imports
        if not started:
            raise ConnectionError("the warm process closed before starting the child")
        child.append(int(json.loads(started)["pid"]))
    except (OSError, ValueError, KeyError):  # no warm process to be had (or not of this code): run cold
        conn.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in pending:  # as this process would have taken them
            os.kill(os.getpid(), sig)
        return
    for sig in pending:
        forward(sig, None)
    ended = lines.readline()  # interrupted by a forwarded signal, readline resumes (PEP 475)
    if not ended:  # the warm process died: its children die with it (PR_SET_PDEATHSIG)
        print(f"fsdpbench: the warm process ended before worker {child[0]} did", file=sys.stderr)
        exit_as(1)
    exit_as(int(json.loads(ended)["status"]))
