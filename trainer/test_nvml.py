"""NVML sampling where no GPU is: CUDA ordinals mapped to NVML devices through CUDA_VISIBLE_DEVICES (indices
and UUIDs, as the local launcher and Kubernetes' device plugin set it), against a fake pynvml with the
real call names and units (bytes, milliwatts)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from trainer.nvml import NvmlSampler, physical_gpu_index


class FakeNvml:
    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1

    def __init__(self) -> None:
        self.opened: list[tuple[str, object]] = []

    def nvmlInit(self) -> None: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.opened.append(("index", index))
        return f"h{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.opened.append(("uuid", uuid))
        return uuid

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=30 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetPowerUsage(self, h) -> int:
        return 650_000  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, h) -> int:
        return 700_000  # milliwatts

    def nvmlDeviceGetTemperature(self, h, sensor) -> int:
        return 61

    def nvmlDeviceGetClockInfo(self, h, clock) -> int:
        return 1980


@pytest.mark.parametrize("visible,local,want", [
    (None, 1, 1), ("", 0, 0), ("4,5,6,7", 2, 6),
    ("GPU-1f2e3d4c-0000-1111-2222-333344445556,GPU-aa", 0, "GPU-1f2e3d4c-0000-1111-2222-333344445556"),
])
def test_cuda_ordinals_map_to_nvml_devices(visible, local, want) -> None:
    assert physical_gpu_index(local, visible) == want


def test_an_ordinal_outside_the_visible_devices_is_an_error() -> None:
    with pytest.raises(ValueError, match="not in CUDA_VISIBLE_DEVICES"):
        physical_gpu_index(2, "0,1")


@pytest.mark.parametrize("visible,opened", [("2,3", ("index", 3)), ("GPU-x,GPU-y", ("uuid", "GPU-y"))])
def test_the_sampler_reads_the_gpu_this_rank_uses(monkeypatch, visible: str, opened) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml, seen = FakeNvml(), []
    sampler = NvmlSampler(1, 0.01, seen.append, nvml=nvml)
    assert sampler.available and nvml.opened == [opened]
    sampler.start()
    time.sleep(0.1)
    agg = sampler.stop()
    assert seen and seen[0]["mem_used_gib"] == 30 and seen[0]["power_w"] == 650.0
    assert agg["nvml_mem_used_gib"] == 30 and agg["nvml_util_pct"] == 97 and agg["nvml_power_w"] == 650.0
    assert agg["nvml_mem_total_gib"] == 80 and agg["nvml_power_limit_w"] == 700.0  # the ceilings, in units


def test_no_gpu_or_no_library_is_a_recorded_reason() -> None:
    assert NvmlSampler(None, 1, print).reason == "no GPU"
    broken = FakeNvml()
    broken.nvmlInit = lambda: (_ for _ in ()).throw(OSError("NVML Shared Library Not Found"))
    sampler = NvmlSampler(0, 1, print, nvml=broken)
    assert not sampler.available and sampler.reason == "OSError: NVML Shared Library Not Found"
    assert sampler.stop() == {"nvml_available": False,
                              "nvml_reason": "OSError: NVML Shared Library Not Found"}


def test_the_last_reading_is_taken_at_stop_while_the_run_holds_its_memory() -> None:
    """A run shorter than the interval is read once at its start, before its peak: stop() reads again."""
    nvml, seen = FakeNvml(), []
    sampler = NvmlSampler(0, 3600.0, seen.append, nvml=nvml)
    sampler.start()
    while not seen:
        time.sleep(0.01)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=70 * 2**30, total=80 * 2**30)
    agg = sampler.stop()
    assert [s["mem_used_gib"] for s in seen] == [30, 70] and agg["nvml_mem_used_gib"] == 70
    assert agg["nvml_samples"] == 2


def test_a_sampler_that_failed_reads_nothing_more_at_stop() -> None:
    nvml, seen = FakeNvml(), []
    sampler = NvmlSampler(0, 0.01, seen.append, nvml=nvml)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: (_ for _ in ()).throw(RuntimeError("GPU is lost"))
    sampler.start()
    agg = sampler.stop()
    assert seen == [] and agg == {"nvml_available": True,
                                  "nvml_reason": "sampling stopped: RuntimeError: GPU is lost"}
