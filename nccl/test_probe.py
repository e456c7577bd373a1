"""nccl-tests command lines, the environment per EFA count, and the torch probe on gloo processes."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.core.schema import RunSpec
from nccl.command import all_reduce_perf_argv, nccl_env
from nccl.probe import sizes


def test_all_reduce_perf_argv() -> None:
    spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=8, nccl_min_bytes=8,
                   nccl_max_bytes=1 << 30, nccl_iters=50)
    assert all_reduce_perf_argv(spec) == [  # -J is added on the node where the binary has it (Slurm wrapper)
        "all_reduce_perf", "-b", "8", "-e", "1073741824", "-f", "2", "-g", "1", "-n", "50", "-w", "5",
        "-d", "float", "-o", "sum", "-c", "1"]
    assert all_reduce_perf_argv(spec, gpus_per_process=8)[8] == "8"


@pytest.mark.parametrize("efa", [1, 4, 32])
def test_efa_runs_pin_the_libfabric_network(efa: int) -> None:
    env = nccl_env(efa)
    assert env["NCCL_NET"] == "AWS Libfabric" and env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1" and "INIT" in env["NCCL_DEBUG_SUBSYS"]


def test_zero_efa_forces_sockets() -> None:
    env = nccl_env(0)
    assert env["NCCL_NET"] == "Socket" and "FI_PROVIDER" not in env and env["NCCL_IB_DISABLE"] == "1"


def test_the_socket_interface_is_pinned_the_same_way_on_every_launcher() -> None:
    """One NCCL_SOCKET_IFNAME from the cluster file, in the environment every launcher writes (Slurm script,
    Kubernetes manifest, local processes) for training and probes alike."""
    from bench.core.config import from_dict
    from bench.launchers.base import job_env
    from bench.launchers.k8s_manifests import manifest
    from bench.launchers.slurm import SlurmLauncher
    from bench.study.plan import expand
    from bench.sweep import compose
    raw, _ = compose(["+sweep=efa_probe", "cluster.kubernetes.image=img", "nccl.split_per_node=true"])
    cfg = from_dict(raw)
    probe = next(p.spec for p in expand(cfg) if p.spec.efa_per_node == 0 and p.spec.nodes == 2)
    assert job_env(cfg, probe, None)["NCCL_SOCKET_IFNAME"] == "^lo,docker,veth" == nccl_env(0, "^lo,docker,veth")[
        "NCCL_SOCKET_IFNAME"]
    assert job_env(cfg, probe, None)["NCCL_TESTS_SPLIT"] == "MOD 8"  # one rank per node in each group
    slurm = SlurmLauncher(cfg).render(probe, Path("/fsx/r")).files["job.sbatch"]
    assert "export NCCL_SOCKET_IFNAME='^lo,docker,veth'" in slurm and "export NCCL_TESTS_SPLIT='MOD 8'" in slurm
    command = manifest(cfg, probe)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "command"]
    assert "NCCL_SOCKET_IFNAME=^lo,docker,veth" in command and "NCCL_TESTS_SPLIT=MOD 8" in command
    assert "NCCL_SOCKET_IFNAME" not in nccl_env(0)


def test_split_groups_are_counted_from_the_device_list(shared_data) -> None:
    """With NCCL_TESTS_SPLIT each group runs and reports its own all-reduce: the device list's Group column
    (sample_01's real lines, renumbered as MOD 8 numbers them) says how many, so the summary can say the
    bandwidth is per group."""
    import re

    from nccl.parse import parse
    text = (shared_data / "nccl-tests" / "sample_01.txt").read_text()
    assert parse(text).groups == 1
    split = re.sub(r"Rank +(\d+) Group +0", lambda m: f"Rank {int(m.group(1)):2d} Group {int(m.group(1)) % 8:2d}", text)
    ranks = parse(text).inferred_ranks()
    assert parse(split).groups == min(8, ranks)


def test_sizes_double_from_min_to_max() -> None:
    assert sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert sizes(1, 16) == [4, 8, 16]  # whole float32 elements


@pytest.mark.parametrize("nproc", [2, 4])
def test_torch_probe_reports_nccl_tests_fields(torchrun, nproc: int) -> None:
    run = torchrun(["nccl.probe", "--kind", "nccl", "--model", "none", "--gpus-per-node", str(nproc),
                    "--nccl-min-bytes", "4096", "--nccl-max-bytes", "262144", "--nccl-iters", "5"], nproc=nproc)
    assert run.returncode == 0, run.output[-2000:]
    rows = run.of_kind("nccl")
    assert [r["size"] for r in rows] == [4096 * 2**i for i in range(7)]
    for r in rows:
        algbw = r["size"] / (r["time_us"] * 1e-6) / 1e9
        assert r["algbw"] == pytest.approx(algbw, rel=1e-9)
        assert r["busbw"] == pytest.approx(algbw * 2 * (nproc - 1) / nproc, rel=1e-9)
        assert r["wrong"] == 0 and r["count"] == r["size"] // 4
    summary = run.summary
    assert summary["status"] == "ok" and summary["ranks"] == nproc and summary["transport"] == "gloo"
    assert summary["busbw_avg_gbs"] == pytest.approx(sum(r["busbw"] for r in rows) / len(rows))
    assert summary["busbw_max_gbs"] == max(r["busbw"] for r in rows)
