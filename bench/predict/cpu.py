"""The CPU cores a local study's ranks share, as a device of the step model (device.DeviceModel): the
project's test bench, not a machine users rent. bench/predict/devices.py picks it (`device_model`) for a
run on this machine's cores; a study's own runs calibrate its constants (bench/predict/calibrate.py).

Where it differs from a GPU, each what the CPU's own trace shows (docs/trace.md, "What a CPU cannot tell
apart"):

- gloo's calls block the main thread that computes, so every collective is exposed and nothing contends
  (`CpuModel.overlaps`);
- the host's time per block and pass (`Calibration.cpu_host_s`: Python, FSDP2's hooks and its copies around
  collectives) is on the compute's thread: it adds to the step instead of flooring it, in `other`;
- ranks that outnumber what the machine runs at full speed (`Calibration.cpu_capacity`, prior the cores its
  ranks can use) take turns: each runs its work at the speed of a machine running no more ranks than its
  capacity, and of the rest of its share of the machine it spends CPU_TURNS_SHARED running that work
  slower beside its peers and the remainder waiting for a peer (`waiting`; `cpu_turns`);
- a collective is its gloo ring's steps at the study's own step latency (`Calibration.cpu_step_s`, which
  its traced collectives calibrate; slower, by a share per kind, on a ring of more ranks than the
  capacity: `ring_step_factor`), plus its bus bytes at the CPU's loopback bandwidth. gloo's probe rows are
  mostly latency and unstable on shared cores (neighbouring sizes differ 2x, nine probes of one collective
  up to 5x), so no probe row is read for it.

Its priors read the CPU the runs ran on (`CpuFacts`): one core's fp32 peak (SIMD lanes and clock) and
which 16-bit dtypes it has matmul units for, and the cores its ranks can use. A study's are what its runs'
system records say (`recorded`), so a study reads the same on any machine; a plan's for new local runs
are this machine's (`this_cpu`). The evidence for each constant: benchmarks/evidence/README.md, "CPU smoke
studies".
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.core.hardware import GpuSpec
from bench.core.models import ModelArch, block_params
from bench.core.schema import RunSpec, RunSummary
from bench.core.system import cpu_facts
from bench.predict.comm import (
    EXPOSED_PARTS,
    Collective,
    Network,
    bus_factor,
    exposed_part,
    step_collectives,
)
from bench.predict.device import PUBLISHED, Calibration, Communication, Peaks, Work, block_passes_s

CPU = GpuSpec("cpu", 0, {"fp32": 0.0}, "this machine's cores", hbm_tbs=0.02, intra_busbw_gbs=2.0,
              family="cpu")
CPU_EFFICIENCY = 0.25  # the prior of a CPU study: its own runs calibrate it (bench/predict/calibrate.py)
# A 16-bit matmul on a CPU without 16-bit units (no avx512_bf16/amx_bf16, avx512_fp16/amx_fp16): a fraction
# of fp32's efficiency: 16-bit tokens/s over fp32's in a one-rank smoke on an AVX2 CPU
# (benchmarks/evidence/README.md, "CPU smoke studies"). The study's first run of the dtype replaces it; a
# CPU with the units is taken at its fp32 figure.
CPU_EMULATED_16BIT = 0.18
NATIVE_16BIT_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
PRIOR_GHZ = 2.0  # the clock of a CPU that recorded none (an Arm /proc/cpuinfo names none)


@dataclass(frozen=True)
class CpuFacts:
    """The CPU a local study's ranks run on, as its priors read it."""

    isa: frozenset[str] = field(default_factory=frozenset)  # its vector and matrix units (system.cpu_isa)
    mhz: float | None = None  # its clock (system.cpu_mhz); None: not known, PRIOR_GHZ
    cores: int = 1  # the CPUs its ranks can use (system's cpus_usable)

    def peak_flops(self) -> float:
        """One core's fp32 peak (each CPU rank runs one thread): SIMD lanes x 2 FMA units x 2 x clock."""
        lanes = 16 if "avx512f" in self.isa else 8
        ghz = self.mhz / 1000 if self.mhz else PRIOR_GHZ
        return lanes * 2 * 2 * ghz * 1e9

    def runs_natively(self, dtype: str) -> bool:
        """Whether it has matmul units for a 16-bit dtype."""
        return any(f in self.isa for f in NATIVE_16BIT_FLAGS.get(dtype, ()))

    def to_json(self) -> dict[str, Any]:
        return {"isa": sorted(self.isa), "mhz": self.mhz, "cores": self.cores}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuFacts:
        return cls(frozenset(data["isa"]), None if data["mhz"] is None else float(data["mhz"]),
                   int(data["cores"]))


def _isa(value: Any) -> frozenset[str] | None:
    """A recorded cpu_isa as a set ("none of ...": none of the units; missing: None)."""
    if not isinstance(value, str):
        return None
    return frozenset() if value.startswith("none of ") else frozenset(value.split())


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def from_facts(facts: Mapping[str, Any], otherwise: CpuFacts) -> CpuFacts:
    """A system record's CPU facts (bench/core/system.py), each one it is missing `otherwise`'s."""
    return merged([facts], otherwise)


def merged(records: Iterable[Mapping[str, Any]], otherwise: CpuFacts) -> CpuFacts:
    """The CPU of the nodes these system records' facts describe, the slowest setting the pace (FSDP's
    ranks wait for one another): the units every node has, the lowest clock, the fewest usable cores;
    each fact none of them recorded `otherwise`'s."""
    isas, clocks, cores = [], [], []
    for facts in records:
        if (isa := _isa(facts.get("cpu_isa"))) is not None:
            isas.append(isa)
        if (mhz := _number(facts.get("cpu_mhz"))) is not None:
            clocks.append(mhz)
        usable = facts.get("cpus_usable")
        if isinstance(usable, int) and not isinstance(usable, bool) and usable > 0:
            cores.append(usable)
    return CpuFacts(frozenset.intersection(*isas) if isas else otherwise.isa,
                    min(clocks) if clocks else otherwise.mhz, min(cores) if cores else otherwise.cores)


@functools.cache
def this_cpu() -> CpuFacts:
    """This machine's CPU, read once (system.cpu_facts: what a run here records): the CPU of a plan's new
    local runs, and of a study's facts its runs did not record."""
    facts = cpu_facts()
    count = facts.get("cpu_count")
    return from_facts(facts, CpuFacts(cores=count if isinstance(count, int) else 1))


def recorded(summaries: Iterable[RunSummary], otherwise: CpuFacts) -> CpuFacts:
    """The CPU a study's CPU runs ran on, as their system records say (merged over every node of every such
    run); each fact none recorded `otherwise`'s (this machine's for a study read where it ran)."""
    records = [entry["facts"] for s in summaries if s.device_name == "cpu" and isinstance(s.extra, Mapping)
               for entry in s.extra.get("system") or []
               if isinstance(entry, Mapping) and isinstance(entry.get("facts"), Mapping)]
    return merged(records, otherwise)


def cpu_share(ranks: int, capacity: float) -> float:
    """The fraction of one rank's solo speed each of `ranks` ranks keeps on a machine that runs `capacity`
    ranks at full speed: about 1 below capacity, capacity / ranks well above it, smooth in between (a
    soft minimum: cores share caches and memory bandwidth before they run out; and a calibration needs a
    slope to move the capacity from anywhere)."""
    return (1 + (ranks / capacity) ** 4) ** -0.25


# Of the time a CPU rank's turns add to its work, the share it spends running its own work slower (its
# peers, released together by each collective, share the cores with it) rather than waiting for a peer. A
# fit: three smoke studies' 2-node traces measured 0.43-0.54 (median per study); the evidence and its
# sensitivity are in benchmarks/evidence/README.md, "CPU smoke studies"
CPU_TURNS_SHARED = 0.5
# Of the turns a gloo ring's own ranks take (cpu_turns over the ring's size), the share that lengthens each
# of its steps, per collective: a step waits for its peer to be running. Both are fits to smoke studies'
# 2-node traces: the reduce-scatter's and all-reduce's to seven studies of one machine, the all-gather's
# to seventeen of another (the share whose worse gather is nearest). The evidence, the sensitivity and the
# studies held out are in benchmarks/evidence/README.md, "CPU smoke studies"
CPU_RING_SHARED = {"all_gather": 0.5, "reduce_scatter": 0.25, "all_reduce": 0.25}


def cpu_turns(ranks: int, capacity: float) -> tuple[float, float]:
    """A CPU rank's speed while it runs (the share of one rank's solo speed a machine running no more ranks
    than its capacity keeps: cpu_share), and how much longer its work takes in all: ranks beyond the
    capacity take turns, each waiting for the peers that hold the cores (the trace's `waiting`: a peer not
    yet arrived), so the work of the step's ranks takes their share of the machine (cpu_share of all)."""
    running = cpu_share(min(ranks, capacity), capacity)
    return running, running / cpu_share(ranks, capacity)


def ring_step_factor(kind: str, ranks: int, capacity: float) -> float:
    """How much longer each step of a gloo ring of `kind` over `ranks` ranks takes than a ring the machine
    runs at full speed: the kind's CPU_RING_SHARED of the turns its ranks take (a ring of 4 on 2 cores
    steps slower than one of 2 beside it, whatever else runs: the ring waits on its own peers)."""
    return 1 + CPU_RING_SHARED[kind] * (cpu_turns(ranks, capacity)[1] - 1)


def gloo_ring_steps(c: Collective) -> int:
    """Steps of gloo's ring a collective takes: R-1 for a gather; 2(R-1) for an all-reduce, and for a
    reduce-scatter, which gloo runs as an all-reduce of the whole input (the copy of its input that the
    CPU memory check measured)."""
    return (1 if c.kind == "all_gather" else 2) * (c.ranks - 1)


def capacity(cal: Calibration, cpu: CpuFacts) -> float:
    """Ranks the machine runs at one rank's speed: the calibrated figure, else the cores its ranks can use."""
    return cal.cpu_capacity if cal.cpu_capacity is not None else float(cpu.cores)


def cpu_efficiency(cal: Calibration, dtype: str, cpu: CpuFacts) -> float:
    """The CPU's matmul efficiency at a compute dtype: the calibrated figure (Calibration.calibrated), else
    relative to its fp32 figure (CPU_EFFICIENCY before any run): the same where it has units for the dtype,
    CPU_EMULATED_16BIT of it where it emulates a 16-bit one."""
    found = cal.calibrated(CPU.family, dtype)
    if found is not None:
        return found
    fp32 = cal.matmul_efficiency.get(f"{CPU.family}:fp32", CPU_EFFICIENCY)
    return fp32 if dtype == "fp32" or cpu.runs_natively(dtype) else fp32 * CPU_EMULATED_16BIT


@dataclass(frozen=True)
class CpuModel:
    """A local study's ranks on the CPU cores they share (device.DeviceModel; module docstring)."""

    gpu: GpuSpec  # CPU
    cal: Calibration
    cpu: CpuFacts
    overlaps = False  # gloo's calls block the thread that computes

    @property
    def capacity(self) -> float:
        return capacity(self.cal, self.cpu)

    def turns(self, spec: RunSpec) -> tuple[float, float]:
        return cpu_turns(spec.world_size, self.capacity)

    def efficiency(self, dtype: str) -> float:
        return cpu_efficiency(self.cal, dtype, self.cpu)

    def peaks(self, spec: RunSpec) -> Peaks:
        """Each rank's share of the machine: one core's peak and memory bandwidth at its running speed."""
        running = self.turns(spec)[0]
        peak = self.cpu.peak_flops() * running
        return Peaks(peak, peak, self.gpu.hbm_tbs * running * 1e12)

    def network(self, network: Network) -> Network:
        """gloo's ring on this machine's cores, no probe (the plan's "network:" line says so)."""
        cal = self.cal
        source = cal.source if cal.source != PUBLISHED else "its prior: no traced run calibrated it yet"
        return Network(None, f"gloo on this machine's cores: a ring step {cal.cpu_step_s * 1e3:.3g} ms "
                       f"({source}), slower in a ring of more than the {self.capacity:.3g} ranks the machine "
                       f"runs at full speed, bus bytes at {self.gpu.intra_busbw_gbs:g} GB/s")

    def collective_s(self, c: Collective, units: int) -> float:
        """Its ring's steps, once per FSDP unit, each at the study's ring step slowed by its ranks' turns,
        and its bus bytes at the CPU's loopback bandwidth."""
        bus = bus_factor(c.kind, c.ranks) * c.size / (self.gpu.intra_busbw_gbs * 1e9)
        step = self.cal.cpu_step_s * ring_step_factor(c.kind, c.ranks, self.capacity)
        return units * gloo_ring_steps(c) * step + bus

    def communication(self, spec: RunSpec, arch: ModelArch, network: Network, work: Work) -> Communication:
        """Every collective exposed: gloo's calls block the thread that computes (`overlaps` off; on, a
        pass hides what its compute outlasts but its first gather or last reduction, a sensitivity
        benchmarks/split_model.py prints)."""
        units = len(block_params(arch)) + 1  # each block and the root: what FSDP gathers one at a time
        window = {"forward": work.forward, "backward": work.backward}
        exposed, hidden, total = dict.fromkeys(EXPOSED_PARTS, 0.0), 0.0, 0.0
        for comms, count in step_collectives(spec, arch):
            for phase, budget in window.items():
                times = [(exposed_part(c), self.collective_s(c, units)) for c in comms if c.phase == phase]
                comm = sum(s for _, s in times)
                shown = min(comm, max(0.0, comm - budget) + comm / units) if self.overlaps else comm
                for part, s in times:
                    exposed[part] += count * shown * s / comm if comm else 0.0
                hidden, total = hidden + count * (comm - shown), total + count * comm
        return Communication(exposed, hidden, total, 0.0)

    def host_s(self, spec: RunSpec, arch: ModelArch, recompute: float) -> float:
        """The rank's own host work at its calibrated rate, at its running speed."""
        return block_passes_s(self.cal.cpu_host_s, spec, arch, recompute) / self.turns(spec)[0]

    def parts(self, spec: RunSpec, compute: float, comm: Communication, optimizer: float,
              host: float) -> tuple[dict[str, float], float]:
        """Its work (compute, optimizer, host) and every collective exposed, then the turns: the rest of the
        rank's share, part of it spent running its own work slower beside its peers, the rest waiting
        (cpu_turns). No floor: the host's work is part of the step."""
        turns = self.turns(spec)[1]
        parts = {"compute": compute, **comm.exposed, "optimizer": optimizer}
        work = compute + optimizer + host
        slower = 1 + CPU_TURNS_SHARED * (turns - 1)
        parts = {k: v * slower if k in ("compute", "optimizer") else v for k, v in parts.items()}
        parts |= {"other": host * slower, "waiting": work * (1 - CPU_TURNS_SHARED) * (turns - 1)}
        return parts, 0.0

    def unmodeled(self, spec: RunSpec) -> str | None:
        """Nothing: a CPU study's offload moves nothing across a bus (its host is its device)."""
        return None
