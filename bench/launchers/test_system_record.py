"""What the launchers give the workers for their system record: the container image (FSDPBENCH_IMAGE), and on
an nccl-tests probe, which writes none, each node's record from `python -m trainer.system` before the binary
(the Slurm script's line: its golden files; the MPIJob's ranks: here, through the operator's real contract
of test_mpijob_contract: sshd workers and the rendered mpirun)."""
from __future__ import annotations

import sys

import pytest

from bench.core.records import parse_records
from bench.core.system import IMAGE_ENV
from bench.launchers.base import IMAGE_PYTHON, IMAGE_WORKDIR, job_env
from bench.launchers.k8s_manifests import SYSTEM_THEN_EXEC, manifest
from bench.launchers.test_kubernetes import IMAGE, cfg_for
from bench.launchers.test_mpijob_contract import _run, workers  # noqa: F401 - the sshd workers fixture
from bench.probes.records import records_from_output
from bench.study.plan import expand
from conftest import ROOT


def test_every_kubernetes_worker_learns_its_image() -> None:
    train_cfg = cfg_for("p5_scaling")  # launcher.kubernetes.image: the image every pod runs
    train = next(p.spec for p in expand(train_cfg) if p.spec.kind == "train")
    pods = manifest(train_cfg, train)["spec"]["pytorchReplicaSpecs"]
    assert all({"name": IMAGE_ENV, "value": IMAGE} in pods[role]["template"]["spec"]["containers"][0]["env"]
               for role in pods)
    cfg = cfg_for("efa_probe")
    probe = next(p.spec for p in expand(cfg) if p.spec.kind == "nccl" and p.spec.nodes == 2)
    launcher = manifest(cfg, probe)["spec"]["mpiReplicaSpecs"]["Launcher"]
    command = launcher["template"]["spec"]["containers"][0]["command"]
    assert f"{IMAGE_ENV}={IMAGE}" in command  # -x: the ranks' environment, which their record reads
    at = command.index(SYSTEM_THEN_EXEC)
    assert command[at - 2:at + 3] == ["sh", "-c", SYSTEM_THEN_EXEC, "fsdpbench-system", probe.run_id]
    assert command[at + 3].endswith("_perf")  # then the binary itself, its arguments after it


def test_a_local_run_names_no_image() -> None:
    cfg = cfg_for("smoke", "launcher=local", "cluster=local")
    spec = next(p.spec for p in expand(cfg))
    assert IMAGE_ENV not in job_env(cfg, spec, "/tmp/run")


@pytest.mark.slow  # two ranks import torch for their records: seconds on 2 cores
def test_each_mpijob_node_writes_its_record_before_the_binary(workers, shared_data, monkeypatch) -> None:  # noqa: F811
    """The rendered mpirun over two sshd workers (one slot each: two nodes to Open MPI), the wrapper run
    from this checkout instead of the image's: each node's local rank 0 writes its record through mpirun's
    tagged output, which the launcher's log keeps; the probe's table still parses."""
    import bench.launchers.test_mpijob_contract as contract
    here = SYSTEM_THEN_EXEC.replace(f"cd {IMAGE_WORKDIR}", f"cd {ROOT}").replace(
        f"{IMAGE_PYTHON} -m trainer.system", f"{sys.executable} -m trainer.system")
    original = contract._launcher_command
    monkeypatch.setattr(contract, "_launcher_command", lambda *a: [
        here if part == SYSTEM_THEN_EXEC else part for part in original(*a)])
    tmp_path, _ = workers
    proc = _run(tmp_path, shared_data)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [r for r in parse_records(proc.stdout.splitlines()) if r["kind"] == "system"]
    assert len(records) == 2 and {r["source"] for r in records} == {"nccl-tests"}
    assert all(r["facts"]["env"]["FI_PROVIDER"] == "efa" for r in records)  # the -x environment
    efa = next(p.spec for p in expand(cfg_for("efa_probe")) if p.spec.nodes == 2 and p.spec.efa_per_node == 1)
    assert records_from_output(proc.stdout, efa)[-1]["busbw_avg_gbs"] == 1.15327
