"""A cluster's fabric (bench/core/fabric.py): what a node type says of its GPUs' domain and its network, the
published fabrics' figures as their documents give them, and one-line refusals of impossible ones."""
from __future__ import annotations

import pytest

from bench.core.fabric import FABRICS, PCIE_GBS, ScaleOut, ScaleUp, ethernet


def test_published_fabrics_carry_their_documents_figures() -> None:
    # (GPU-facing adapters, Gb/s each, node GB/s, NVLink GB/s per GPU one way, NVLS, plugin latency in us)
    expected = {"p4d.24xlarge": (4, 100, 50, 300, False, 75), "p4de.24xlarge": (4, 100, 50, 300, False, 75),
                "p5.48xlarge": (32, 100, 400, 450, True, 75), "p5e.48xlarge": (32, 100, 400, 450, True, 75),
                "p5en.48xlarge": (16, 200, 400, 450, True, 35), "dgx-h100-ndr": (8, 400, 400, 450, True, 0),
                "a3-megagpu-8g": (8, 200, 200, 450, True, 0), "a3-highgpu-8g": (4, 200, 100, 450, True, 0),
                "g5.48xlarge-tcp": (1, 100, 12.5, 24, False, 0)}
    assert set(FABRICS) == set(expected)
    for name, (adapters, gbps, node_gbs, nvlink, nvls, latency) in expected.items():
        fab = FABRICS[name]
        out = fab.scale_out
        assert (out.adapters, out.gbps, out.node_gbs) == (adapters, gbps, node_gbs), name
        assert (fab.scale_up.gbs, fab.scale_up.nvls, out.latency_us) == (nvlink, nvls, latency), name
        assert fab.gpus_per_node == 8 and fab.source and fab.name == name
    assert FABRICS["p4d.24xlarge"].scale_out.simple_only and not FABRICS["p5.48xlarge"].scale_out.simple_only
    assert not FABRICS["g5.48xlarge-tcp"].scale_out.gpu_direct
    assert FABRICS["a3-megagpu-8g"].scale_out.gpu_direct


def test_describe_is_one_line_naming_both_fabrics() -> None:
    assert FABRICS["p5.48xlarge"].describe() == ("8 GPU/node, nvswitch 450 GB/s/GPU (NVLS); "
                                                 "efa 32 x 100 Gb/s RDMA (400 GB/s/node)")
    eth = ethernet(8, 2, 100, ScaleUp("nvswitch", 8, 450.0, nvls=True), 90, pcie_gen=5)
    assert eth.describe() == ("8 GPU/node, nvswitch 450 GB/s/GPU (NVLS); tcp 2 x 100 Gb/s no RDMA "
                              "(25 GB/s/node)")
    assert eth.pcie_gbs == PCIE_GBS[5] == 48.0


def test_impossible_fabrics_are_refused() -> None:
    with pytest.raises(ValueError, match="scale-up kind"):
        ScaleUp("infinityfabric", 8, 450.0)
    with pytest.raises(ValueError, match="transport"):
        ScaleOut("omnipath", 4, 100.0, True)
    with pytest.raises(ValueError, match="positive"):
        ScaleOut("tcp", 0, 100.0, False)
    with pytest.raises(ValueError, match="NIC path 'nvl': one of pix, pxb, c2c, phb, sys"):
        ScaleOut("infiniband", 4, 400.0, True, nic_path="nvl")
    with pytest.raises(ValueError, match="PCIe generation"):
        ethernet(8, 1, 100, ScaleUp("pcie", 8, 24.0), 86, pcie_gen=7)


def test_slingshot_is_a_gpu_direct_transport() -> None:
    # HPE Slingshot 11 through aws-ofi-nccl's cxi provider: NCCL moves GPU memory over it (GDRDMA)
    out = ScaleOut("slingshot", 4, 200.0, True)
    assert out.gpu_direct and out.node_gbs == 100.0 and out.latency_us == 0.0


def test_a_mesh_gives_a_part_of_its_gpus_only_the_links_between_them() -> None:
    # 4 H200 on direct NVLink4 (18 links, 6 to each peer): 2 of them share 6 links, 150 GB/s one way; all
    # four, or any part of a switched domain, reach the whole 450
    mesh, switch = ScaleUp("nvlink", 4, 450.0), ScaleUp("nvswitch", 8, 450.0)
    assert [mesh.reach_gbs(r) for r in (1, 2, 3, 4)] == [450.0, 150.0, 300.0, 450.0]
    assert [switch.reach_gbs(r) for r in (2, 4, 8)] == [450.0, 450.0, 450.0]
    assert ScaleUp("nvlink", 2, 300.0).reach_gbs(2) == 300.0  # a bridged pair: its one bundle
