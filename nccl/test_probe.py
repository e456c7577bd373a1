"""nccl-tests command lines, the environment per EFA count, and the torch probe on gloo processes."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.core.schema import RunSpec
from bench.probes.command import (
    anchored_min_bytes,
    busbw_factor,
    collective_of_binary,
    nccl_env,
    perf_argv,
    perf_binary,
)
from nccl.probe import sizes


def test_all_reduce_perf_argv() -> None:
    spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=8, nccl_min_bytes=8,
                   nccl_max_bytes=1 << 30, nccl_iters=50)
    assert perf_argv(spec) == [  # -J is added on the node where the binary has it (Slurm wrapper)
        "all_reduce_perf", "-b", "8", "-e", "1073741824", "-f", "2", "-g", "1", "-n", "50", "-w", "5",
        "-d", "float", "-o", "sum", "-c", "1"]
    assert perf_argv(spec, gpus_per_process=8)[8] == "8"


def test_gather_and_reduce_scatter_argv_start_on_the_study_size() -> None:
    """The doubling sweep is anchored so the largest study size (here 3 x 2^24 bytes: a block's gathered
    parameters) is one of its rows; the gather takes no reduction op."""
    spec = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=8, nccl_min_bytes=8,
                   nccl_max_bytes=1 << 30, collective="all_gather", nccl_sizes="25165824,50331648")
    argv = perf_argv(spec, binary="/opt/nccl-tests/build/all_reduce_perf")
    assert argv[:5] == ["/opt/nccl-tests/build/all_gather_perf", "-b", "12", "-e", "1073741824"]
    assert "-o" not in argv and argv[-2:] == ["-c", "1"]
    assert 50331648 in [12 * 2**i for i in range(27)]  # 12 doubled 22 times
    rs = RunSpec(kind="nccl", model="none", collective="reduce_scatter", nccl_min_bytes=1024,
                 nccl_max_bytes=1 << 26, nccl_sizes="100663296")  # above max: the sweep is not anchored
    assert anchored_min_bytes(rs) == 1024 and perf_argv(rs)[0] == "reduce_scatter_perf"
    assert perf_argv(rs)[-4:] == ["-o", "sum", "-c", "1"]


def test_binaries_are_found_beside_all_reduce_perf() -> None:
    assert perf_binary("all_reduce_perf_mpi", "reduce_scatter") == "reduce_scatter_perf_mpi"
    assert perf_binary("/a/b/all_reduce_perf", "all_reduce") == "/a/b/all_reduce_perf"
    with pytest.raises(ValueError, match="not an nccl-tests all_reduce_perf"):
        perf_binary("/a/b/allreduce", "all_gather")
    assert [collective_of_binary(b) for b in ("all_gather_perf_mpi", "/x/reduce_scatter_perf", "ls")] == [
        "all_gather", "reduce_scatter", None]


def test_bus_bandwidth_factors() -> None:
    """doc/PERFORMANCE.md: 2(n-1)/n for an all-reduce, (n-1)/n for an all-gather and a reduce-scatter."""
    assert busbw_factor(16) == 2 * 15 / 16
    assert busbw_factor(16, "all_gather") == busbw_factor(16, "reduce_scatter") == 15 / 16
    with pytest.raises(ValueError, match="broadcast"):
        busbw_factor(2, "broadcast")


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
    from bench.core.load_config import from_dict
    from bench.launchers import launcher_sections
    from bench.launchers.base import job_env
    from bench.launchers.k8s_manifests import manifest
    from bench.launchers.slurm import SlurmLauncher
    from bench.study.plan import expand
    from bench.sweep import compose
    raw, _ = compose(["+sweep=efa_probe", "launcher.kubernetes.image=img", "nccl.split_per_node=true"])
    cfg = from_dict(raw, launcher_sections())
    probe = next(p.spec for p in expand(cfg) if p.spec.efa_per_node == 0 and p.spec.nodes == 2)
    assert job_env(cfg, probe, None)["NCCL_SOCKET_IFNAME"] == "^lo,docker,veth" \
        == nccl_env(0, "^lo,docker,veth")["NCCL_SOCKET_IFNAME"]
    assert job_env(cfg, probe, None)["NCCL_TESTS_SPLIT"] == "MOD 8"  # one rank per node in each group
    slurm = SlurmLauncher(cfg).render(probe, Path("/fsx/r")).files["job.sbatch"]
    assert "export NCCL_SOCKET_IFNAME='^lo,docker,veth'" in slurm
    assert "export NCCL_TESTS_SPLIT='MOD 8'" in slurm
    launcher = manifest(cfg, probe)["spec"]["mpiReplicaSpecs"]["Launcher"]
    command = launcher["template"]["spec"]["containers"][0]["command"]
    assert "NCCL_SOCKET_IFNAME=^lo,docker,veth" in command and "NCCL_TESTS_SPLIT=MOD 8" in command
    assert "NCCL_SOCKET_IFNAME" not in nccl_env(0)


def test_split_groups_are_counted_from_the_device_list(shared_data) -> None:
    """With NCCL_TESTS_SPLIT each group runs and reports its own all-reduce: the device list's Group column
    (sample_01's real lines, renumbered as MOD 8 numbers them) says how many, so the summary can say the
    bandwidth is per group."""
    import re

    from bench.probes.parse import parse
    text = (shared_data / "nccl-tests" / "sample_01.txt").read_text()
    assert parse(text).groups == 1
    split = re.sub(r"Rank +(\d+) Group +0",
                   lambda m: f"Rank {int(m.group(1)):2d} Group {int(m.group(1)) % 8:2d}", text)
    ranks = parse(text).inferred_ranks()
    assert parse(split).groups == min(8, ranks)


def test_sizes_double_from_min_to_max() -> None:
    assert sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert sizes(1, 16) == [4, 8, 16]  # whole float32 elements
    assert sizes(1024, 4096, shards=3, extra=(5000,)) == [1020, 2040, 4092, 4992]  # 3 shards of whole floats


FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n}


# each collective, and one of them on both world sizes (its bus factor's n): a torchrun each
@pytest.mark.parametrize("nproc,collective", [(2, "all_reduce"), (4, "all_reduce"), (2, "all_gather"),
                                              (4, "reduce_scatter")])
def test_torch_probe_reports_nccl_tests_fields(torchrun, nproc: int, collective: str) -> None:
    """Each collective on 2 or 4 simulated nodes (one gloo rank each): nccl-tests' fields, its own bus
    factor, every element checked, and the study's size (40000 bytes, not a power of two) among the rows."""
    run = torchrun(["nccl.probe", "--kind", "nccl", "--model", "none", "--nodes", str(nproc),
                    "--gpus-per-node", "1", "--collective", collective, "--nccl-sizes", "40000",
                    "--nccl-min-bytes", "4096", "--nccl-max-bytes", "262144", "--nccl-iters", "5"],
                   nproc=nproc)
    assert run.returncode == 0, run.output[-2000:]
    assert "Warning" not in run.output, run.output[-2000:]  # torch's current names: no deprecation notice
    rows = run.of_kind("nccl")
    assert [r["size"] for r in rows] == sorted([4096 * 2**i for i in range(7)] + [40000])
    for r in rows:
        algbw = r["size"] / (r["time_us"] * 1e-6) / 1e9
        assert r["algbw"] == pytest.approx(algbw, rel=1e-9)
        assert r["busbw"] == pytest.approx(algbw * FACTOR[collective](nproc), rel=1e-9)
        assert r["wrong"] == 0 and r["count"] == r["size"] // 4
        assert r["redop"] == ("none" if collective == "all_gather" else "sum")
    summary = run.summary
    assert summary["status"] == "ok" and summary["ranks"] == nproc and summary["transport"] == "gloo"
    assert summary["collective"] == collective
    assert summary["busbw_avg_gbs"] == pytest.approx(sum(r["busbw"] for r in rows) / len(rows))
    assert summary["busbw_max_gbs"] == max(r["busbw"] for r in rows)
    # torchrun's standalone agent is one node: its local rank 0 wrote the node's system record, alone
    [system] = run.of_kind("system")
    assert system["source"] == "nccl.probe" and system["local_rank"] == 0 and "env" in system["facts"]
