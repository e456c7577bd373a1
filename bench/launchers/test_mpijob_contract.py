"""The MPI operator's contract, reproduced with real parts: Debian's sshd as two MPIJob workers on localhost,
the hostfile and ssh settings the operator gives the launcher (through OMPI_MCA_* variables, as the
operator does), and the exact mpirun command line our MPIJob renders, with only the rank counts scaled to
this machine and the probe's nccl-tests binary (all_reduce_perf, all_gather_perf, reduce_scatter_perf)
replaced by a stand-in that prints a real nccl-tests table and the environment it was started with.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bench.launchers.base import Outcome
from bench.launchers.k8s_manifests import NCCL_TESTS, manifest
from bench.launchers.local import free_port
from bench.launchers.test_kubernetes import cfg_for
from bench.probes.command import perf_binary
from bench.probes.records import records_from_output
from bench.run.classify import classify
from bench.study.plan import expand

TESTDATA = Path(__file__).resolve().parents[1] / "probes" / "testdata"
# system services started for the test (sshd as workers, mpirun), as the Slurm cluster's: .ci/run's slow step
pytestmark = pytest.mark.slow


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def workers(tmp_path: Path):
    """Two sshd "worker pods" on their own ports, reachable as worker-0 and worker-1 with one key."""
    if not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()) or not shutil.which("mpirun") \
            or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must install openssh-server and openmpi-bin (.ci/run) and run as root")
        pytest.skip("needs Debian's openssh-server and openmpi-bin, as root")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    for name in ("key", "hostkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)],
                       check=True)
    shutil.copy(tmp_path / "key.pub", tmp_path / "authorized_keys")
    ports, pids = [free_port(), free_port()], []
    for k, port in enumerate(ports):
        conf = tmp_path / f"sshd{k}.conf"
        conf.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path}/hostkey\n"
                        f"AuthorizedKeysFile {tmp_path}/authorized_keys\nPermitRootLogin prohibit-password\n"
                        f"PasswordAuthentication no\nStrictModes no\nPidFile {tmp_path}/sshd{k}.pid\n")
        subprocess.run(["/usr/sbin/sshd", "-f", str(conf), "-E", str(tmp_path / f"sshd{k}.log")], check=True)
        pids.append(tmp_path / f"sshd{k}.pid")
    for pid, port in zip(pids, ports):  # sshd forks into the background: wait until it serves
        deadline = time.monotonic() + 20
        while not (pid.exists() and pid.read_text().strip() and _listening(port)):
            assert time.monotonic() < deadline, f"sshd on port {port} did not start"
            time.sleep(0.05)
    hosts = "".join(f"Host worker-{k}\n    HostName 127.0.0.1\n    Port {port}\n"
                    for k, port in enumerate(ports))
    (tmp_path / "ssh_config").write_text(hosts + f"Host *\n    IdentityFile {tmp_path}/key\n"
                                         "    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
                                         "    LogLevel ERROR\n")
    (tmp_path / "hostfile").write_text("worker-0 slots=1\nworker-1 slots=1\n")
    yield tmp_path, pids
    for pid in pids:
        if pid.exists():
            os.kill(int(pid.read_text()), signal.SIGTERM)


def _launcher_command(stand_in: str, collective: str = "all_reduce") -> list[str]:
    """Our MPIJob's launcher command for a 2-node probe of `collective`, one rank per worker here."""
    cfg = cfg_for("efa_probe")
    spec = next(p.spec for p in expand(cfg) if p.spec.nodes == 2 and p.spec.efa_per_node == 32
                and p.spec.collective == collective)
    command = manifest(cfg, spec)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "command"]
    command = list(command)
    command[command.index("-np") + 1], command[command.index("-N") + 1] = "2", "1"
    command[command.index(perf_binary(NCCL_TESTS, collective))] = stand_in
    return command


def _run(tmp_path: Path, shared_data: Path, collective: str = "all_reduce",
         table: Path | None = None) -> subprocess.CompletedProcess:
    marker = tmp_path / "launcher-only"
    (marker / "bin").mkdir(parents=True, exist_ok=True)
    table = table or shared_data / "nccl-tests" / "sample_01.txt"
    stand_in = marker / "bin" / f"{collective}_perf"
    stand_in.write_text("#!/bin/bash\n"
                        # on stderr: only rank 0 writes stdout, as all_reduce_perf does, so no line is split
                        'echo "fsdpbench-env PATH=$PATH LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >&2\n'
                        # the recorded table without the mpirun tags it was captured with (this mpirun adds
                        # them), a line at a time; mpirun tags each piece it reads, so a row now and then
                        # arrives with a second tag in its middle, which the parser must take
                        '[ "$OMPI_COMM_WORLD_RANK" = 0 ] && '
                        'sed -u -E "s/^\\[[0-9]+,[0-9]+\\]<std(out|err)>://" '
                        f'{table}\n'
                        "exit 0\n")
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{marker}/bin:{os.environ['PATH']}", "LD_LIBRARY_PATH": f"{marker}/lib",
           # what the operator gives the launcher: the hostfile of its workers, and ssh options
           "OMPI_MCA_orte_default_hostfile": str(tmp_path / "hostfile"),
           "OMPI_MCA_plm_rsh_args": f"-F {tmp_path}/ssh_config"}
    return subprocess.run(_launcher_command(str(stand_in), collective), env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_rendered_mpirun_reaches_sshd_workers_and_passes_path_and_libraries(workers, shared_data) -> None:
    tmp_path, _ = workers
    proc = _run(tmp_path, shared_data)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    env_lines = [ln for ln in proc.stderr.splitlines() if "fsdpbench-env" in ln]
    assert len(env_lines) == 2  # one rank on each worker, tagged by mpirun
    marker = str(tmp_path / "launcher-only")
    assert all(f"PATH={marker}/bin:" in ln and f"LD_LIBRARY_PATH={marker}/lib" in ln for ln in env_lines)
    efa = next(p.spec for p in expand(cfg_for("efa_probe")) if p.spec.nodes == 2 and p.spec.efa_per_node == 1)
    summary = records_from_output(proc.stdout, efa)[-1]
    assert summary["status"] == "ok" and summary["busbw_avg_gbs"] == 1.15327, \
        (summary["error"], proc.stdout[-1500:])


@pytest.mark.parametrize("collective,table", [("all_gather", "ag_2.17.6_gb300_8ranks.txt"),
                                              ("reduce_scatter", "rs_2.18.0_rtx5090_2ranks.txt")])
def test_gather_and_reduce_scatter_probes_run_their_own_binary_through_the_same_contract(
        workers, shared_data, collective: str, table: str) -> None:
    """The all-gather's and reduce-scatter's MPIJobs: the same mpirun line with their own binary (found by
    the stand-in's name at the rendered path), the workers reached, the table parsed as that collective."""
    tmp_path, _ = workers
    proc = _run(tmp_path, shared_data, collective, TESTDATA / table)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len([ln for ln in proc.stderr.splitlines() if "fsdpbench-env" in ln]) == 2
    spec = next(p.spec for p in expand(cfg_for("efa_probe"))
                if p.spec.nodes == 2 and p.spec.efa_per_node == 32 and p.spec.collective == collective)
    records = records_from_output(proc.stdout, spec)
    summary = records[-1]
    assert summary["status"] == "ok", (summary["error"], proc.stdout[-1500:])
    assert summary["collective"] == collective
    assert summary["busbw_avg_gbs"] == {"all_gather": 146.047, "reduce_scatter": 1.73537}[collective]


def test_a_worker_without_sshd_is_a_launch_error(workers, shared_data) -> None:
    tmp_path, pids = workers
    os.kill(int(pids[1].read_text()), signal.SIGTERM)
    pids[1].unlink(missing_ok=True)
    import time
    time.sleep(0.5)
    proc = _run(tmp_path, shared_data)
    assert proc.returncode != 0
    status, error = classify(Outcome(returncodes=[proc.returncode]), [], proc.stdout + proc.stderr)
    assert status == "launch_error", (status, error)
