"""A cluster's GPU network as NCCL sees it: the scale-up domain among a node's GPUs (NVSwitch, NVLink, PCIe)
and the scale-out fabric between nodes (adapters per node, their transport and rate), and the fabrics of
published systems by name (FABRICS), each with the documents its figures come from.

Figures are what the vendors publish (one direction, per GPU for the scale-up domain; per adapter for the
network); NCCL's own view of them (its per-link NVLink figures, its PCIe and NIC speeds) is derived from
these by bench/predict/nccl_graph.py. Nothing here imports the rest of the project.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

ScaleUpKind = Literal["nvswitch", "nvlink", "pcie"]
SCALE_UP_KINDS: tuple[ScaleUpKind, ...] = get_args(ScaleUpKind)
# efa: AWS Elastic Fabric Adapter (aws-ofi-nccl); infiniband and roce: NCCL's IB verbs transport; tcp: NCCL's
# socket transport (IPoIB too); tcpx / tcpxo: GCP's GPUDirect-TCPX (A3 High) and -TCPXO (A3 Mega) net plugins;
# slingshot: HPE Slingshot 11 through aws-ofi-nccl over libfabric's cxi provider, GPUDirect RDMA (a Perlmutter
# log prints "NET/OFI Selected Provider is cxi" and channels "via NET/AWS Libfabric/N/GDRDMA":
# sparticlesteve/podman-nccl-testing logs/shifter-nccl-tests-30743809.out; HPE shs-ccl-docs ccl_env.sh)
Transport = Literal["efa", "infiniband", "roce", "tcp", "tcpx", "tcpxo", "slingshot"]
TRANSPORTS: tuple[Transport, ...] = get_args(Transport)
# How a GPU reaches its nearest GPU-facing adapter, in NCCL's path types (src/graph/topo.h; `nvidia-smi
# topo -m` prints the same for each GPU and NIC): pix (one PCIe switch) or pxb (several, no host bridge: HGX
# and DGX boards, the adapters beside the GPUs), c2c (a Grace Hopper or Grace Blackwell superchip's NIC on
# the Grace CPU, reached over NVLink-C2C: NCCL 2.27+ calls it P2C, earlier versions PHB), phb (through the
# CPU's PCIe host bridge), sys (across the CPUs' interconnect). NCCL's LL128 crosses nodes only over a short
# one (bench/predict/collective.py ll128_across).
NicPath = Literal["pix", "pxb", "c2c", "phb", "sys"]
NIC_PATHS: tuple[NicPath, ...] = get_args(NicPath)
CpuVendor = Literal["intel", "amd", "arm"]
CPU_VENDORS: tuple[CpuVendor, ...] = get_args(CpuVendor)
# PCIe x16 generation -> GB/s one direction as NCCL counts a link (src/graph/topo.cc kvDictPciGen: lanes x
# GT/s / 8 less encoding; Gen3 12 is topo.h PCI_BW)
PCIE_GBS = {3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}


@dataclass(frozen=True)
class ScaleUp:
    """The GPUs one NVLink/NVSwitch domain (or one PCIe tree) joins, and what each GPU has into it."""

    kind: str  # nvswitch | nvlink | pcie
    gpus: int  # GPUs per domain
    gbs: float  # one-direction GB/s per GPU into the domain (H100 NVLink4: 18 links x 25 = 450)
    nvls: bool = False  # NVLink SHARP (NVSwitch gen3 with H100/H200/B200): NCCL's NVLS algorithms

    def __post_init__(self) -> None:
        if self.kind not in SCALE_UP_KINDS:
            raise ValueError(f"scale-up kind {self.kind!r}: one of {', '.join(SCALE_UP_KINDS)}")
        if self.gpus < 1 or self.gbs <= 0:
            raise ValueError(f"scale-up domain of {self.gpus} GPUs at {self.gbs} GB/s: both must be positive")
        if self.nvls and self.kind != "nvswitch":
            raise ValueError("NVLink SHARP (nvls) needs an NVSwitch domain")

    def reach_gbs(self, ranks: int) -> float:
        """One-direction GB/s a GPU has towards the other ranks of its domain when `ranks` of its GPUs
        take part: all of it through a switch (or PCIe); in a mesh of direct links (4-GPU HGX boards, GH200
        nodes), only the links to the ranks beside it, gbs / (gpus - 1) to each. NCCL's topology holds the
        communicator's GPUs alone (src/graph/topo.cc ncclTopoGetSystem keeps the local ranks' GPUs, the
        rest are trimmed), each NVLink as its link count times one link's bandwidth."""
        if self.kind != "nvlink" or not 1 < ranks < self.gpus:
            return self.gbs
        return self.gbs * (ranks - 1) / (self.gpus - 1)


@dataclass(frozen=True)
class ScaleOut:
    """A node's GPU-facing network adapters and what NCCL's net plugin tells NCCL about them."""

    transport: str  # one of TRANSPORTS
    adapters: int  # GPU-facing adapters per node
    gbps: float  # line rate per adapter, Gb/s
    rdma: bool  # GPUDirect RDMA: the adapter reads and writes GPU memory from beside the GPU's PCIe switch
    latency_us: float = 0.0  # what the plugin reports as props.latency (NCCL adds it per network hop)
    simple_only: bool = False  # the plugin sets NCCL_PROTO=Simple (no ordered 128-byte delivery: LL unsafe)
    nic_path: str = "pxb"  # NIC_PATHS: how a GPU reaches its adapter

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport {self.transport!r}: one of {', '.join(TRANSPORTS)}")
        if self.nic_path not in NIC_PATHS:
            raise ValueError(f"NIC path {self.nic_path!r}: one of {', '.join(NIC_PATHS)}")
        if self.adapters < 1 or self.gbps <= 0:
            raise ValueError(f"{self.adapters} adapters at {self.gbps} Gb/s: both must be positive")

    @property
    def node_gbs(self) -> float:
        """The node's line rate over all its adapters, GB/s one direction."""
        return self.adapters * self.gbps / 8

    @property
    def gpu_direct(self) -> bool:
        """The adapter moves GPU memory itself from beside the GPU (RDMA, or GCP's GPUDirect-TCPX/O
        header-split receive): NCCL sees a short PCIe path, which keeps LL128 on."""
        return self.rdma or self.transport in ("tcpx", "tcpxo")


@dataclass(frozen=True)
class Fabric:
    """One node type of a cluster: its GPUs' scale-up domain, its network, and the facts NCCL's tuning reads
    beside them (the GPUs' compute capability, their PCIe generation, the CPU vendor)."""

    scale_up: ScaleUp
    scale_out: ScaleOut | None  # None: one node only
    gpus_per_node: int
    compute_capability: int  # 80 A100, 86 A10G, 90 H100/H200, 100 B200: NCCL's tables are indexed by it
    pcie_gen: int = 4  # the GPUs' and NICs' PCIe x16 generation
    cpu: str = "intel"  # NCCL's LL bandwidth cap and per-step network overhead depend on it
    name: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise ValueError(f"{self.gpus_per_node} GPUs per node")
        if self.pcie_gen not in PCIE_GBS:
            raise ValueError(f"PCIe generation {self.pcie_gen}: one of {sorted(PCIE_GBS)}")
        if self.cpu not in CPU_VENDORS:
            raise ValueError(f"CPU vendor {self.cpu!r}: one of {', '.join(CPU_VENDORS)}")

    @property
    def pcie_gbs(self) -> float:
        return PCIE_GBS[self.pcie_gen]

    def describe(self) -> str:
        """One line: '8 GPU/node, nvswitch 450 GB/s/GPU (NVLS); efa 32 x 100 Gb/s RDMA (400 GB/s/node)'."""
        up = self.scale_up
        line = f"{self.gpus_per_node} GPU/node, {up.kind} {up.gbs:g} GB/s/GPU{' (NVLS)' if up.nvls else ''}"
        out = self.scale_out
        if out is None:
            return line + "; no network"
        how = "RDMA" if out.rdma else "no RDMA"
        path = "" if out.nic_path == "pxb" else f", NIC path {out.nic_path}"
        return (f"{line}; {out.transport} {out.adapters} x {out.gbps:g} Gb/s {how} "
                f"({out.node_gbs:g} GB/s/node{path})")


def _h100_domain() -> ScaleUp:
    return ScaleUp("nvswitch", 8, 450.0, nvls=True)


_AWS_P4 = ("AWS EC2 P4 instance page (aws.amazon.com/ec2/instance-types/p4/): 8 A100, NVSwitch 600 GB/s "
           "bidirectional per GPU, 4 x 100 Gb/s EFA with GPUDirect RDMA, Intel Xeon (Cascade Lake), PCIe "
           "Gen4; aws-ofi-nccl src/platform-aws.cpp (latency 75 us for p4d/p4de) and issue "
           "aws/aws-ofi-nccl#76 (EFA on p4d runs NCCL's Simple protocol only)")
_AWS_P5 = ("AWS EC2 P5 instance page (aws.amazon.com/ec2/instance-types/p5/): 8 GPUs, NVSwitch 900 GB/s "
           "bidirectional per GPU, 3200 Gb/s EFA (EC2 user guide efa-acc-inst-types: 32 EFA devices on "
           "p5/p5e), GPUDirect RDMA, 3rd gen AMD EPYC, PCIe Gen5; aws-ofi-nccl src/platform-aws.cpp "
           "(latency 75 us for p5/p5e) and PR aws/aws-ofi-nccl#280 (LL protocols allowed on P5 with RDMA)")
_AWS_P5EN = ("AWS EC2 P5 instance page: p5en.48xlarge 8 H200, 3200 Gb/s EFAv3 (16 EFA devices, EC2 user "
             "guide efa-acc-inst-types), Intel Xeon (Sapphire Rapids), PCIe Gen5; aws-ofi-nccl "
             "src/platform-aws.cpp (latency 35 us for p5en)")
_DGX_H100 = ("NVIDIA DGX H100 datasheet: 8 H100 SXM, 4 NVSwitch (900 GB/s bidirectional GPU-to-GPU), 8 x "
             "single-port ConnectX-7 400 Gb/s InfiniBand NDR for compute, 2 x Intel Xeon Platinum 8480C, "
             "PCIe Gen5; NCCL's IB transport reports latency 0 (src/transport/net_ib.cc)")
_GCP_A3 = ("GCP Compute Engine 'Networking and GPU machines' "
           "(cloud.google.com/compute/docs/gpus/gpu-network-bandwidth): A3 Mega 8 H100 with 8 GPU NICs of "
           "200 Gb/s (GPUDirect-TCPXO) plus 1 host NIC, 1,800 Gb/s in all; A3 High 4 GPU NICs of 200 Gb/s "
           "(GPUDirect-TCPX), 1,000 Gb/s in all; Intel Xeon (Sapphire Rapids); the TCPX plugin reports "
           "latency 0 (google/nccl-plugin-gpudirecttcpx src/net_tcpx.cc)")
_AWS_G5 = ("AWS EC2 G5 instance page (aws.amazon.com/ec2/instance-types/g5/): g5.48xlarge 8 A10G on PCIe "
           "(no NVLink), 100 Gb/s networking, AMD EPYC (2nd gen); without EFA NCCL runs its socket "
           "transport over TCP (latency 0, src/transport/net_socket.cc)")

FABRICS: dict[str, Fabric] = {f.name: f for f in [
    Fabric(ScaleUp("nvswitch", 8, 300.0), ScaleOut("efa", 4, 100.0, True, 75.0, simple_only=True), 8, 80,
           pcie_gen=4, cpu="intel", name="p4d.24xlarge", source=_AWS_P4),
    Fabric(ScaleUp("nvswitch", 8, 300.0), ScaleOut("efa", 4, 100.0, True, 75.0, simple_only=True), 8, 80,
           pcie_gen=4, cpu="intel", name="p4de.24xlarge", source=_AWS_P4),
    Fabric(_h100_domain(), ScaleOut("efa", 32, 100.0, True, 75.0), 8, 90, pcie_gen=5, cpu="amd",
           name="p5.48xlarge", source=_AWS_P5),
    Fabric(_h100_domain(), ScaleOut("efa", 32, 100.0, True, 75.0), 8, 90, pcie_gen=5, cpu="amd",
           name="p5e.48xlarge", source=_AWS_P5),
    Fabric(_h100_domain(), ScaleOut("efa", 16, 200.0, True, 35.0), 8, 90, pcie_gen=5, cpu="intel",
           name="p5en.48xlarge", source=_AWS_P5EN),
    Fabric(_h100_domain(), ScaleOut("infiniband", 8, 400.0, True), 8, 90, pcie_gen=5, cpu="intel",
           name="dgx-h100-ndr", source=_DGX_H100),
    Fabric(_h100_domain(), ScaleOut("tcpxo", 8, 200.0, False), 8, 90, pcie_gen=5, cpu="intel",
           name="a3-megagpu-8g", source=_GCP_A3),
    Fabric(_h100_domain(), ScaleOut("tcpx", 4, 200.0, False), 8, 90, pcie_gen=5, cpu="intel",
           name="a3-highgpu-8g", source=_GCP_A3),
    Fabric(ScaleUp("pcie", 8, 24.0), ScaleOut("tcp", 1, 100.0, False), 8, 86, pcie_gen=4, cpu="amd",
           name="g5.48xlarge-tcp", source=_AWS_G5),
]}


def ethernet(gpus_per_node: int, ports: int, gbps: float, scale_up: ScaleUp, compute_capability: int,
             pcie_gen: int = 4, cpu: str = "intel", name: str = "ethernet-tcp") -> Fabric:
    """A plain Ethernet cluster without RDMA: NCCL's socket transport over `ports` x `gbps` per node (what a
    cluster file sets for its own network)."""
    return Fabric(scale_up, ScaleOut("tcp", ports, gbps, False), gpus_per_node, compute_capability,
                  pcie_gen=pcie_gen, cpu=cpu, name=name,
                  source=f"user-described: {ports} x {gbps:g} Gb/s Ethernet, NCCL sockets over TCP")


# The scale-up domain of an 8-GPU node of each GPU of bench/core/hardware.py, for a cluster file that names
# its GPU but no fabric: HGX boards join their SXM GPUs by NVSwitch (A100: 12 NVLink 3 links of 25 GB/s; H100
# and H200: 18 NVLink 4 links; B200: 18 NVLink 5 links of 50 GB/s, with NVLink SHARP from Hopper on: the
# A100, H100 and B200 datasheets); PCIe cards (H100 PCIe and NVL, A10G, L4) reach each other over PCIe.
GPU_SCALE_UP = {"A100-SXM4-40GB": ScaleUp("nvswitch", 8, 300.0),
                "A100-SXM4-80GB": ScaleUp("nvswitch", 8, 300.0),
                "H100-SXM": _h100_domain(), "H200": _h100_domain(),
                "B200": ScaleUp("nvswitch", 8, 900.0, True),
                "H100-96GB-500W": _h100_domain()}  # torchtitan's Grand Teton H100s: 8 on NVLink 4 switches


def gpu_node(gpu: str, gpus_per_node: int, compute_capability: int, scale_out: ScaleOut | None,
             pcie_gen: int = 4) -> Fabric:
    """A node of `gpus_per_node` of a known GPU with the network `scale_out`, where no published fabric names
    the cluster's instance: the GPU's board (GPU_SCALE_UP), else PCIe."""
    up = GPU_SCALE_UP.get(gpu, ScaleUp("pcie", gpus_per_node, PCIE_GBS[pcie_gen]))
    return Fabric(replace(up, gpus=max(up.gpus, gpus_per_node)), scale_out, gpus_per_node, compute_capability,
                  pcie_gen=pcie_gen, name=f"{gpus_per_node} x {gpu}",
                  source="the GPU's board (bench/core/fabric.py GPU_SCALE_UP) and the cluster file's network")
