"""The one place a prediction's device is chosen (device.DeviceModel): a GPU, the device users rent
(bench/predict/gpu.py), or the CPU cores a local study's ranks share, the project's test bench
(bench/predict/cpu.py). perf.py's step runs on either and names neither."""
from __future__ import annotations

from bench.core.hardware import GpuSpec, gpu_spec
from bench.predict.cpu import CPU, CpuFacts, CpuModel
from bench.predict.device import Calibration, DeviceModel
from bench.predict.gpu import GpuModel


def device_model(gpu: GpuSpec, cal: Calibration, cpu: CpuFacts | None = None) -> DeviceModel:
    """A GPU's model, or the CPU cores' (cpu.CPU), whose priors read `cpu`: the CPU the study's runs recorded,
    else this machine's (perf.Predictor passes it; a caller with no study passes cpu.this_cpu())."""
    if gpu.family != CPU.family:
        return GpuModel(gpu, cal)
    if cpu is None:
        raise ValueError("a prediction on CPU cores needs the CPU's facts (cpu.CpuFacts: the study's "
                         "recorded ones, or cpu.this_cpu())")
    return CpuModel(gpu, cal, cpu)


def local_device(gpus: list[str], name: str | None, world_size: int) -> GpuSpec:
    """A run on this machine: its GPU where the run fits on the machine's GPUs, else its CPU cores."""
    return gpu_spec(name or "") if gpus and world_size <= len(gpus) else CPU

