"""Dense peak throughput, memory and EFA adapters of the hardware the harness knows, with sources.

Peaks are dense (no 2:4 sparsity), per GPU. MFU divides achieved model FLOPs by these, so a wrong
entry makes every MFU wrong: each row names the document it came from.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    peak_tflops: dict[str, float]  # by compute dtype: "bf16", "fp16", "tf32", "fp32"; "fp8" where it has FP8
    source: str
    hbm_tbs: float = 0.0  # memory bandwidth, TB/s (same datasheet)
    intra_busbw_gbs: float = 0.0  # all-reduce bus bandwidth among a node's GPUs (nccl-tests), GB/s
    family: str = ""  # which calibration of the performance model (bench/predict/perf.py) applies
    compute_capability: int = 0  # CUDA compute capability x 10 (80 A100, 90 H100): NCCL's tuning reads it


GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    GpuSpec("A100-SXM4-40GB", 40, {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
            "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column, dense",
            hbm_tbs=1.555, intra_busbw_gbs=240, family="A100", compute_capability=80),
    GpuSpec("A100-SXM4-80GB", 80, {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
            "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column, dense",
            hbm_tbs=2.039, intra_busbw_gbs=240, family="A100", compute_capability=80),
    GpuSpec("H100-SXM", 80, {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
            "NVIDIA H100 Tensor Core GPU datasheet, SXM column; sparse figures halved",
            hbm_tbs=3.35, intra_busbw_gbs=468, family="H100", compute_capability=90),
    GpuSpec("H100-PCIe", 80, {"fp8": 1513, "bf16": 756.5, "fp16": 756.5, "tf32": 378, "fp32": 51.2},
            "NVIDIA H100 Tensor Core GPU datasheet, PCIe column; sparse figures halved",
            hbm_tbs=2.0, intra_busbw_gbs=25, family="H100", compute_capability=90),
    GpuSpec("H100-NVL", 94, {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60},
            "NVIDIA H100 Tensor Core GPU datasheet, NVL column; sparse figures halved",
            hbm_tbs=3.9, intra_busbw_gbs=25, family="H100", compute_capability=90),
    GpuSpec("H200", 141, {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
            "NVIDIA H200 Tensor Core GPU datasheet, SXM column; sparse figures halved",
            hbm_tbs=4.8, intra_busbw_gbs=468, family="H100", compute_capability=90),
    GpuSpec("A10G", 24, {"bf16": 70, "fp16": 70, "tf32": 35, "fp32": 31.2},
            "AWS EC2 G5 documentation (A10G: 70 dense FP16/BF16 tensor TFLOPS, 31.2 FP32)",
            hbm_tbs=0.6, intra_busbw_gbs=12, family="A100", compute_capability=86),
    GpuSpec("L4", 24, {"fp8": 242.5, "bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3},
            "NVIDIA L4 Tensor Core GPU datasheet; sparse figures halved",
            hbm_tbs=0.3, intra_busbw_gbs=12, family="A100", compute_capability=89),
    GpuSpec("B200", 180, {"fp8": 4500, "bf16": 2250, "fp16": 2250, "tf32": 1100, "fp32": 75},
            "NVIDIA HGX B200 datasheet, per GPU; sparse figures halved",
            hbm_tbs=8.0, intra_busbw_gbs=936, family="H100", compute_capability=100),
]}

# intra_busbw_gbs: H100-SXM/H200 (NVLink 4 with NVLink SHARP): 468 GB/s, nccl-tests all_reduce_perf at 2 GiB
# on one p5.48xlarge (8 ranks; aws-samples/aws-do-eks nccl-test README). A100 SXM (NVLink 3, 300 GB/s per
# direction per the datasheet): 240, about 80% of it, the fraction NCCL's ring reaches without NVLink SHARP
# (an assumption; no 8-GPU A100 output is among the reference data). B200 (NVLink 5, twice NVLink 4): 936.
# PCIe parts (H100 PCIe/NVL pairs, A10G, L4): PCIe Gen4/5 x16 rings, 12-25 GB/s (assumption).
# compute_capability: CUDA's table of GPUs (developer.nvidia.com/cuda-gpus), which NCCL's tuning tables are
# indexed by.
# family: the calibration of bench/predict/perf.py that applies (A10G and L4 borrow A100's, B200 H100's: both
# uncalibrated).

# torch.cuda.get_device_name() patterns -> table key; first match wins, so order matters. Whole words:
# "L4" is not "L40S", "H100" is not "H100 NVL". PCIe A100s have the SXM peaks and memory (datasheet).
_NAME_PATTERNS: list[tuple[re.Pattern[str], str]] = [(re.compile(p), key) for p, key in [
    (r"\bH100 NVL\b", "H100-NVL"), (r"\bH100 PCIe\b", "H100-PCIe"), (r"\bH100\b", "H100-SXM"),
    (r"\bG?H200\b", "H200"), (r"\bA100\b.*\b40GB\b", "A100-SXM4-40GB"), (r"\bA100\b", "A100-SXM4-80GB"),
    (r"\bA10G\b", "A10G"), (r"\bL4\b", "L4"), (r"\bB200\b", "B200"),
]]


def gpu_spec(device_name: str) -> GpuSpec | None:
    """Map a CUDA device name (e.g. 'NVIDIA H100 80GB HBM3') to its spec; None if unknown (no MFU then)."""
    if device_name in GPUS:
        return GPUS[device_name]
    for pattern, key in _NAME_PATTERNS:
        if pattern.search(device_name):
            return GPUS[key]
    return None


def compute_dtype(precision: str) -> str:
    """The peak a precision's MFU divides by (fp32 uses plain FP32 peaks). Float8 training keeps the BF16
    peak: its attention and non-converted matmuls run in BF16, and one denominator across precisions
    lets MFU compare them (the FP8 peak, twice as large, is a different question)."""
    return {"fp32": "fp32", "bf16_mixed": "bf16", "bf16_pure": "bf16", "fp16_mixed": "fp16",
            "fp8_tensorwise": "bf16"}[precision]


def supports_fp8(gpu: str) -> bool:
    """FP8 tensor cores (Hopper, Ada, Blackwell): the GPU's datasheet lists an FP8 peak."""
    return gpu in GPUS and "fp8" in GPUS[gpu].peak_tflops


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOPS per GPU for the run's compute dtype; None for CPUs and unknown GPUs."""
    spec = gpu_spec(device_name)
    return spec.peak_tflops[compute_dtype(precision)] if spec else None


@dataclass(frozen=True)
class InstanceSpec:
    name: str
    gpu: str | None
    gpus: int
    efa: int
    network_gbps: int
    source: str


INSTANCES: dict[str, InstanceSpec] = {i.name: i for i in [
    InstanceSpec("p4d.24xlarge", "A100-SXM4-40GB", 8, 4, 400, "AWS EC2 P4 instance page"),
    InstanceSpec("p4de.24xlarge", "A100-SXM4-80GB", 8, 4, 400, "AWS EC2 P4 instance page"),
    InstanceSpec("p5.48xlarge", "H100-SXM", 8, 32, 3200, "AWS EC2 P5 instance page"),
    InstanceSpec("p5e.48xlarge", "H200", 8, 32, 3200, "AWS EC2 P5 instance page"),
    InstanceSpec("p5en.48xlarge", "H200", 8, 16, 3200, "AWS EC2 P5 instance page (EFAv3)"),
    InstanceSpec("g5.48xlarge", "A10G", 8, 1, 100, "AWS EC2 G5 instance page"),
    InstanceSpec("local", None, 0, 0, 0, "this machine"),
]}
