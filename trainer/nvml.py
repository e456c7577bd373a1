"""A background NVML sampler: per-GPU memory, utilisation, power, temperature and SM clock.

No GPU or no NVML library is a recorded fact (`available=False` with the reason), never a crash. The
thread only reads counters at a low rate; its cost is measured by benchmarks/trainer_overhead.py.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any


def physical_gpu_index(local_index: int, visible: str | None) -> int | str:
    """Map a CUDA ordinal to the NVML index through CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    if not visible:
        return local_index
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if local_index >= len(entries):
        raise ValueError(f"CUDA device {local_index} not in CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[local_index]
    return int(entry) if entry.isdigit() else entry


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
        if local_index is None:
            self.reason = "no GPU"
            return
        try:
            if nvml is None:
                import pynvml as nvml
            self.nvml = nvml
            nvml.nvmlInit()
            self._index = physical_gpu_index(local_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if isinstance(self._index, int):
                self._handle = nvml.nvmlDeviceGetHandleByIndex(self._index)
            else:
                self._handle = nvml.nvmlDeviceGetHandleByUUID(self._index)
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

    def stop(self) -> dict[str, Any]:
        """Stop and return aggregates for the summary, with one last sample taken now, while the run still
        holds its memory: a run of a second or two is otherwise read once or twice, before its peak (read
        below what torch had reserved: benchmarks/evidence/README.md, Headroom)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
            self._run_once()
        if not self.samples:
            return {"nvml_available": self.available, "nvml_reason": self.reason}
        return {"nvml_available": True, "nvml_samples": len(self.samples), **self.limits,
                "nvml_mem_used_gib": max(s["mem_used_gib"] for s in self.samples),
                "nvml_util_pct": sum(s["util_pct"] for s in self.samples) / len(self.samples),
                "nvml_power_w": sum(s["power_w"] for s in self.samples) / len(self.samples)}
