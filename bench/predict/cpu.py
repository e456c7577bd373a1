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
