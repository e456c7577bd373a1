"""A GPU's terms of the step (device.DeviceModel), the devices users rent: its datasheet peaks, FSDP2's
collectives at NCCL's times on their own streams beside the compute (bench/predict/overlap.py), the compute
they slow while they run (contention) and FSDP2's copies around them, and the host a floor under the step
(HOST_BLOCK_PASS_S). bench/predict/perf.py's docstring gives the whole step these terms sit in."""
from __future__ import annotations

from dataclasses import dataclass

from bench.core.hardware import GPUS, GpuSpec, compute_dtype
from bench.core.models import ModelArch
from bench.core.schema import RunSpec
from bench.predict.comm import (
    EXPOSED_PARTS,
    Collective,
    Network,
    collectives,
    exposed_part,
    nccl_time,
    step_collectives,
    unit_shares,
)
from bench.predict.device import Bound, Calibration, Communication, Peaks, Work, block_passes_s
from bench.predict.overlap import Unit, micro_batch
from bench.predict.traffic import copy_bytes

# The host's CPU time for one block and pass on a GPU machine (eager FSDP2): the floor of a step whose GPU
# work is negligible. Measured, not fitted (benchmarks/evidence/README.md, "Host floor"); published rows'
# steps lie far above it.
HOST_BLOCK_PASS_S = 2.24e-3

GPU_FAMILIES = frozenset(g.family for g in GPUS.values())


def gpu_efficiency(cal: Calibration, family: str, dtype: str) -> float:
    """A GPU family's matmul efficiency at a compute dtype: the calibrated figure, else (a family neither
    published rows nor the study calibrated) the lowest calibrated GPU family's."""
    found = cal.calibrated(family, dtype)
    if found is not None:
        return found
    return min(v for k, v in cal.matmul_efficiency.items() if k in GPU_FAMILIES)


@dataclass(frozen=True)
class GpuModel:
    """A GPU's terms of the step (device.DeviceModel; the module docstring)."""

    gpu: GpuSpec
    cal: Calibration

    def efficiency(self, dtype: str) -> float:
        return gpu_efficiency(self.cal, self.gpu.family, dtype)

    def peaks(self, spec: RunSpec) -> Peaks:
        peak = self.gpu.peak_tflops[compute_dtype(spec.precision)] * 1e12
        return Peaks(peak, self.gpu.peak_tflops.get("fp8", peak / 1e12) * 1e12, self.gpu.hbm_tbs * 1e12)

    def network(self, network: Network) -> Network:
        return network

    def communication(self, spec: RunSpec, arch: ModelArch, network: Network, work: Work) -> Communication:
        """FSDP2's collectives unit by unit beside the compute, as its streams run them (overlap.py), each
        collective's time and channels NCCL's (comm.nccl_time); per micro-batch group of the step."""
        exposed, hidden, total, lost = dict.fromkeys(EXPOSED_PARTS, 0.0), 0.0, 0.0, 0.0
        totals: dict[str, float] = {}
        for comms, count in step_collectives(spec, arch):
            copies = copy_bytes(spec, arch, ((c.kind, c.size, c.ranks) for c in comms))
            lost += count * copies / (self.gpu.hbm_tbs * 1e12)  # FSDP2's copies, on the compute stream
            root, block = self.units(spec, arch, network, work, comms)
            done = micro_batch(root, [block] * work.blocks)
            for part, seconds in done.exposed.items():
                exposed[part] += count * seconds
            for part, seconds in done.by_part.items():
                totals[part] = totals.get(part, 0.0) + count * seconds
            hidden, total, lost = hidden + count * done.hidden, total + count * done.total, \
                lost + count * done.contention
        return Communication(exposed, hidden, total, lost, self.bounds(spec, arch, network, work, totals,
                                                                       exposed))

    def bounds(self, spec: RunSpec, arch: ModelArch, network: Network, work: Work,
               totals: dict[str, float], exposed: dict[str, float]) -> tuple[Bound, ...]:
        """Per part the step runs, NCCL's pick and bound for one block's message (the root's where the
        model is one unit), beside the step's seconds of that part, exposed and in all."""
        root_share, block_share = unit_shares(spec, arch, work.blocks)
        share = block_share if work.blocks else root_share
        out = []
        for c in collectives(spec, arch):
            part = exposed_part(c)
            if part not in totals or any(b.part == part for b in out):
                continue
            t = nccl_time(c.kind, c.size * share[c.kind] / c.groups, c.ranks, c.nodes, network)
            out.append(Bound(part, t.algorithm, t.protocol, t.bound, t.seconds, totals[part], exposed[part]))
        return tuple(out)

    def units(self, spec: RunSpec, arch: ModelArch, network: Network, work: Work,
              comms: list[Collective]) -> tuple[Unit, Unit]:
        """The root's and one block's work in a micro-batch that runs `comms`: each collective's share of
        the unit (comm.unit_shares) at NCCL's time; the compute it slows while it runs (contention)."""
        root_share, block_share = unit_shares(spec, arch, work.blocks)
        units = []
        for share, forward, backward in ((root_share, work.root_forward, work.root_backward),
                                         (block_share, work.block_forward, work.block_backward)):
            times = {exposed_part(c): nccl_time(c.kind, c.size * share[c.kind] / c.groups, c.ranks, c.nodes,
                                                network).seconds for c in comms}
            units.append(Unit(forward, backward, times.get("exposed_all_gather_fwd", 0.0),
                              times.get("exposed_all_gather_bwd", 0.0),
                              times.get("exposed_reduce_scatter", 0.0),
                              times.get("exposed_all_reduce", 0.0), self.cal.contention))
        return units[0], units[1]

    def host_s(self, spec: RunSpec, arch: ModelArch, recompute: float) -> float:
        return block_passes_s(HOST_BLOCK_PASS_S, spec, arch, recompute)

    def parts(self, spec: RunSpec, compute: float, comm: Communication, optimizer: float,
              host: float) -> tuple[dict[str, float], float]:
        """The compute slowed by the collectives beside it (contention); a host slower than the device
        leaves it idle the rest of the step (`other`), the host's time a floor under the step."""
        parts = {"compute": compute + comm.contention, **comm.exposed, "optimizer": optimizer}
        parts["other"] = max(0.0, host - sum(parts.values()))
        return parts, host

    def unmodeled(self, spec: RunSpec) -> str | None:
        """CPU offload: its optimizer steps on the host and its shards cross PCIe every step, neither of
        which the model has (the GPU evidence's offload run measured 13x its floor:
        benchmarks/evidence/README.md). Such a run is no evidence for the study's calibration
        (bench/predict/calibrate.py): its miss would pull every other run's prediction."""
        if spec.offload != "none":
            return "CPU offload (the host's optimizer step and PCIe copies are not modeled)"
        return None
