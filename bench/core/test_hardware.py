"""Peak TFLOPS by the device name torch reports: each GPU the studies meet, and no MFU for one it does
not know (a wrong peak would make every MFU wrong)."""
from __future__ import annotations

import pytest

from bench.core.hardware import gpu_spec, peak_tflops


@pytest.mark.parametrize("device_name,table,bf16", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM", 989.4),     # p5.48xlarge
    ("NVIDIA H100 PCIe", "H100-PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100-NVL", 835.5),           # not the SXM part despite "H100"
    ("NVIDIA H200", "H200", 989.4),                   # p5e / p5en
    ("NVIDIA GH200 480GB", "H200", 989.4),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", 312),  # p4d
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", 312),  # p4de
    ("NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB", 312),  # PCIe A100: the datasheet's peaks are the SXM ones
    ("NVIDIA A100 80GB PCIe", "A100-SXM4-80GB", 312),
    ("NVIDIA B200", "B200", 2250),
    ("NVIDIA A10G", "A10G", 70),
    ("NVIDIA L4", "L4", 121),
])
def test_device_names_map_to_their_datasheet_peaks(device_name: str, table: str, bf16: float) -> None:
    assert gpu_spec(device_name).name == table
    assert peak_tflops(device_name, "bf16_mixed") == bf16


@pytest.mark.parametrize("device_name", ["NVIDIA L40S", "NVIDIA GeForce RTX 4090", "Tesla T4", "cpu"])
def test_an_unknown_gpu_gets_no_peak(device_name: str) -> None:
    assert gpu_spec(device_name) is None and peak_tflops(device_name, "bf16_mixed") is None


def test_precision_picks_the_compute_dtype_peak() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 66.9
    assert (peak_tflops("NVIDIA H100 80GB HBM3", "fp16_mixed") == 989.4
            == peak_tflops("NVIDIA H100 80GB HBM3", "bf16_pure"))


def test_fp8_is_offered_where_the_datasheet_lists_it() -> None:
    from bench.core.hardware import GPUS, supports_fp8
    assert [g for g in GPUS if supports_fp8(g)] == ["H100-SXM", "H100-PCIe", "H100-NVL", "H200", "L4", "B200"]
    assert not supports_fp8("A100-SXM4-80GB") and not supports_fp8("A10G") and not supports_fp8("nope")
    for g in GPUS.values():  # dense FP8 is twice dense BF16 on every one of them
        assert ("fp8" not in g.peak_tflops
                or g.peak_tflops["fp8"] == pytest.approx(2 * g.peak_tflops["bf16"], rel=5e-3))
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp8_tensorwise") == 989.4  # MFU of Float8 runs: BF16 peak
