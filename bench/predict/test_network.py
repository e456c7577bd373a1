"""The network a run is predicted on (bench/predict/network.py): a cluster file's fabric, its instance's
published one or its GPU's board; the EFA adapters a run uses; the transport's fitted figures where the
study probed nothing, and the study's probes where it did."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bench.core.config import ClusterConfig, FabricConfig, ScaleOutConfig, ScaleUpConfig
from bench.core.fabric import FABRICS
from bench.core.hardware import GPUS
from bench.core.load_config import from_dict
from bench.launchers import launcher_sections
from bench.predict.comm import nccl_time
from bench.predict.network import DEFAULTS, SOCKETS, Probe, fabric_of, network_for, published, run_fabric
from bench.sweep import compose

H100 = GPUS["H100-SXM"]


def _cluster(name: str, **overrides: str) -> ClusterConfig:
    raw, _ = compose([f"cluster={name}", "+sweep=p5_scaling", "axes.efa_per_node=[0]",
                      "nccl.efa_per_node=[0]",
                      *(f"{k}={v}" for k, v in overrides.items())])
    return from_dict(raw, launcher_sections()).cluster


def test_each_cluster_file_names_its_fabric_and_old_files_keep_theirs() -> None:
    """The presets beside AWS's: InfiniBand NDR H100 nodes, GCP A3 Mega, plain Ethernet over sockets; an
    old file (p4de: only efa_per_node) keeps its instance's published fabric."""
    assert fabric_of(_cluster("dgx-h100-ib"), H100) is FABRICS["dgx-h100-ndr"]
    assert fabric_of(_cluster("a3-megagpu-8g"), H100) is FABRICS["a3-megagpu-8g"]
    eth = fabric_of(_cluster("ethernet-tcp"), GPUS["A100-SXM4-80GB"])
    assert eth is not None and eth.scale_out is not None
    assert (eth.scale_out.transport, eth.scale_out.adapters, eth.scale_out.gbps, eth.scale_out.rdma) == (
        "tcp", 2, 100.0, False)
    assert (eth.scale_up.kind, eth.scale_up.gbs, eth.cpu, eth.pcie_gen) == ("nvswitch", 300.0, "amd", 4)
    old = from_dict(compose(["cluster=p4de.24xlarge", "+sweep=p4de_scaling"])[0], launcher_sections()).cluster
    assert fabric_of(old, GPUS["A100-SXM4-80GB"]) is FABRICS["p4de.24xlarge"]


def test_a_cluster_the_fabrics_do_not_know_gets_its_gpus_board_and_its_efa() -> None:
    """No published fabric of its instance: the GPU's board with efa_per_node EFA adapters, else sockets;
    a file's own scale_up or scale_out replaces the part it names."""
    plain = ClusterConfig(name="mine", instance_type="mine", gpus_per_node=8, max_nodes=4, gpu="H100-SXM",
                          efa_per_node=16)
    fabric = fabric_of(plain, H100)
    assert fabric is not None and fabric.scale_up.nvls and fabric.scale_out.transport == "efa"
    assert fabric.scale_out.adapters == 16
    assert fabric_of(replace(plain, efa_per_node=0), H100).scale_out == SOCKETS
    ib = replace(plain, efa_per_node=0, fabric=FabricConfig(scale_out=ScaleOutConfig("infiniband", 4, 400.0),
                                                            scale_up=ScaleUpConfig("nvlink", 300.0)))
    built = fabric_of(ib, H100)
    assert (built.scale_out.transport, built.scale_out.node_gbs, built.scale_up.kind) == ("infiniband", 200.0,
                                                                                          "nvlink")
    assert built.scale_out.nic_path == "pxb"  # an HGX board's, unless the file says
    phb = replace(ib, fabric=FabricConfig(scale_out=ScaleOutConfig("infiniband", 4, 400.0, nic_path="phb")))
    assert fabric_of(phb, H100).scale_out.nic_path == "phb"


def test_a_runs_efa_adapters_are_its_share_of_an_efa_fabric_and_nothing_of_another() -> None:
    p5 = FABRICS["p5.48xlarge"]
    assert run_fabric(p5, 8).scale_out.adapters == 8 and run_fabric(p5, 0).scale_out == SOCKETS
    assert run_fabric(FABRICS["dgx-h100-ndr"], 0) is FABRICS["dgx-h100-ndr"]


def test_efa_adapters_on_a_fabric_without_efa_are_one_line_before_anything_is_written() -> None:
    from bench.core.config import ConfigError
    with pytest.raises(ConfigError,
                       match="cluster ethernet-tcp's network is tcp: set axes.efa_per_node=\\[0\\]"):
        from_dict(compose(["cluster=ethernet-tcp", "+sweep=p5_scaling"])[0], launcher_sections())


def test_without_a_probe_a_transport_takes_its_fitted_figures_and_a_probe_replaces_them() -> None:
    """EFA's fitted hop latency (not the 75 us aws-ofi-nccl reports) sets a 2-node all-reduce's small-message
    time; a study's own 2-node probe, 3x slower than the published model, replaces the fit."""
    efa = published("p5.48xlarge")
    assert efa.calibration("all_reduce", True) is DEFAULTS["efa"]
    bare = replace(efa, tuning=())
    small = nccl_time("all_reduce", 1024, 16, 2, efa).seconds
    assert small < 0.6 * nccl_time("all_reduce", 1024, 16, 2, bare).seconds  # 20 us hops, not 75
    rows = tuple((s, 3e6 * nccl_time("all_reduce", s, 16, 2, bare).seconds) for s in (2**10, 2**20, 2**30))
    probe = Probe("all_reduce", 2, 16, 32, rows, None, "the study's all_reduce probe at 2 nodes")
    probed = network_for(FABRICS["p5.48xlarge"], 32, 2, (probe,))
    assert probed.calibration("all_reduce", True).source == probe.source
    farther = network_for(FABRICS["p5.48xlarge"], 32, 16, (probe,))  # the plan's 16 nodes, probed at 2
    extrapolated = f"{probe.source}, extrapolated to 16 nodes (no probe there)"
    assert farther.calibration("all_reduce", True).source == extrapolated
    assert "extrapolated" in farther.described and "extrapolated" not in probed.described
    assert nccl_time("all_reduce", 2**29, 16, 2, probed).seconds == pytest.approx(
        3 * nccl_time("all_reduce", 2**29, 16, 2, bare).seconds, rel=0.1)
