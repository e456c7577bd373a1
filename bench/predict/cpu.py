"""This machine's CPU as the device of a local study: its cores' fp32 peak, which 16-bit dtypes it has
matmul units for, and how ranks that outnumber its cores share them (bench/predict/perf.py predicts with
these; a study's own runs calibrate the efficiencies, bench/predict/calibrate.py)."""
from __future__ import annotations

import functools

from bench.core.hardware import GpuSpec

CPU = GpuSpec("cpu", 0, {"fp32": 0.0}, "this machine's cores", hbm_tbs=0.02, intra_busbw_gbs=2.0,
              family="cpu")
CPU_EFFICIENCY = 0.25  # the prior of a CPU study: its own runs calibrate it (bench/predict/calibrate.py)
# A 16-bit matmul on a CPU without 16-bit units (no avx512_bf16/amx_bf16, avx512_fp16/amx_fp16): a fraction
# of fp32's efficiency: 16-bit tokens/s over fp32's in a one-rank smoke on an AVX2 CPU (docs/prediction.md,
# "CPU studies"). The study's first run of the dtype replaces it; a CPU with the units is taken at its fp32
# figure.
CPU_EMULATED_16BIT = 0.18
NATIVE_16BIT_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def cpu_share(ranks: int, capacity: float) -> float:
    """The fraction of one rank's solo speed each of `ranks` ranks keeps on a machine that runs `capacity`
    ranks at full speed: about 1 below capacity, capacity / ranks well above it, smooth in between (a
    soft minimum: cores share caches and memory bandwidth before they run out; and a calibration needs a
    slope to move the capacity from anywhere)."""
    return (1 + (ranks / capacity) ** 4) ** -0.25


# Of the time a CPU rank's turns add to its work, the share it spends running its own work slower (its
# peers, released together by each collective, share the cores with it) rather than waiting for a peer. A
# fit: three smoke studies' 2-node traces measured 0.43-0.54 (median per study); the evidence and its
# sensitivity are in docs/prediction.md, "The model's split against the measured"
CPU_TURNS_SHARED = 0.5
# Of the turns a gloo ring's own ranks take (cpu_turns over the ring's size), the share that lengthens each
# of its steps, per collective: a step waits for its peer to be running. Both are fits to smoke studies'
# 2-node traces: the reduce-scatter's and all-reduce's to seven studies of one machine, the all-gather's
# to seventeen of another (the share whose worse gather is nearest). The evidence, the sensitivity and the
# studies held out are in docs/prediction.md, "The model's split against the measured"
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


@functools.cache
def _cpuinfo() -> str:
    try:
        return open("/proc/cpuinfo").read()
    except OSError:
        return ""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (/proc/cpuinfo), read once: the calibration's fit asks for every run."""
    lines = _cpuinfo().splitlines()
    return frozenset(next((ln.split(":")[1].split() for ln in lines if ln.startswith("flags")), []))


def cpu_runs_natively(dtype: str) -> bool:
    """Whether this machine's CPU has matmul units for a 16-bit dtype (its flags)."""
    return any(f in cpu_flags() for f in NATIVE_16BIT_FLAGS.get(dtype, ()))


@functools.cache
def cpu_peak_flops() -> float:
    """One core's fp32 peak (each CPU rank runs one thread): SIMD lanes x 2 FMA units x 2 x clock, from
    /proc/cpuinfo; 2 GHz with AVX2 where it cannot be read."""
    lanes = 16 if "avx512f" in cpu_flags() else 8
    mhz = (ln.split(":")[1] for ln in _cpuinfo().splitlines() if ln.startswith("cpu MHz"))
    try:
        ghz = float(next(mhz)) / 1000
    except (StopIteration, ValueError):
        ghz = 2.0
    return lanes * 2 * 2 * ghz * 1e9
