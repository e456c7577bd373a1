"""NVML sampling where no GPU is: CUDA ordinals mapped to NVML devices through CUDA_VISIBLE_DEVICES (indices
and UUIDs, as the local launcher and Kubernetes' device plugin set it), the GPU's facts for the system
record and its energy over the timed steps, against a fake pynvml with the real call names and units
(bytes, milliwatts, millijoules since the driver loaded, CUDA's version code 1000 x major + 10 x minor)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from bench.core.system import GPU_FACTS, gpu_facts
from trainer.nvml import NvmlSampler, integrate_power, physical_gpu_index, run_energy


class NVMLError_NotSupported(Exception):  # noqa: N801 - pynvml's own name for NVML_ERROR_NOT_SUPPORTED
    pass


class FakeNvml:
    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1

    def __init__(self) -> None:
        self.opened: list[tuple[str, object]] = []
        self.energy_mj: list[int] = []  # what each call of the energy counter returns, in turn

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

    def nvmlDeviceGetName(self, h) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetCount(self) -> int:
        return 8

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"  # bytes from older pynvml releases

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040  # as NCCL prints it too ("cudaDriverVersion 12040")

    def nvmlDeviceGetMaxClockInfo(self, h, clock) -> int:
        return 1980

    def nvmlDeviceGetVbiosVersion(self, h) -> str:
        return "96.00.74.00.0D"

    def nvmlDeviceGetEccMode(self, h) -> list[int]:
        return [1, 1]  # current, pending

    def nvmlDeviceGetMigMode(self, h) -> list[int]:
        raise NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetTotalEnergyConsumption(self, h) -> int:
        if not self.energy_mj:
            raise NVMLError_NotSupported("Not Supported")  # before Volta
        return self.energy_mj.pop(0)


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
                              "nvml_reason": "OSError: NVML Shared Library Not Found",
                              "nvml_energy_note": "not measured: OSError: NVML Shared Library Not Found"}


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
                                  "nvml_reason": "sampling stopped: RuntimeError: GPU is lost",
                                  "nvml_energy_note": "not measured: the timed steps were not marked"}


def test_the_gpus_facts_are_read_in_their_units_and_a_refused_query_is_missing(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    nvml = FakeNvml()
    facts = gpu_facts(1, nvml)
    assert nvml.opened == [("index", 5)]  # the sampler's path: CUDA ordinal 1 is NVML device 5
    assert facts == {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "gpu_driver": "550.54.15",
                     "cuda_driver": "12.4", "gpu_memory_gib": 80.0, "gpu_power_limit_w": 700.0,
                     "gpu_sm_clock_max_mhz": 1980, "gpu_vbios": "96.00.74.00.0D", "gpu_ecc": "on",
                     "gpu_mig": {"missing": "NVML: NVMLError_NotSupported: Not Supported"}}
    broken = FakeNvml()
    broken.nvmlInit = lambda: (_ for _ in ()).throw(OSError("NVML Shared Library Not Found"))
    assert gpu_facts(0, broken) == dict.fromkeys(
        GPU_FACTS, {"missing": "NVML: OSError: NVML Shared Library Not Found"})


def test_energy_over_the_timed_steps_from_the_counter_in_millijoules(monkeypatch) -> None:
    nvml = FakeNvml()
    nvml.energy_mj = [5_000_000_000, 5_000_650_000]  # 650 J between the marks
    clock = iter([100.0, 101.0])
    monkeypatch.setattr("trainer.nvml.time.time", lambda: next(clock))
    sampler = NvmlSampler(0, 3600.0, print, nvml=nvml)
    sampler.mark()
    sampler.mark()
    assert sampler.energy() == {"nvml_energy_window_s": 1.0, "nvml_energy_j": 650.0,
                                "nvml_energy_source": "NVML energy counter"}


def test_a_counter_that_did_not_move_is_no_figure_with_why(monkeypatch) -> None:
    nvml = FakeNvml()
    nvml.energy_mj = [7_000, 7_000]
    clock = iter([100.0, 100.04])
    monkeypatch.setattr("trainer.nvml.time.time", lambda: next(clock))
    sampler = NvmlSampler(0, 3600.0, print, nvml=nvml)
    sampler.mark()
    sampler.mark()
    energy = sampler.energy()
    assert "nvml_energy_j" not in energy and "did not advance over the 0.040 s" in energy["nvml_energy_note"]


def test_without_a_counter_the_power_samples_are_integrated_and_it_says_so(monkeypatch) -> None:
    nvml = FakeNvml()  # no energy counter: NVMLError_NotSupported, as before Volta
    clock = iter([10.0, 12.0])
    monkeypatch.setattr("trainer.nvml.time.time", lambda: next(clock))
    sampler = NvmlSampler(0, 3600.0, print, nvml=nvml)
    sampler.samples = [{"t": 9.5, "power_w": 300.0}, {"t": 11.0, "power_w": 600.0},
                       {"t": 12.5, "power_w": 600.0}]
    sampler.mark()
    sampler.mark()
    energy = sampler.energy()
    # 10 -> 11 s: 400 W rising to 600 W (the line from 9.5 s), 11 -> 12 s: 600 W: 500 + 600 J
    assert energy["nvml_energy_j"] == pytest.approx(1100.0)
    assert energy["nvml_energy_source"] == ("NVML power samples, integrated (no energy counter: "
                                            "NVMLError_NotSupported: Not Supported)")


def test_power_integration_is_exact_on_lines_and_holds_the_ends() -> None:
    assert integrate_power([(0.0, 100.0), (10.0, 200.0)], 0.0, 10.0) == pytest.approx(1500.0)
    assert integrate_power([(5.0, 300.0)], 4.0, 6.0) == pytest.approx(600.0)  # one sample: held
    assert integrate_power([], 0.0, 1.0) is None


def test_the_runs_energy_per_token_is_every_gpus_joules_over_its_tokens() -> None:
    ranks = [{"nvml_energy_j": 650.0, "nvml_energy_source": "NVML energy counter"},
             {"nvml_energy_j": 610.0, "nvml_energy_source": "NVML energy counter"}]
    assert run_energy(ranks, 4096 * 10) == {"energy_j_per_token": pytest.approx(1260.0 / 40960),
                                            "energy_source": "NVML energy counter"}
    cpu = [{"nvml_energy_note": "not measured: no GPU"}] * 2
    assert run_energy(cpu, 4096) == {"energy_j_per_token": None, "energy_source": "not measured: no GPU"}
    one_short = [ranks[0], {"nvml_energy_note": "not measured: the timed steps were not marked"}]
    assert run_energy(one_short, 4096)["energy_j_per_token"] is None  # a part of the GPUs is no figure


def test_a_cpu_sampler_says_energy_was_not_measured_because_there_is_no_gpu() -> None:
    sampler = NvmlSampler(None, 1, print)
    sampler.mark()
    sampler.mark()
    assert sampler.stop()["nvml_energy_note"] == "not measured: no GPU"
