"""`python -m trainer.warm --socket PATH`: the warm process a local sweep's CPU runs start in. It imports
torch, FSDP2, transformers and the trainer once, then, for each worker command that connects
(bench/core/warm.py), forks a child that takes that command's standard streams, environment, working
directory and arguments and runs its module. A one-rank smoke run otherwise spends most of its wall time
importing these in torchrun's worker (benchmarks/run_cost.py prints both).

Fork is safe here because this process never computes: it has one thread and no CUDA context (the local
launcher hands it CPU runs only). A child dies with this process (PR_SET_PDEATHSIG), and is killed when the
command that asked for it goes away (its connection closes), so nothing outlives a run or a sweep."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import sys
import traceback

from bench.core.records import set_death_signal
from bench.core.warm import FORWARDED, HEADER, SOCKET_ENV, STARTED_ENV, identity

PRELOAD = ("torch", "torch.distributed.fsdp", "trainer.main", "trainer.model", "trainer.trainer",
           "trainer.parallel", "trainer.trace", "trainer.trace_split")
POLL_S = 0.05  # how soon an ended child is reported, and a gone command's child killed


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """A command's request and its three standard streams."""
    conn.settimeout(10)
    head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
    if len(head) != HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("incomplete request")
    (size,) = HEADER.unpack(head)
    payload = b""
    while len(payload) < size:
        chunk = conn.recv(size - len(payload))
        if not chunk:
            raise ConnectionError("request cut short")
        payload += chunk
    conn.settimeout(None)
    return json.loads(payload), fds


def _run_child(req: dict, fds: list[int]) -> None:
    """In the forked child: become the command (streams, environment, directory, arguments) and run its
    module; never returns."""
    code = 1
    try:
        set_death_signal(signal.SIGKILL)
        for sig in FORWARDED:  # the signals its command passes on, as a fresh interpreter handles them
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ[STARTED_ENV] = "1"
        os.chdir(req["cwd"])
        threads = req["env"].get("OMP_NUM_THREADS", "")
        if threads.isdigit():
            import torch
            torch.set_num_threads(int(threads))
        sys.argv = list(req["argv"])
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class Warm:
    """The accept loop: a child per request, its pid then its end status sent back on its connection."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.children: dict[int, socket.socket] = {}  # pid -> the connection of the command it runs

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            req, fds = _read_request(conn)
        except (OSError, ValueError) as e:
            print(f"warm: bad request: {e}", file=sys.stderr, flush=True)
            conn.close()
            return
        if {k: req.get(k) for k in identity()} != identity():  # another interpreter's or checkout's command
            for fd in fds:
                os.close(fd)
            conn.close()  # it runs cold
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            conn.close()
            for other in self.children.values():
                other.close()
            _run_child(req, fds)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def gone(self, conn: socket.socket) -> None:
        """The command that asked for a child has gone (killed): its child goes too."""
        for pid, c in self.children.items():
            if c is conn:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def reap(self) -> None:
        """Each ended child's status (its exit code, or minus its signal) to its command."""
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": code}).encode() + b"\n")
            conn.close()

    def serve(self, parent: int) -> None:
        while os.getppid() == parent:
            ready, _, _ = select.select([self.listener, *self.children.values()], [], [], POLL_S)
            for s in ready:
                if s is self.listener:
                    self.accept()
                elif not s.recv(1, socket.MSG_PEEK):  # EOF: the command was killed
                    self.gone(s)
            self.reap()

    def stop(self) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.warm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the Unix socket path to listen on")
    parser.add_argument("--preload", nargs="*", default=list(PRELOAD), help="modules imported before serving")
    parser.add_argument("--own-dir", action="store_true",
                        help="the socket's directory is this process's: removed when it ends")
    args = parser.parse_args(argv)
    parent = os.getppid()
    set_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.pop(SOCKET_ENV, None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)  # commands that connect now wait in the backlog until the imports are done
    listener.listen(256)
    for module in args.preload:
        importlib.import_module(module)
    warm = Warm(listener)
    try:
        warm.serve(parent)
    finally:
        warm.stop()
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(args.socket)
        if args.own_dir:  # its launcher may be gone (killed) and never remove it
            shutil.rmtree(os.path.dirname(os.path.abspath(args.socket)), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
