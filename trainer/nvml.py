"""A background NVML sampler: per-GPU memory, utilisation, power, temperature and SM clock; the GPU's
energy over the timed steps. It opens its GPU as the node's system record reads it
(bench/core/system.py open_gpu: CUDA's ordinal through CUDA_VISIBLE_DEVICES to NVML's device).

No GPU or no NVML library is a recorded fact (`available=False` with the reason), never a crash. The
thread only reads counters at a low rate; its cost is measured by benchmarks/trainer_overhead.py.

Energy: NVML's nvmlDeviceGetTotalEnergyConsumption is the board's energy in millijoules since the driver
was last loaded (Volta and newer); the worker reads it at the first timed step's start and after the last
one's sync (`mark`), and the difference is the GPU's joules over the timed steps. Where the counter is
missing (an older GPU, a driver that refuses it) the power samples are integrated over the same window
instead, and the summary says so.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bench.core.system import open_gpu, physical_gpu_index  # noqa: F401 - the GPU path the sampler reads by


class NvmlSampler:
    """Samples one GPU every `interval_s` seconds on a daemon thread and hands each sample to `emit`."""

    def __init__(self, local_index: int | None, interval_s: float, emit: Callable[[dict[str, Any]], None],
                 nvml: Any = None) -> None:
        self.interval_s = interval_s
        self.emit = emit
        self.samples: list[dict[str, Any]] = []
        self.available = False
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        self._index: int | str | None = None
        self.limits: dict[str, float] = {}
        self.marks: list[dict[str, Any]] = []  # the timed steps' window: its start and its end (mark)
        if local_index is None:
            self.reason = "no GPU"
            return
        try:
            self.nvml, self._handle, self._index = open_gpu(local_index, nvml)
            self.limits = self._limits()
            self.available = True
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, driver mismatch ...
            self.reason = f"{type(e).__name__}: {e}"

    def _limits(self) -> dict[str, float]:
        """What the GPU allows (its memory, the power limit the driver enforces): the ceilings a reading is
        checked against (bench/gpucheck/check.py)."""
        n, h = self.nvml, self._handle
        return {"nvml_mem_total_gib": n.nvmlDeviceGetMemoryInfo(h).total / 2**30,
                "nvml_power_limit_w": n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}

    def sample(self) -> dict[str, Any]:
        n, h = self.nvml, self._handle
        mem = n.nvmlDeviceGetMemoryInfo(h)
        util = n.nvmlDeviceGetUtilizationRates(h)
        return {"t": time.time(), "gpu": self._index, "mem_used_gib": mem.used / 2**30,
                "util_pct": util.gpu, "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temp_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)}

    def _run_once(self) -> bool:
        """One sample, kept and emitted; False once sampling has failed (the reason kept)."""
        if self.reason is not None:
            return False
        try:
            s = self.sample()
        except Exception as e:
            self.reason = f"sampling stopped: {type(e).__name__}: {e}"
            return False
        self.samples.append(s)
        self.emit(s)
        return True

    def _run(self) -> None:
        while not self._stop.is_set() and self._run_once():
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        if self.available:
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()

    def mark(self) -> None:
        """One end of the timed steps' window (call after the device sync that ends or precedes a step):
        the time and NVML's energy counter in millijoules, or why the counter could not be read."""
        if not self.available:
            return
        mark: dict[str, Any] = {"t": time.time()}
        try:
            mark["mj"] = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except Exception as e:  # NVMLError_NotSupported before Volta, or a driver that refuses it
            mark["error"] = f"{type(e).__name__}: {e}"
        self.marks.append(mark)

    def energy(self) -> dict[str, Any]:
        """The GPU's joules over the window the first and last mark bound: the counter's difference, else
        the power samples integrated over it; or why there is no figure."""
        if not self.available:
            return {"nvml_energy_note": f"not measured: {self.reason}"}
        if len(self.marks) < 2:
            return {"nvml_energy_note": "not measured: the timed steps were not marked"}
        start, end = self.marks[0], self.marks[-1]
        window = end["t"] - start["t"]
        out: dict[str, Any] = {"nvml_energy_window_s": window}
        if "mj" in start and "mj" in end:
            joules = (end["mj"] - start["mj"]) / 1000.0
            if joules > 0:
                return {**out, "nvml_energy_j": joules, "nvml_energy_source": "NVML energy counter"}
            return {**out, "nvml_energy_note": f"not measured: NVML's energy counter did not advance over "
                                               f"the {window:.3f} s timed window (shorter than its update "
                                               "period)"}
        why = start.get("error") or end.get("error")
        joules = integrate_power([(s["t"], s["power_w"]) for s in self.samples], start["t"], end["t"])
        if joules is None:
            return {**out, "nvml_energy_note": f"not measured: no energy counter ({why}) and no power sample"}
        return {**out, "nvml_energy_j": joules,
                "nvml_energy_source": f"NVML power samples, integrated (no energy counter: {why})"}

    def stop(self) -> dict[str, Any]:
        """Stop and return aggregates for the summary, with one last sample taken now, while the run still
        holds its memory: a run of a second or two is otherwise read once or twice, before its peak (read
        below what torch had reserved: benchmarks/evidence/README.md, "Headroom")."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
            self._run_once()
        if not self.samples:
            return {"nvml_available": self.available, "nvml_reason": self.reason, **self.energy()}
        return {"nvml_available": True, "nvml_samples": len(self.samples), **self.limits,
                "nvml_mem_used_gib": max(s["mem_used_gib"] for s in self.samples),
                "nvml_util_pct": sum(s["util_pct"] for s in self.samples) / len(self.samples),
                "nvml_power_w": sum(s["power_w"] for s in self.samples) / len(self.samples), **self.energy()}


def integrate_power(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Joules from power samples (time, watts) over [t0, t1]: the power linear between samples and held at
    the nearest one beyond them (a window inside one sampling interval takes the samples around it); None
    without a sample."""
    points = sorted(samples)
    if not points or t1 <= t0:
        return None

    def power(t: float) -> float:
        if t <= points[0][0]:
            return points[0][1]
        if t >= points[-1][0]:
            return points[-1][1]
        i = next(k for k in range(1, len(points)) if points[k][0] >= t)
        (ta, pa), (tb, pb) = points[i - 1], points[i]
        return pa + (pb - pa) * (t - ta) / (tb - ta) if tb > ta else pb
    edges = [t0, *(t for t, _ in points if t0 < t < t1), t1]
    return sum((b - a) * (power(a) + power(b)) / 2 for a, b in zip(edges, edges[1:]))


def run_energy(per_rank: list[dict[str, Any]], tokens: float) -> dict[str, Any]:
    """The run's GPU energy per token trained over the timed steps: every rank's joules (one GPU each)
    over the tokens the whole run trained in them; not measured, with why, unless every rank has a
    figure (a run on CPU: no GPU)."""
    joules = [r.get("nvml_energy_j") for r in per_rank]
    if tokens <= 0 or not joules or any(j is None for j in joules):
        notes = sorted({str(r.get("nvml_energy_note") or "no figure") for r in per_rank
                        if r.get("nvml_energy_j") is None})
        return {"energy_j_per_token": None,
                "energy_source": "; ".join(notes) or "not measured: no timed tokens"}
    sources = sorted({str(r.get("nvml_energy_source")) for r in per_rank})
    return {"energy_j_per_token": sum(joules) / tokens, "energy_source": "; ".join(sources)}
