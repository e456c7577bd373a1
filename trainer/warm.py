"""`python -m trainer.warm --socket PATH`: the warm process the CPU runs of a local sweep (or of the local
Slurm test cluster) start in. It imports torch once, and what each command imports (FSDP2, transformers
and the trainer for a training run) when the first such command comes; for each worker command that
connects (bench/core/warm.py) it forks a child that takes that command's standard streams, environment,
working directory and arguments and runs its module. A one-rank smoke run otherwise spends most of its
wall time importing these in torchrun's worker (benchmarks/run_cost.py prints both).

Fork is safe here because this process never computes: it has one thread and no CUDA context (the
launchers hand it CPU runs only). A child dies with this process (PR_SET_PDEATHSIG), and is killed when the
command that asked for it goes away (its connection closes), so nothing outlives a run or a sweep. A child
joins the cgroups of the command that asked for it before it runs (a Slurm job's, a node capped from
outside), so whatever limits the command holds the child; where it cannot, the command runs cold."""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import struct
import sys
import traceback
from pathlib import Path

from bench.core.records import set_death_signal
from bench.core.warm import FORWARDED, HEADER, SOCKET_ENV, STARTED_ENV, identity

PRELOAD = ("torch", "torch.distributed")  # what every command imports: before the first request
# What the trainer's commands import, some of it only once they run (training runs, the tests' series,
# the memory measurement): FSDP2, transformers and the trainer, imported before their first child forks
TRAINING = ("torch.distributed.fsdp", "trainer.main", "trainer.model", "trainer.trainer", "trainer.parallel",
            "trainer.trace", "trainer.trace_record", "trainer.trace_split")
# The trainer's one command that imports torch and none of the rest (a node's preflight): its children,
# like any command's outside the trainer (a collective probe), wait for no more than its own imports
TORCH_ONLY = ("trainer.preflight",)
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


@functools.cache  # once per command: a module forgotten after its import is not imported again
def prepare(module: str) -> None:
    """Import, once, in this process, what `module`'s command imports, so its children find it imported:
    the module itself (a plain module then forgotten: its code runs again in the child as __main__, which
    runpy warns about where it is imported already) and, for the trainer's commands bar TORCH_ONLY,
    TRAINING. A module that fails to import fails in its child, in its own log."""
    trainer = module.split(".")[0] == "trainer" and module not in TORCH_ONLY
    for name in (module, *(TRAINING if trainer else ())):
        if name in sys.modules:
            continue
        try:
            imported = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the child imports it again and reports why
            continue
        if name == module and not hasattr(imported, "__path__"):
            sys.modules.pop(name, None)


def cgroups(pid: int | str) -> dict[str, str]:
    """A process's cgroup in each hierarchy, keyed by the hierarchy's controllers ("" for cgroup v2)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return {controllers: path for _, controllers, path in (line.split(":", 2) for line in lines)}


def _mount_of(controllers: str) -> tuple[str, str]:
    """Where a hierarchy is mounted, and the cgroup its mount shows at its root (/proc/self/mountinfo)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        fstype, _, options = tail.split()[:3]
        root, mount = fields.split()[3:5]
        v1 = fstype == "cgroup" and controllers and set(controllers.split(",")) <= set(options.split(","))
        if v1 or (fstype == "cgroup2" and not controllers):
            return mount, root
    raise OSError(f"no mount of the cgroup hierarchy {controllers or 'v2'}")


def join_cgroups(child: int, of: int) -> None:
    """Move `child` into every cgroup of process `of` that it is not in already; OSError where it cannot
    (no permission, a hierarchy not mounted here)."""
    own = cgroups(child)
    for controllers, path in cgroups(of).items():
        if own.get(controllers) == path:
            continue
        mount, root = _mount_of(controllers)
        inside = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
        if inside.startswith(".."):
            raise OSError(f"cgroup {path} is outside this mount of {controllers or 'v2'}")
        Path(mount, inside, "cgroup.procs").write_text(str(child))


def _peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                    struct.calcsize("3i")))
    return pid


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
        prepare(req["module"])
        sys.stdout.flush()
        sys.stderr.flush()
        go_read, go_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            conn.close()
            for other in self.children.values():
                other.close()
            os.close(go_write)
            if os.read(go_read, 1) != b"1":  # not placed in its command's cgroups: never runs
                os._exit(1)
            os.close(go_read)
            _run_child(req, fds)
        os.close(go_read)
        for fd in fds:
            os.close(fd)
        try:
            join_cgroups(pid, _peer_pid(conn))
        except OSError as e:
            print(f"warm: a command runs cold: its child cannot join its cgroups ({e})", file=sys.stderr,
                  flush=True)
            os.close(go_write)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            conn.close()  # unanswered: the command runs cold
            return
        self.children[pid] = conn
        with contextlib.suppress(OSError):  # the command knows its child before the child runs
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        os.write(go_write, b"1")
        os.close(go_write)

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
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    warm, bound = Warm(listener), False
    try:  # whenever it ends (a SIGTERM during its imports too), it leaves nothing behind
        set_death_signal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        os.environ.pop(SOCKET_ENV, None)
        listener.bind(args.socket)  # commands that connect now wait in the backlog until the imports are done
        bound = True
        listener.listen(256)
        for module in args.preload:
            importlib.import_module(module)
        warm.serve(parent)
    finally:
        warm.stop()
        listener.close()
        if bound:
            with contextlib.suppress(OSError):
                os.unlink(args.socket)
        if args.own_dir:  # its launcher may be gone (killed) and never remove it
            shutil.rmtree(os.path.dirname(os.path.abspath(args.socket)), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
