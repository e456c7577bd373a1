"""The channels NCCL's topology search finds on a node (src/graph/search.cc ncclTopoCompute, NCCL v2.27.7-1),
for the uniform nodes of bench/core/fabric.py: how many channels each pattern (ring, tree, NVLS) runs and at
what per-channel bandwidth inside the node (bw_intra) and to the network (bw_inter), the figures NCCL's
tuning multiplies (bench/predict/collective.py).

NCCL searches the real PCIe/NVLink/NIC graph depth first; here each pattern's channel count at a speed is the
smallest of what the node's links can carry, each channel taking the speed once on every link it crosses:
  - a GPU's link into its NVLink domain (NCCL: links x SMxx_NVLINK_BW, src/graph/topo.h) or, without
    NVLink, its PCIe x16 link: floor(link / speed) channels (NVLS: every channel loads each GPU's link
    once and its head GPU's twice, search.cc ncclTopoSearchTryNvls);
  - across nodes, each NIC NCCL sees: floor(min(NIC, PCIe) / speed) channels per NIC (search.cc
    ncclTopoSearchRecNet subtracts the speed from the NIC once per channel).
The speed steps (speedArray*), the pass that lowers the speed while the next step is above 0.49 of the best
one found, the stop when channels x speed reach the GPU's total bandwidth, the channel doubling above 25 GB/s
(ncclTopoDupChannels) and the second pass that raises the speed again (rings), raises bw_intra up to twice
bw_inter (trees) or bw_inter up to twice bw_intra (NVLS) follow search.cc. Not modelled: GPUs of one node
that differ, PXN and cross-NIC routes, the Intel P2P PCIe overhead, CPU-socket links.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from bench.core.fabric import Fabric

# search.cc speedArrayIntra/Inter (sm < 90), sm90SpeedArray*, sm100SpeedArray* (v2.27.7-1 lines 952-963)
SPEEDS_INTRA = {80: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                100: (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
_SLOW = (6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12)
_HOPPER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0)
SPEEDS_INTER = {80: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0) + _SLOW,
                90: _HOPPER + _SLOW[3:],
                100: (96.0, 48.0, 45.1) + _HOPPER[2:] + _SLOW[3:]}
# NCCL's GB/s per NVLink link by compute capability (src/graph/topo.h SMxx_NVLINK_BW; SM90 was 20.0 before
# v2.21) and the line rate of one link the vendors publish (NVLink 3/4: 25 GB/s, NVLink 5: 50 GB/s per
# direction), which turns a fabric's published GB/s per GPU into NCCL's link count
NVLINK_BW = {80: 20.0, 86: 12.0, 90: 20.6, 100: 40.1}
NVLINK_LINE_GBS = {80: 25.0, 86: 25.0, 90: 25.0, 100: 50.0}
NVLS_MAX_ARITY = 32  # src/include/device.h NCCL_MAX_NVLS_ARITY


@dataclass(frozen=True)
class Node:
    """One node's links as NCCL's search counts them, GB/s one direction."""

    gpus: int  # local ranks
    gpu_link: float  # each GPU into its NVLink domain, or its PCIe link without NVLink
    nvlink: bool
    nics: int  # net devices NCCL sees (0: one node, no network)
    nic_path: float  # GPU -> NIC: the slower of the NIC and the PCIe link
    sm: int

    @property
    def arch(self) -> int:
        """The row of the speed tables: 80 (Volta/Ampere), 90 (Hopper), 100 (Blackwell)."""
        return 100 if self.sm >= 100 else 90 if self.sm >= 90 else 80


@dataclass(frozen=True)
class Graph:
    """What ncclTopoCompute returns for one pattern: channels and per-channel GB/s."""

    pattern: str  # "ring", "tree" or "nvls"
    channels: int
    bw_intra: float
    bw_inter: float


def node_of(fabric: Fabric, local_ranks: int, nodes: int) -> Node:
    """The node NCCL's search sees for `local_ranks` GPUs per node: one NCCL net device per GPU where the
    node has at least as many adapters as GPUs (aws-ofi-nccl groups a GPU's EFA devices into one, NCCL
    merges a dual-port NIC's ports), else the adapters themselves, in the share the ranks use."""
    up, out = fabric.scale_up, fabric.scale_out
    if up.kind == "pcie":
        link, nvlink = fabric.pcie_gbs, False
    else:
        links = round(up.reach_gbs(local_ranks) / NVLINK_LINE_GBS.get(fabric.compute_capability, 25.0))
        link, nvlink = links * NVLINK_BW.get(fabric.compute_capability, 20.0), True
    if nodes < 2 or out is None:
        return Node(local_ranks, link, nvlink, 0, 0.0, fabric.compute_capability)
    devices = min(out.adapters, fabric.gpus_per_node)
    nic_gbs = out.node_gbs / devices
    share = devices * local_ranks / fabric.gpus_per_node  # the ranks' share of the node's adapters: fewer
    # than one where the node's other GPUs' communicators run beside them on the same adapters
    used = max(1, round(share))
    return Node(local_ranks, link, nvlink, used, min(nic_gbs * min(1.0, share), fabric.pcie_gbs),
                fabric.compute_capability)


def speeds(node: Node) -> tuple[float, ...]:
    return (SPEEDS_INTER if node.nics else SPEEDS_INTRA)[node.arch]


def ring_fit(node: Node, speed: float, max_channels: int) -> int:
    """Ring channels at `speed`: each crosses every GPU's link once and, across nodes, one NIC."""
    n = max_channels
    if node.gpus > 1:
        n = min(n, math.floor(node.gpu_link / speed + 1e-9))
    if node.nics:
        n = min(n, node.nics * math.floor(node.nic_path / speed + 1e-9))
    return n


def nvls_fit(node: Node, speed: float) -> int:
    """NVLS channels at `speed`: one per head GPU (one per NIC across nodes), all of them or none; each
    channel loads every GPU's link once and its head's twice."""
    heads = min(node.gpus, NVLS_MAX_ARITY, node.nics or node.gpus)
    links = (heads + 1) * speed <= node.gpu_link + 1e-9
    return heads if links and (not node.nics or speed <= node.nic_path + 1e-9) else 0


def first_speed(node: Node, min_channels: int, tree_like: bool) -> int:
    """search.cc: start at the first speed no path exceeds and min_channels of which the GPU's total
    bandwidth carries (a non-ring pattern's total counted G/(G-1) larger)."""
    table = speeds(node)
    max_bw = node.nic_path if node.nics else node.gpu_link
    total = node.gpu_link * (node.gpus / (node.gpus - 1) if tree_like and node.gpus > 1 else 1.0)
    i = 0
    while i < len(table) - 1 and (table[i] > max_bw + 1e-9 or table[i] * min_channels > total + 1e-9):
        i += 1
    return i


def first_pass(node: Node, perfect: int, min_channels: int, tree_like: bool,
               fits: Callable[[float], int]) -> tuple[int, float]:
    """Pass 1: lower the speed until a graph is found, then while the next step is above 0.49 of the best;
    keep the largest channels x speed (ties to the faster), stop at `perfect` channels (the pattern's
    maximum) or once channels x speed reach the GPU's total bandwidth."""
    table = speeds(node)
    i = first_speed(node, min_channels, tree_like)
    best = (0, 0.0)
    while True:
        n = fits(table[i])
        if n >= min_channels and n * table[i] > best[0] * best[1] + 1e-9:
            best = (n, table[i])
        if best[0] and (best[0] == perfect or best[0] * best[1] >= node.gpu_link - 1e-9):
            return best
        if i < len(table) - 1 and (not best[0] or table[i + 1] / best[1] > 0.49):
            i += 1
            continue
        return best


def raised(start: float, table: tuple[float, ...], cap: float, fits: Callable[[float], bool]) -> float:
    """search.cc pass 2 for trees and NVLS: step one figure up the speed table while it is below `cap`
    (twice the other figure) and the graph still fits."""
    value = start
    for sp in reversed([sp for sp in table if sp > start + 1e-9]):
        if value >= cap - 1e-9 or not fits(sp):
            break
        value = sp
    return value


def duplicate(channels: int, speed: float, max_channels: int, sm: int) -> tuple[int, float]:
    """ncclTopoDupChannels: fast channels are split in two (twice the channels at half the speed), except
    below 25 GB/s and, after Ampere, below 50 GB/s with more than 4 channels."""
    if speed < 25.0 or (sm > 80 and speed < 50.0 and channels > 4):
        return channels, speed
    doubled = min(2 * channels, max_channels)
    return doubled, speed / math.ceil(doubled / channels)


def ring(node: Node, max_channels: int) -> Graph:
    """The ring graph (pattern 4): pass 1, channel doubling, then pass 2 raises the speed while the same
    channels still fit."""
    n, s = first_pass(node, max_channels, 1, False, lambda sp: ring_fit(node, sp, max_channels))
    if not n:
        return Graph("ring", 1, 0.1, 0.1)  # search.cc: "falling back to simple order"
    n, s = duplicate(n, s, max_channels, node.sm)
    table = speeds(node)
    faster = [sp for sp in table if sp > s + 1e-9]
    for sp in reversed(faster):
        if ring_fit(node, sp, max_channels) < n:
            break
        s = sp
    return Graph("ring", n, s, s)


def tree(node: Node, channels: int) -> Graph:
    """The tree graph (balanced tree, pattern 1): exactly the ring's channels; pass 2 raises bw_intra up to
    twice bw_inter while the GPUs' links carry it (the 2-node and collnet case NCCL names)."""
    def fits(speed: float) -> int:
        return channels if ring_fit(node, speed, channels) >= channels else 0

    n, s = first_pass(node, channels, channels, True, fits)
    if not n:
        return Graph("tree", channels, 0.1, 0.1)
    intra = raised(s, speeds(node), 2 * s, lambda sp: node.gpus < 2 or channels * sp <= node.gpu_link + 1e-9)
    return Graph("tree", channels, intra, s)


def nvls(node: Node) -> Graph | None:
    """The NVLS graph (pattern 5; NVSwitch with NVLink SHARP, Hopper or later): one channel per head GPU
    (per NIC across nodes), each loading every GPU's NVLink once and its head's twice; pass 2 raises
    bw_inter up to twice bw_intra while the NIC carries it. None where the search finds nothing."""
    table = speeds(node)
    heads = min(node.gpus, NVLS_MAX_ARITY)
    i = first_speed(node, 1 if node.nics else heads, True)  # one node: all heads or none (search.cc)
    while i < len(table) and not nvls_fit(node, table[i]):
        i += 1
    if i == len(table):
        return None
    s, n = table[i], nvls_fit(node, table[i])
    inter = raised(s, table, 2 * s, lambda sp: sp <= node.nic_path + 1e-9) if node.nics else s
    return Graph("nvls", n, s, inter)
