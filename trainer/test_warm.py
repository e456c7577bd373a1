"""The warm process (trainer/warm.py) and a command's way into it (bench/core/warm.py), with a stand-in
module so each test takes a second: a command runs in a forked child as itself, ends as the child ended,
passes its signals on, takes its child with it when killed, runs cold where there is no warm process, and
the warm process dies with whoever started it."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.core.warm import SOCKET_ENV, STARTED_ENV
from conftest import alive

ROOT = Path(__file__).resolve().parents[1]
MODULE = '''
import json, os, signal, sys, time
from bench.core.warm import run_warm
if __name__ == "__main__":
    run_warm("stand_in")
    what = sys.argv[1]
    if what == "term":
        def leave(*_):
            print("got SIGTERM", flush=True)
            os._exit(7)
        signal.signal(signal.SIGTERM, leave)
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                      "value": os.environ.get("STAND_IN_VALUE"), "warm": os.environ.get("STARTED"),
                      "socket": os.environ.get("SOCKET"),
                      "cgroups": open("/proc/self/cgroup").read().splitlines()}), flush=True)
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
'''.replace("STARTED", STARTED_ENV).replace("SOCKET", SOCKET_ENV)


def _wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def warm(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, dict[str, str]]]:
    """A warm process preloading nothing of torch, and the environment a command reaches it with."""
    (tmp_path / "stand_in.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    sock = tmp_path / "warm.sock"
    argv = [sys.executable, "-m", "trainer.warm", "--socket", str(sock), "--preload", "json"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env)
    while not sock.exists():  # it listens before it imports (as the local launcher waits for it)
        assert proc.poll() is None
        time.sleep(0.01)
    yield proc, {**env, SOCKET_ENV: str(sock), "STAND_IN_VALUE": "from the command"}
    proc.terminate()
    proc.wait(timeout=10)


def _command(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stand_in", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_command_runs_in_a_warm_child_as_itself_and_exits_with_its_code(warm, tmp_path: Path) -> None:
    server, env = warm
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    command = _command(env, workdir, "exit", "3")
    out, err = command.communicate(timeout=30)
    assert command.returncode == 3, err
    seen = json.loads(out)  # the child wrote into the command's own stdout
    assert seen["ppid"] == server.pid and seen["pid"] != command.pid
    assert seen["cwd"] == str(workdir) and seen["argv"] == ["exit", "3"]
    assert seen["value"] == "from the command" and seen["warm"] == "1" and seen["socket"] is None


def test_a_child_killed_by_a_signal_ends_its_command_by_the_same_signal(warm, tmp_path: Path) -> None:
    command = _command(warm[1], tmp_path, "kill")
    command.communicate(timeout=30)
    assert command.returncode == -signal.SIGKILL


def test_a_signal_to_the_command_reaches_its_child(warm, tmp_path: Path) -> None:
    command = _command(warm[1], tmp_path, "term")
    assert command.stdout is not None
    child = json.loads(command.stdout.readline())["pid"]
    command.send_signal(signal.SIGTERM)
    try:
        out, _ = command.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # say where it stuck: which of the three lives, what each catches
        states = _states(command.pid, child, warm[0].pid)
        for pid in (command.pid, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the command did not end: {states}") from None
    assert command.returncode == 7 and "got SIGTERM" in out
    assert _wait_gone(child)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (/proc/PID/task/*/children)."""
    found: list[int] = []
    for tasks in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in tasks.read_text().split()]
    return found


def test_a_torchrun_agent_runs_in_a_warm_child_and_its_workers_in_theirs(warm, tmp_path: Path) -> None:
    """`python -m bench.core.torchrun` (the local launcher's CPU agents): the agent is a child of the warm
    process, the worker it starts asks for a child of its own there, a SIGTERM to the command (the
    launcher's cleanup) ends all of them, and the command ends as the agent did."""
    server, env = warm
    command = subprocess.Popen([sys.executable, "-m", "bench.core.torchrun", "--standalone",
                                "--nproc-per-node=1", "--max-restarts=0", f"--log-dir={tmp_path / 'logs'}",
                                "--monitor-interval=0.1", "-m", "stand_in", "sleep"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert command.stdout is not None
    worker = json.loads(command.stdout.readline())
    agents = [pid for pid in _children(server.pid) if pid != worker["pid"]]
    assert worker["ppid"] == server.pid and worker["warm"] == "1" and worker["socket"] is None
    assert len(agents) == 1 and not _children(command.pid)  # torchrun runs in the warm child, not here
    workers = _children(agents[0])  # the worker's own command, started by torchrun, waiting on its child
    assert len(workers) == 1 and "stand_in" in Path(f"/proc/{workers[0]}/cmdline").read_text()
    command.send_signal(signal.SIGTERM)
    command.communicate(timeout=60)
    assert command.returncode != 0
    assert all(_wait_gone(pid, 10) for pid in (agents[0], workers[0], worker["pid"]))
    assert server.poll() is None  # the warm process serves on


def _states(*pids: int) -> dict[int, str]:
    """Each process's state and the signals it catches and has pending (/proc/PID/status), or "gone"."""
    states = {}
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except FileNotFoundError:
            states[pid] = "gone"
            continue
        shown = ("Name", "State", "SigPnd", "ShdPnd", "SigCgt")
        states[pid] = " ".join(ln for ln in lines if ln.startswith(shown))
    return states


def test_a_killed_command_takes_its_child_with_it(warm, tmp_path: Path) -> None:
    command = _command(warm[1], tmp_path, "sleep")
    assert command.stdout is not None
    child = json.loads(command.stdout.readline())["pid"]
    assert alive(child)
    command.kill()
    command.wait(timeout=10)
    assert _wait_gone(child, 5), "the child outlived its command"
    assert warm[0].poll() is None  # the warm process serves on


def test_without_a_warm_process_a_command_runs_cold(tmp_path: Path) -> None:
    (tmp_path / "stand_in.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
           SOCKET_ENV: str(tmp_path / "nobody.sock")}
    command = _command(env, tmp_path, "exit", "0")
    out, err = command.communicate(timeout=30)
    seen = json.loads(out)
    assert command.returncode == 0, err
    assert seen["pid"] == command.pid and seen["warm"] is None and seen["socket"] is None


def test_the_warm_process_and_its_children_die_with_whoever_started_it(tmp_path: Path) -> None:
    (tmp_path / "stand_in.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    home = tmp_path / "home"  # the warm process's own directory (--own-dir): gone with it
    home.mkdir()
    sock = home / "warm.sock"
    starter = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-m', "
         f"'trainer.warm', '--socket', {str(sock)!r}, '--preload', 'json', '--own-dir']); "
         "print(p.pid, flush=True); time.sleep(60)"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    server = int(starter.stdout.readline())
    while not sock.exists():
        time.sleep(0.01)
    command = _command({**env, SOCKET_ENV: str(sock)}, tmp_path, "sleep")
    assert command.stdout is not None
    child = json.loads(command.stdout.readline())["pid"]
    starter.kill()
    starter.wait(timeout=10)
    assert _wait_gone(server, 10) and _wait_gone(child, 10)
    assert not home.exists()  # nobody was left to remove it but the warm process itself
    command.wait(timeout=10)
    assert command.returncode != 0


@contextlib.contextmanager
def _cgroup() -> Iterator[tuple[Path, Path]]:
    """A cpu cgroup of its own (v2, else v1's cpu hierarchy) and its parent; skips where none can be made.
    Its processes go back to the parent after."""
    root = Path("/sys/fs/cgroup")
    base = root if (root / "cgroup.subtree_control").exists() else root / "cpu"
    group = base / f"fsdpbench-warm-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError:
        pytest.skip("no writable cgroup hierarchy to start a command in")
    try:
        yield base, group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (base / "cgroup.procs").write_text(pid)
        group.rmdir()


def test_a_warm_process_stopped_while_it_imports_leaves_no_directory(tmp_path: Path) -> None:
    """SIGTERM (its launcher gone) while it still imports: it ends, its socket's directory removed."""
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(30)\n")
    home = tmp_path / "own"
    home.mkdir()
    argv = [sys.executable, "-m", "trainer.warm", "--socket", str(home / "socket"), "--own-dir", "--preload",
            "slow_import"]
    proc = subprocess.Popen(argv, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])})
    while not (home / "socket").exists():
        assert proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0 and not home.exists()


def test_a_commands_child_runs_in_the_commands_cgroups(warm, tmp_path: Path) -> None:
    """A command started in a cgroup (a Slurm job's, a node capped from outside) has its child moved there
    before it runs, so the limits that hold the command hold the child."""
    with _cgroup() as (base, group):
        join = (group / "cgroup.procs").as_posix()
        command = subprocess.Popen([sys.executable, "-m", "stand_in", "exit", "0"], cwd=tmp_path, env=warm[1],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=lambda: Path(join).write_text(str(os.getpid())))
        out, err = command.communicate(timeout=30)
    assert command.returncode == 0, err
    child = json.loads(out)
    assert child["pid"] != command.pid and child["warm"] == "1"
    inside = "/" + group.relative_to(base).as_posix()
    assert any(line.endswith(":" + inside) for line in child["cgroups"]), child["cgroups"]


def test_a_child_that_cannot_join_its_commands_cgroups_is_refused(monkeypatch) -> None:
    """A cgroup hierarchy of the command that is not mounted where the warm process runs: no child (the
    command then runs cold)."""
    import trainer.warm as warm_module
    monkeypatch.setattr(warm_module, "cgroups",
                        lambda pid: {"cpu": "/"} if pid == 1 else {"cpu": "/", "no_such_controller": "/a"})
    with pytest.raises(OSError, match="no_such_controller"):
        warm_module.join_cgroups(1, 2)


def test_a_command_of_another_checkout_or_interpreter_is_refused(warm, tmp_path: Path) -> None:
    """The warm process's imports are its own checkout's and interpreter's: another one's command gets no
    child (its connection closes unanswered) and so runs cold."""
    import socket

    from bench.core.warm import HEADER, identity
    for other in ({"project": str(tmp_path)}, {"python": "/usr/bin/python3-other"}):
        payload = json.dumps({"module": "stand_in", "argv": ["stand_in", "exit", "0"], "env": {},
                              "cwd": str(tmp_path), **identity(), **other}).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(warm[1][SOCKET_ENV])
            socket.send_fds(conn, [HEADER.pack(len(payload))], [0, 1, 2])
            conn.sendall(payload)
            conn.settimeout(10)
            assert conn.recv(100) == b"", other


def test_the_local_launcher_starts_cold_where_it_cannot_start_a_warm_process(tmp_path: Path,
                                                                             monkeypatch) -> None:
    """No temporary directory (or no process) for the warm process: the run's workers start cold, the run
    is not refused; where it can, the launcher starts one, and `close` stops it and removes its directory."""
    import tempfile

    from bench.core.load_config import from_dict
    from bench.launchers import launcher_sections
    from bench.launchers.local import LocalLauncher
    from bench.study.compose import compose
    cfg = from_dict(compose(["+sweep=smoke", f"results_root={tmp_path}"])[0], launcher_sections())
    launcher = LocalLauncher(cfg, gpus=[])

    def no_space(*_a, **_k):
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkdtemp", no_space)
        assert launcher.warm.socket(dict(os.environ), str(ROOT)) is None
    path = launcher.warm.socket(dict(os.environ), str(ROOT))
    assert path is not None and Path(path).exists() and launcher.warm.process is not None
    proc = launcher.warm.process.proc
    launcher.close()
    assert proc.poll() is not None and not Path(path).parent.exists() and launcher.warm.process is None
