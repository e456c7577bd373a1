"""One collective's time as NCCL runs it: every algorithm and protocol NCCL has for it, each one's latency and
bandwidth from NCCL's own tuning model, and the one NCCL picks (the fastest by that model), read from NCCL
v2.27.7-1 (src/graph/tuning.cc ncclTopoTuneModel and ncclTopoGetAlgoTime, src/enqueue.cc topoGetAlgoInfo;
docs/collectives.md names every term and line).

    time = latency + bytes / bandwidth          (ncclTopoGetAlgoTime, one operation)
    latency   = base + intra-node hops x NVLink/PCIe hop latency + network hops x (NET hop latency + the
                net plugin's reported latency, twice for Simple)
    bandwidth = channels x per-channel GB/s of the slower leg (bench/predict/nccl_graph.py) x the protocol's
                efficiency and caps, turned into algorithm bandwidth by the algorithm's bus factor

Sizes follow nccl-tests: an all-gather's bytes are the gathered output, a reduce-scatter's the whole input,
an all-reduce's the buffer (NCCL tunes on the same figure: enqueue.cc ncclFuncMaxSendRecvCount). Older NCCL
versions differ in a few constants (PROFILES). A measured table at one shape scales the result
(`Calibration`, fitted by bench/predict/nccl_fit.py): NCCL's choice stays its own, the time it takes is
scaled.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from bench.core.fabric import Fabric
from bench.predict import nccl_graph
from bench.predict.nccl_graph import Graph, Node

KINDS = ("all_reduce", "all_gather", "reduce_scatter")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
BOUNDS = ("latency", "intra-node bandwidth", "network bandwidth")
# NCCL's names in NCCL_ALGO / NCCL_PROTO (src/device/generate.py, ncclAlgoStr/ncclProtoStr) and its
# function prefixes (ncclFuncStr)
ALGO_NAMES = {"tree": "tree", "ring": "ring", "collnetdirect": "collnet_direct",
              "collnetchain": "collnet_chain", "nvls": "nvls", "nvlstree": "nvls_tree", "pat": "pat"}
PROTO_NAMES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
FUNC_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
              "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv"}

# tuning.cc baseLat (us) per algorithm x protocol, Tree and Ring rows (v2.27.7-1 line 134; CollNet, NVLS and
# NVLS Tree 0; PAT's own base is in pat_latency)
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
# tuning.cc hwLat (us) per hop: [NVLink, PCI, NET][algorithm][LL, LL128, Simple] (lines 143-156)
HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0),
               "nvls_tree": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0),
            "nvls_tree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
            "nvls_tree": (0.0, 0.0, 14.0)},
}
# tuning.cc lines 165-189, rows Volta/Ampere/Hopper/Blackwell (by compute capability), columns 1 node, 2
# nodes, more. llMaxBws' rows are the GPU on one node and the CPU across nodes (Intel row 0, AMD row 1).
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
RING_LL128_PER_CH = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (73.4, 73.4, 73.4))
TREE_LL128_PER_CH = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (73.4, 73.4, 58.0))
TREE_PER_CH = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (77.4, 82.8, 72.0))
# v2.28+ NVLS model (tuning.cc nvlsEfficiency, perChMaxNVLSTreeBws), Hopper and Blackwell rows
NVLS_EFFICIENCY = {90: 0.85, 100: 0.74}
NVLS_TREE_PER_CH = {90: (0.0, 57.7, 45.5), 100: (0.0, 96.0, 80.0)}
# tuning.cc treeCorrectionFactor[protocol][log2(bytes/64)], 64 B to 256 MiB (line 555)
TREE_CORRECTION = {
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
# comm.h thread thresholds (bytes per thread before another channel is used) and device.h max threads
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
NVLS_CHANNELS = {90: 16, 100: 32}  # src/transport/nvls.cc NVLS_NCHANNELS_SM90 / SM100 (multi-node)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "arm": 1.0}  # tuning.cc getNetOverhead, per network step


@dataclass(frozen=True)
class Profile:
    """The constants of tuning.cc that changed between the NCCL versions a published table may have run
    (each read from that tag; docs/collectives.md lists them)."""

    since: tuple[int, int]
    tree_simple_lat: tuple[float, float, float, float]  # base, NVLink, PCI and NET hop latency of tree Simple
    ring_ll_quarter: bool  # ring LL at 1/4 of Simple (1/3 for a one-node gather): before 2.21; then 1/2
    ring_allreduce_net_steps_old: bool  # ring all-reduce network steps: 2 x nodes before 2.21, then 2(n-1)
    ring_ll128_low_ppn: float  # ring LL128 efficiency with one GPU per node: 0.7 before 2.23, then 0.92
    pat_factor: float  # PAT's bandwidth factor; 0: no PAT (before 2.23)
    nvls_hop_lat: float  # NVLink hop latency of NVLS and NVLS Tree: 23 us before 2.21, then 25
    nvls_tree_net_lat: float  # NET hop latency of NVLS Tree: 14 us, 20.9 from 2.28
    nvls_efficiency: bool  # 2.28+: NVLS bandwidth from nvlsEfficiency, else min(bw_intra, bw_inter)
    max_channels: int  # MAXCHANNELS (device.h): 32 before 2.25, then 64; a ring searches half of it
    one_gpu_tree_net_lat: bool  # from 2.23 one GPU per node prices network hops at the tree's latency
    c2c_nic_path: str = "phb"  # a NIC on a Grace CPU (fabric.NIC_PATHS c2c): PATH_PHB before 2.27, then P2C


PROFILES = (
    Profile((2, 19), (0.0, 28.0, 28.0, 28.0), True, True, 0.7, 0.0, 23.0, 14.0, False, 32, False),
    Profile((2, 21), (0.0, 28.0, 28.0, 28.0), False, False, 0.7, 0.0, 25.0, 14.0, False, 32, False),
    Profile((2, 23), (8.4, 4.0, 4.0, 14.0), False, False, 0.92, 0.85, 25.0, 14.0, False, 32, True),
    Profile((2, 24), (8.4, 4.0, 4.0, 14.0), False, False, 0.92, 0.75, 25.0, 14.0, False, 32, True),
    Profile((2, 25), (8.4, 4.0, 4.0, 14.0), False, False, 0.92, 0.75, 25.0, 14.0, False, 64, True),
    Profile((2, 27), (8.4, 4.0, 4.0, 14.0), False, False, 0.92, 0.75, 25.0, 14.0, False, 64, True, "p2c"),
    Profile((2, 28), (8.4, 4.0, 4.0, 14.0), False, False, 0.92, 0.75, 25.0, 20.9, True, 64, True, "p2c"),
)
# NCCL's path types in order (src/graph/topo.h, 2.27: PIX 4, PXB 5, P2C 6, PXN 7, PHB 8, SYS 9)
PATH_ORDER = ("pix", "pxb", "p2c", "pxn", "phb", "sys")
DEFAULT_VERSION = "2.27.7"


def profile(version: str | None) -> Profile:
    """The constants of NCCL `version` ('2.21.5', '2.27.7+cuda12.9'); the one read (DEFAULT_VERSION) where
    unknown; versions before 2.19 are read as 2.19 (docs/collectives.md: what that misses)."""
    parts = [int(p) for p in (version or DEFAULT_VERSION).split("+")[0].split(".")[:2] if p.isdigit()]
    key = tuple(parts) if len(parts) == 2 else (2, 27)
    return next((p for p in reversed(PROFILES) if key >= p.since), PROFILES[0])


@dataclass(frozen=True)
class Calibration:
    """A fabric's effective figures from measured tables (nccl_fit.calibrate), each multiplying or replacing
    one term of NCCL's model for the algorithm NCCL picks (the pick stays NCCL's): a one-node table sets
    `latency` (every hop and base latency scaled) and `intra_bw` (a one-node collective's bandwidth); a
    multi-node table sets `net_latency_us` (the latency of one network hop, in place of what the net plugin
    reports to NCCL's tuner) and `net_bw` (a multi-node collective's bandwidth)."""

    latency: float = 1.0
    intra_bw: float = 1.0
    net_latency_us: float | None = None  # None: the plugin's reported latency, as NCCL prices it
    net_bw: float = 1.0
    source: str = "NCCL's published constants (nothing fitted)"


@dataclass(frozen=True)
class Candidate:
    """One algorithm and protocol as NCCL's model prices it (us latency and GB/s as ncclTopoGetAlgoTime)."""

    algorithm: str
    protocol: str
    latency_us: float  # with the ring plateau factor where it applies
    bandwidth_gbs: float  # NCCL's algorithm bandwidth: bytes / 1e3 / this = us; tree correction applied
    time_us: float


@dataclass(frozen=True)
class CollectiveTime:
    """One collective: its predicted time, what NCCL is predicted to pick and why, as nccl-tests reports."""

    kind: str
    nbytes: int
    nodes: int
    ranks: int
    seconds: float
    algorithm: str
    protocol: str
    channels: int
    latency_s: float
    bandwidth_s: float
    bound: str  # one of BOUNDS
    algbw_gbs: float
    busbw_gbs: float
    candidates: tuple[Candidate, ...]  # every enabled algorithm and protocol, fastest first (NCCL's model)

    def why(self) -> str:
        """'ring/LL128 12.3 us (tree/LL 15.1, ring/Simple 20.4)': the pick and the runners-up."""
        others = ", ".join(f"{c.algorithm}/{c.protocol} {c.time_us:.1f}" for c in self.candidates[1:4])
        return f"{self.algorithm}/{self.protocol} {self.candidates[0].time_us:.1f} us ({others})"


@dataclass(frozen=True)
class Comm:
    """A communicator as tuning.cc sees it: the collective, the ranks, the graphs its search found."""

    kind: str
    nodes: int
    ppn: int
    fabric: Fabric
    node: Node
    ring: Graph
    tree: Graph
    nvls: Graph | None
    prof: Profile

    @property
    def ranks(self) -> int:
        return self.nodes * self.ppn

    @property
    def arch(self) -> int:
        """Row of the per-architecture tables: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell."""
        sm = self.fabric.compute_capability
        return 3 if sm >= 100 else 2 if sm >= 90 else 1 if sm >= 80 else 0

    @property
    def col(self) -> int:
        return min(self.nodes, 3) - 1

    @property
    def intra_hw(self) -> str:
        return "nvlink" if self.node.nvlink else "pci"

    @property
    def comm_channels(self) -> int:
        """comm->nChannels (src/graph/connect.cc ncclTopoPostset): the ring's channels twice, twice again on
        Hopper across nodes with rings above 45 GB/s or with a device-unpack network (TCPX/O) below 16."""
        n = min(self.prof.max_channels, 2 * self.ring.channels)
        out = self.fabric.scale_out
        if self.nodes > 1 and self.fabric.compute_capability >= 90 and self.ring.bw_intra > 45.0 and n < 16:
            n *= 2
        if self.nodes > 1 and out is not None and out.transport in ("tcpx", "tcpxo") and n < 16:
            n *= 2
        if self.nvls is not None and self.nvls_support:
            n = max(n, NVLS_CHANNELS.get(min(self.fabric.compute_capability, 100), 16))
        return n

    @property
    def nvls_support(self) -> bool:
        up = self.fabric.scale_up
        return up.nvls and self.fabric.compute_capability >= 90 and self.ppn > 1 and self.nvls is not None


def build_comm(kind: str, nodes: int, gpus_per_node: int, fabric: Fabric, version: str | None = None) -> Comm:
    """The communicator of `nodes` x `gpus_per_node` ranks: its node and the graphs NCCL's search finds."""
    if kind not in KINDS:
        raise ValueError(f"collective {kind!r}: one of {', '.join(KINDS)}")
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"{nodes} nodes x {gpus_per_node} GPUs: both must be positive")
    if nodes > 1 and fabric.scale_out is None:
        raise ValueError(f"{fabric.name or 'the fabric'} has no network: it runs one node")
    prof = profile(version)
    nodes, gpus_per_node, fabric = nvlink_domains(nodes, gpus_per_node, fabric)
    node = nccl_graph.node_of(fabric, gpus_per_node, nodes)
    ring = nccl_graph.ring(node, prof.max_channels // 2)
    tree = nccl_graph.tree(node, ring.channels)
    nvls_on = fabric.scale_up.nvls and fabric.compute_capability >= 90 and gpus_per_node > 1
    nvls = nccl_graph.nvls(node) if nvls_on else None
    return Comm(kind, nodes, gpus_per_node, fabric, node, ring, tree, nvls, prof)


def nvlink_domains(nodes: int, gpus_per_node: int, fabric: Fabric) -> tuple[int, int, Fabric]:
    """Multi-node NVLink (GB200 NVL72): NCCL fuses the trays of one NVLink domain into one node (its
    clique: src/graph/topo.cc ncclTopoGetSystem under comm->MNNVL), so its nodes are the domains the ranks
    span, each with the trays' GPUs and adapters together."""
    up, per = fabric.scale_up, fabric.gpus_per_node
    if up.kind != "nvswitch" or up.gpus <= per or nodes == 1:
        return nodes, gpus_per_node, fabric
    domains = math.ceil(nodes / (up.gpus // per))
    trays = nodes // domains  # domains of equal size; a remainder is not modelled
    out = fabric.scale_out
    fused = replace(fabric, gpus_per_node=per * trays,
                    scale_out=replace(out, adapters=out.adapters * trays) if out is not None else None)
    return domains, gpus_per_node * trays, fused


def steps(comm: Comm) -> tuple[int, int]:
    """A ring's steps and how many of them cross the network (tuning.cc nsteps, nInterSteps)."""
    r, n = comm.ranks, comm.nodes
    if comm.kind == "all_reduce":
        inter = 0 if n == 1 else 2 * n if comm.prof.ring_allreduce_net_steps_old else 2 * (n - 1)
        return 2 * (r - 1), inter
    return r - 1, 0 if n == 1 else n - 1


def hop_latency(comm: Comm, algorithm: str, p: int) -> tuple[float, float]:
    """(intra-node, network) latency of one hop in us: the hop tables (tree Simple and NVLS by version) and
    the plugin's reported latency on every network hop (twice for Simple, the flush)."""
    row = "tree" if algorithm == "pat" else algorithm
    intra = HW_LAT[comm.intra_hw][row][p]
    net_row = "tree" if comm.ppn == 1 and comm.prof.one_gpu_tree_net_lat else row  # latencies exposed
    inter = HW_LAT["net"][net_row][p]
    if algorithm == "tree" and p == 2:
        _, nvl, pci, net = comm.prof.tree_simple_lat
        intra, inter = (nvl if comm.node.nvlink else pci), net
    if algorithm in ("nvls", "nvls_tree"):
        intra = comm.prof.nvls_hop_lat if comm.node.nvlink else 0.0
        inter = comm.prof.nvls_tree_net_lat if algorithm == "nvls_tree" else inter
    out = comm.fabric.scale_out
    plugin = out.latency_us if out is not None and comm.nodes > 1 else 0.0
    inter += plugin * (2 if p == 2 else 1)
    return intra, inter


def latency_us(comm: Comm, algorithm: str, p: int) -> float:
    """tuning.cc comm->latencies[coll][algorithm][protocol]: base plus hops."""
    intra, inter = hop_latency(comm, algorithm, p)
    n, log_n = comm.nodes, int(math.log2(comm.nodes))
    if algorithm == "ring":
        if n > 1:
            overhead = NET_OVERHEAD_US[comm.fabric.cpu] * (3 if p == 2 else 1)
            intra = max(intra, overhead)
        total, net = steps(comm)
        return BASE_LAT["ring"][p] + (total - net) * intra + net * inter
    if algorithm == "tree":
        base = comm.prof.tree_simple_lat[0] if p == 2 else BASE_LAT["tree"][p]
        return base + 2 * ((comm.ppn - 1) * intra + log_n * inter)
    if algorithm == "nvls":
        return intra + (inter if n > 1 else 0.0)
    if algorithm == "nvls_tree":
        return intra + 2 * log_n * inter
    return 8.0 + log_n * (inter / 3.5) + comm.ranks * 2.8  # pat


def bus_bandwidth(comm: Comm, algorithm: str, p: int) -> float:
    """tuning.cc's bus bandwidth, GB/s: channels x per-channel GB/s, then the protocol's refinements."""
    graph = (comm.tree if algorithm in ("tree", "pat") else comm.nvls if algorithm.startswith("nvls")
             else comm.ring)
    if graph is None:
        return 0.0
    bw = graph.bw_intra if comm.nodes <= 2 else graph.bw_inter
    if algorithm in ("nvls", "nvls_tree"):
        bw = nvls_channel_bw(comm, algorithm, graph)
    bus = graph.channels * bw
    arch, col = comm.arch, comm.col
    cpu_row = 1 if comm.fabric.cpu == "amd" else 0
    ll_max = LL_MAX_BW[arch if comm.nodes == 1 else cpu_row][col]
    if algorithm == "ring" and p == 0:
        quarter = 1 / 3 if comm.nodes == 1 and comm.kind != "all_reduce" else 1 / 4
        bus = min(ll_max, bus * (quarter if comm.prof.ring_ll_quarter else 0.5))
    if algorithm == "ring" and p == 1:
        eff = comm.prof.ring_ll128_low_ppn if comm.ppn < 2 else 0.92
        bus = min(bus * eff, graph.channels * RING_LL128_PER_CH[arch][col])
    if algorithm == "tree" and comm.kind == "all_reduce":
        bus = min(bus * 0.92, graph.channels * TREE_PER_CH[arch][col])
    if algorithm == "tree" and p == 0:
        bus = min(bus / 3.8, ll_max)
    if algorithm == "tree" and p == 1:
        eff = 7 / 9 if comm.nodes == 1 else 120 / 128
        bus = min(bus * eff, graph.channels * TREE_LL128_PER_CH[arch][col])
    if algorithm == "pat":
        bus *= comm.prof.pat_factor
    return bus


def nvls_channel_bw(comm: Comm, algorithm: str, graph: Graph) -> float:
    """Per-channel GB/s of NVLS and NVLS Tree: before 2.28 the slower of intra and inter (NVLS Tree's inter
    halved above 2 nodes, a gather's intra by (G-1)/G and inter by 0.9); from 2.28 with NVLink SHARP's
    efficiency."""
    ppn, n = comm.ppn, comm.nodes
    if not comm.prof.nvls_efficiency:
        if algorithm == "nvls_tree":
            return min(graph.bw_intra, graph.bw_inter if n <= 2 else graph.bw_inter / 2)
        if comm.kind == "all_reduce":
            return min(graph.bw_intra, graph.bw_inter)
        return min(graph.bw_intra * (ppn - 1) / ppn, graph.bw_inter * 0.9)
    sm = min(comm.fabric.compute_capability, 100)
    intra = graph.bw_intra * NVLS_EFFICIENCY.get(sm, 0.85) * (graph.channels - 1) / graph.channels
    intra *= 2.0 if comm.kind == "all_reduce" else (ppn - 1) / ppn
    inter = graph.bw_inter * (2 if n <= 2 and algorithm == "nvls_tree" else 1)
    cap = NVLS_TREE_PER_CH.get(sm, (0.0, 57.7, 45.5))[comm.col] if algorithm == "nvls_tree" else math.inf
    return min(intra, inter, cap)


def algo_bandwidth(comm: Comm, algorithm: str, p: int) -> float:
    """tuning.cc comm->bandwidths: the bus bandwidth over the algorithm's bus factor (a ring's R/steps, a
    tree's 1/2, NVLS 5/6, from 2.28 NVLS R/steps); gathers and reduce-scatters off the ring keep their bus
    figure."""
    bus = bus_bandwidth(comm, algorithm, p)
    if algorithm != "ring" and comm.kind != "all_reduce":
        return bus
    if algorithm == "ring" or (algorithm.startswith("nvls") and comm.prof.nvls_efficiency):
        return bus * comm.ranks / steps(comm)[0]
    return bus * (5 / 6 if algorithm.startswith("nvls") else 0.5)


def available(comm: Comm) -> dict[str, tuple[str, ...]]:
    """The algorithms NCCL prices for this collective and the protocols each may use by default
    (tuning.cc's loops and its enable rules, enqueue.cc updateCollCostTable): tree for all-reduce only;
    NVLS on one NVSwitch node with NVLink SHARP (across nodes it needs CollNet), NVLS Tree across nodes for
    all-reduce; PAT for a gather or reduce-scatter with one GPU per node (not over TCPX/O's device unpack);
    CollNet never (it needs SHARP switches and NCCL_COLLNET_ENABLE). LL128 needs NVLink inside the node and,
    across nodes, a NIC near the GPU (ll128_across); a plugin that forces Simple leaves Simple only."""
    out = comm.fabric.scale_out
    multi = comm.nodes > 1
    simple_only = multi and out is not None and out.simple_only
    ll128 = comm.node.nvlink and comm.fabric.compute_capability >= 70 and not (
        multi and out is not None and not ll128_across(comm))
    protos = ("Simple",) if simple_only else ("LL", "LL128", "Simple") if ll128 else ("LL", "Simple")
    algos: dict[str, tuple[str, ...]] = {"ring": protos}
    if comm.kind == "all_reduce":
        algos["tree"] = protos
    nvls = comm.nvls_support and comm.nvls is not None and comm.nvls.channels >= 2
    if nvls and not multi and (comm.kind == "all_reduce" or comm.ppn <= nccl_graph.NVLS_MAX_ARITY):
        algos["nvls"] = ("Simple",)
    if nvls and multi and comm.kind == "all_reduce":
        algos["nvls_tree"] = ("Simple",)
    unpack = out is not None and out.transport in ("tcpx", "tcpxo")
    if comm.kind != "all_reduce" and comm.prof.pat_factor and comm.ppn == 1 and multi and not unpack:
        algos["pat"] = ("Simple",)
    return algos


def ll128_across(comm: Comm) -> bool:
    """Whether LL128 crosses nodes (tuning.cc's enable rule on the graph's typeInter): an adapter that moves
    GPU memory itself, reached over at most PXB, or from Hopper on over at most PXN (a NIC on a Grace CPU is
    P2C from 2.27, below PXN; PHB before)."""
    out = comm.fabric.scale_out
    if out is None or not out.gpu_direct:
        return False
    path = PATH_ORDER.index(comm.prof.c2c_nic_path if out.nic_path == "c2c" else out.nic_path)
    return path <= PATH_ORDER.index("pxb") or (comm.fabric.compute_capability >= 90
                                               and path <= PATH_ORDER.index("pxn"))


def candidate(comm: Comm, algorithm: str, protocol: str, nbytes: int) -> Candidate | None:
    """ncclTopoGetAlgoTime for one operation: the tree correction for all-reduce by size, the ring
    plateau (Simple across nodes, once each rank's share per channel reaches 64 bytes) on its latency."""
    p = PROTOCOLS.index(protocol)
    bw = algo_bandwidth(comm, algorithm, p)
    if bw <= 0:
        return None
    lat = latency_us(comm, algorithm, p)
    log_size = int(math.log2(nbytes >> 6)) if nbytes >> 6 else -1
    if algorithm == "tree" and comm.kind == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[protocol][log_size]
    if (algorithm == "ring" and protocol == "Simple" and comm.nodes > 1 and comm.kind == "all_reduce"
            and nbytes // (comm.comm_channels * comm.ranks) >= 64):
        lat *= 1.4 if comm.fabric.compute_capability >= 80 else 1.9
    return Candidate(algorithm, protocol, lat, bw, lat + nbytes / (1000 * bw))


def channels_run(comm: Comm, algorithm: str, protocol: str, nbytes: int) -> int:
    """The channels NCCL launches (enqueue.cc topoGetAlgoInfo): NVLS its own count; rings and trees drop
    channels while each would get fewer bytes than its threads' threshold."""
    if algorithm.startswith("nvls"):
        return NVLS_CHANNELS.get(min(comm.fabric.compute_capability, 100), 16)
    threads = MAX_THREADS[protocol]
    if algorithm == "ring" and protocol == "Simple" and comm.ring.bw_intra * comm.ring.channels <= 12.0:
        threads = 256  # tuning.cc: a ring no faster than PCIe Gen3 runs 256 Simple threads
    threshold = THREAD_THRESHOLD[protocol] * (comm.ranks if algorithm == "ring" and protocol == "LL" else 1)
    nc = comm.comm_channels
    while nc > 1 and nbytes < nc * threads * threshold:
        nc -= 1
    return nc


def parse_nccl_list(value: str, names: Mapping[str, str], kind: str) -> set[str] | None:
    """The elements NCCL_ALGO / NCCL_PROTO enable for collective `kind` (tuning.cc parseList): a list for
    every function ('Ring,Tree'), '^' to disable the listed ones, 'allreduce:tree;allgather:ring' per
    function. None where the value leaves `kind` alone."""
    enabled: set[str] | None = None
    for i, entry in enumerate(part for part in value.split(";") if part.strip()):
        prefix, _, elems = entry.rpartition(":")
        prefix = prefix.strip().lower()
        if prefix and FUNC_NAMES.get(prefix) is None:
            raise ValueError(f"unknown function {prefix!r} in {value!r}")
        if i and not prefix:
            raise ValueError(f"all entries after the first need a function prefix: {value!r}")
        if prefix and FUNC_NAMES[prefix] != kind:
            continue
        negate = elems.strip().startswith("^")
        listed = {e.strip().lower() for e in elems.strip().lstrip("^").split(",") if e.strip()}
        unknown = listed - set(names)
        if unknown:
            raise ValueError(f"unknown name(s) {sorted(unknown)} in {value!r}")
        chosen = {names[e] for e in listed}
        enabled = set(names.values()) - chosen if negate else chosen
    return enabled


def env_choices(env: Mapping[str, str], kind: str) -> tuple[set[str] | None, set[str] | None]:
    """The algorithms and protocols an nccl-tests run's environment allows for `kind`: NCCL_ALGO and
    NCCL_PROTO as NCCL parses them, NCCL_NVLS_ENABLE=0 and NCCL_PAT_ENABLE=0 taking those algorithms off."""
    algos = parse_nccl_list(env["NCCL_ALGO"], ALGO_NAMES, kind) if env.get("NCCL_ALGO") else None
    protos = parse_nccl_list(env["NCCL_PROTO"], PROTO_NAMES, kind) if env.get("NCCL_PROTO") else None
    off = {a for var, a in (("NCCL_NVLS_ENABLE", "nvls"), ("NCCL_PAT_ENABLE", "pat")) if env.get(var) == "0"}
    if off:
        algos = (algos if algos is not None else set(ALGORITHMS)) - off
        if "nvls" in off:
            algos.discard("nvls_tree")
    return algos, protos


def candidates(comm: Comm, nbytes: int, algorithms: Iterable[str] | None = None,
               protocols: Iterable[str] | None = None) -> list[Candidate]:
    """Every algorithm and protocol NCCL would price for this collective, fastest first; `algorithms` and
    `protocols` restrict them as NCCL_ALGO and NCCL_PROTO do (a protocol forced on stays subject to what
    the algorithm supports)."""
    allowed_a = set(algorithms) if algorithms is not None else None
    allowed_p = set(protocols) if protocols is not None else None
    found = []
    for algorithm, protos in available(comm).items():
        if allowed_a is not None and algorithm not in allowed_a:
            continue
        for protocol in protos:
            if allowed_p is not None and protocol not in allowed_p:
                continue
            if (c := candidate(comm, algorithm, protocol, nbytes)) is not None:
                found.append(c)
    return sorted(found, key=lambda c: c.time_us)


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth per algorithm bandwidth (doc/PERFORMANCE.md): 2(n-1)/n for all-reduce,
    (n-1)/n for a gather or reduce-scatter."""
    return (2 if kind == "all_reduce" else 1) * (ranks - 1) / ranks


def bound_leg(comm: Comm) -> str:
    """Which leg's bandwidth decides a bandwidth-bound collective: across nodes the slower of the node's
    network (line rate per node) and one GPU's scale-up link (both carry about the bus bytes), on one node
    the scale-up domain."""
    out = comm.fabric.scale_out
    if comm.nodes == 1 or out is None:
        return "intra-node bandwidth"
    intra = comm.fabric.scale_up.reach_gbs(comm.ppn) if comm.ppn > 1 else math.inf
    return "network bandwidth" if out.node_gbs <= intra else "intra-node bandwidth"


def latency_parts(comm: Comm, best: Candidate, nbytes: int) -> tuple[float, float]:
    """The picked candidate's latency, us, as (without the plugin's reported latency, us per us of it): the
    plugin's figure enters every network hop (twice for Simple) and the ring plateau scales both."""
    out = comm.fabric.scale_out
    if comm.nodes == 1 or out is None:
        return best.latency_us, 0.0
    bare = replace(comm, fabric=replace(comm.fabric, scale_out=replace(out, latency_us=0.0)))
    unit = replace(comm, fabric=replace(comm.fabric, scale_out=replace(out, latency_us=1.0)))
    base = candidate(bare, best.algorithm, best.protocol, nbytes)
    one = candidate(unit, best.algorithm, best.protocol, nbytes)
    return base.latency_us, one.latency_us - base.latency_us


def predict_collective(kind: str, nbytes: int, nodes: int, gpus_per_node: int, fabric: Fabric, *,
                       version: str | None = None, algorithms: Iterable[str] | None = None,
                       protocols: Iterable[str] | None = None, env: Mapping[str, str] | None = None,
                       calibration: Calibration | None = None) -> CollectiveTime:
    """One collective of `nbytes` (nccl-tests' size) over `nodes` x `gpus_per_node` ranks on `fabric`:
    NCCL's pick among its algorithms and protocols by its own model (forced ones as NCCL_ALGO/NCCL_PROTO,
    or an nccl-tests run's `env`, force them), and its time, scaled by `calibration` where one is given."""
    comm = build_comm(kind, nodes, gpus_per_node, fabric, version)
    ranks = comm.ranks
    if ranks == 1 or nbytes <= 0:
        return CollectiveTime(kind, nbytes, nodes, ranks, 0.0, "none", "none", 0, 0.0, 0.0, "latency", 0.0,
                              0.0, ())
    if env:
        env_a, env_p = env_choices(env, kind)
        algorithms = env_a if algorithms is None else algorithms
        protocols = env_p if protocols is None else protocols
    found = candidates(comm, nbytes, algorithms, protocols)
    if not found:
        raise ValueError(f"no algorithm/protocol left for {kind} (forced {algorithms} / {protocols})")
    best = found[0]
    cal = calibration or Calibration()
    leg = bound_leg(comm)
    scale = cal.net_bw if nodes > 1 else cal.intra_bw
    base_us, per_hop_us = latency_parts(comm, best, nbytes)
    out = comm.fabric.scale_out
    hop = cal.net_latency_us if cal.net_latency_us is not None else out.latency_us if out else 0.0
    lat_s = (base_us * cal.latency + per_hop_us * hop) * 1e-6
    bw_s = nbytes / (best.bandwidth_gbs * scale * 1e9)
    seconds = lat_s + bw_s
    algbw = nbytes / seconds / 1e9
    return CollectiveTime(kind, nbytes, nodes, ranks, seconds, best.algorithm, best.protocol,
                          channels_run(comm, best.algorithm, best.protocol, nbytes), lat_s, bw_s,
                          "latency" if lat_s >= bw_s else leg, algbw, algbw * bus_factor(kind, ranks),
                          tuple(found))
