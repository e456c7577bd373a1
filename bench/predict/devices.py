"""The one place a prediction's device is chosen (device.DeviceModel): a GPU, the device users rent
(bench/predict/gpu.py), or the CPU cores a local study's ranks share, the project's test bench
(bench/predict/cpu.py). perf.py's step runs on either and names neither: where a run runs on this machine,
it is handed a `LocalMachine`, which knows what the machine is."""
from __future__ import annotations

from bench.core.hardware import GpuSpec, gpu_spec
from bench.predict.cpu import CPU, CpuFacts, CpuModel, this_cpu
from bench.predict.device import Calibration, DeviceModel
from bench.predict.gpu import GpuModel


class LocalMachine:
    """This machine as a study's local runs ran on it: its GPUs, which a run uses where it fits on them, else
    its CPU cores at the CPU the runs recorded (`recorded`: cpu.recorded; None, a plan's new runs: this
    machine's). Each is read when first asked, once."""

    def __init__(self, recorded: CpuFacts | None = None) -> None:
        self._cpu = recorded
        self._gpus: tuple[list[str], str | None] | None = None

    @property
    def cpu(self) -> CpuFacts:
        if self._cpu is None:
            self._cpu = this_cpu()
        return self._cpu

    def device(self, world_size: int) -> GpuSpec:
        """The device a run of `world_size` ranks runs on here."""
        if self._gpus is None:
            from bench.core.gpus import local_gpu_name, local_gpus
            self._gpus = (local_gpus(), local_gpu_name())
        return local_device(*self._gpus, world_size)


def device_model(gpu: GpuSpec, cal: Calibration, local: LocalMachine | None = None) -> DeviceModel:
    """A GPU's model, or the CPU cores' (cpu.CPU) of the machine `local`, whose priors read its CPU."""
    if gpu.family != CPU.family:
        return GpuModel(gpu, cal)
    if local is None:
        raise ValueError("a prediction on CPU cores needs the machine they are on (devices.LocalMachine: "
                         "at the CPU its runs recorded, or this machine's)")
    return CpuModel(gpu, cal, local.cpu)


def local_device(gpus: list[str], name: str | None, world_size: int) -> GpuSpec:
    """A run on this machine: its GPU where the run fits on the machine's GPUs, else its CPU cores."""
    return gpu_spec(name or "") if gpus and world_size <= len(gpus) else CPU
