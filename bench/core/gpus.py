"""The GPUs of this machine, for the local launcher, without importing torch (bench/ never does).

CUDA_VISIBLE_DEVICES, when set, is what the sweep may use (indices or UUIDs; empty: none). Otherwise
`nvidia-smi -L` lists the devices ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"); no nvidia-smi, or
one that fails (no driver), means no GPU.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping

_GPU_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: (\S+)\))?$")


def parse_nvidia_smi_list(text: str) -> list[tuple[str, str]]:
    """(index, name) of each GPU line of `nvidia-smi -L`; MIG lines (indented) belong to their GPU."""
    return [(m.group(1), m.group(2)) for line in text.splitlines() if (m := _GPU_LINE.match(line.rstrip()))]


def _nvidia_smi(args: list[str], env: Mapping[str, str]) -> str | None:
    """nvidia-smi's output; None where there is none, or it fails (no driver)."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return None
    try:
        proc = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _nvidia_smi_list(env: Mapping[str, str]) -> list[tuple[str, str]]:
    return parse_nvidia_smi_list(_nvidia_smi(["-L"], env) or "")


def local_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """Device ids (as CUDA_VISIBLE_DEVICES takes them) the sweep may give its runs on this machine."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return [index for index, _ in _nvidia_smi_list(env)]


def local_gpu_name(env: Mapping[str, str] | None = None) -> str | None:
    """The name nvidia-smi gives this machine's first GPU (e.g. 'NVIDIA H100 80GB HBM3'); None without one."""
    listed = _nvidia_smi_list(os.environ if env is None else env)
    return listed[0][1] if listed else None


def agent_devices(world_size: int, nodes: int, gpus: list[str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES of each simulated node (torchrun agent): its own GPUs, disjoint from the other
    agents' (local ranks 0..g-1 then map to distinct devices); None when the run needs more GPUs than
    there are."""
    if not gpus or world_size > len(gpus):
        return None
    per_node = world_size // nodes
    return [",".join(gpus[k * per_node:(k + 1) * per_node]) for k in range(nodes)]


def local_gpu_memory_gib(env: Mapping[str, str] | None = None) -> float | None:
    """The first GPU's memory as the driver reports it (`nvidia-smi --query-gpu=memory.total`, MiB): what
    a run may really use (81559 MiB on an 'H100 80GB', not the datasheet's 80 GB); None without one."""
    text = _nvidia_smi(["--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                       os.environ if env is None else env)
    try:
        return float(text.split()[0]) / 1024 if text else None
    except (ValueError, IndexError):
        return None
