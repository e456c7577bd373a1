"""`python -m trainer.preflight`: one node's facts and its speed alone, before a study spends its reservation.

Started once per node by bench.preflight through the study's own launcher (torchrun, one process per GPU;
one on a CPU node), it answers one `preflight` record per process: where it runs (the scheduler's node
name), what it runs with (torch, CUDA, NCCL, the aws-ofi-nccl plugin and whether it loads, libfabric's EFA
adapters, the GPU's model, driver, ECC errors, clocks, throttle reasons and power limit from NVML), the free
space where results are written, and a fixed local workload timed with no communication: a matmul at the
study's dtype and a memory copy, sustained over a few seconds.
Comparing nodes is the orchestrator's: this command knows one node.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.core.warm import run_warm

if __name__ == "__main__":
    run_warm("trainer.preflight")  # in a warm process, where its environment names one (bench/core/warm.py)

import torch  # noqa: E402

from bench.core.records import error_line, format_record, node_name  # noqa: E402
from bench.core.schema import add_fault_arguments, add_spec_arguments, spec_from_namespace  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16_mixed": torch.bfloat16, "fp16_mixed": torch.float16,
          "bf16_pure": torch.bfloat16, "fp8_tensorwise": torch.bfloat16}
# Where the aws-ofi-nccl plugin lives on AWS's images (DLAMI, the EKS and ParallelCluster AMIs), beside
# whatever LD_LIBRARY_PATH names.
PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib", "/usr/local/lib")


def ofi_plugin() -> dict[str, Any]:
    """The aws-ofi-nccl plugin NCCL would load (libnccl-net*.so), and whether it loads here."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(PLUGIN_DIRS)
    found = sorted({p for d in dirs for p in glob.glob(os.path.join(d, "libnccl-net*.so"))})
    if not found:
        return {"ofi_plugin": None}
    try:
        ctypes.CDLL(found[0])
        return {"ofi_plugin": found[0], "ofi_plugin_loads": True}
    except OSError as e:
        return {"ofi_plugin": found[0], "ofi_plugin_loads": False, "ofi_plugin_error": str(e)[:200]}


def efa_adapters() -> dict[str, Any]:
    """EFA adapters as libfabric sees them (`fi_info -p efa -t FI_EP_RDM`, AWS's own check), and its
    version; none where libfabric is not installed."""
    if not shutil.which("fi_info"):
        return {"efa_adapters": 0, "libfabric": None}
    out = subprocess.run(["fi_info", "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True, text=True,
                         timeout=30, check=False)  # no EFA provider: an error, and no domains
    domains = {line.split(":", 1)[1].strip() for line in out.stdout.splitlines()
               if line.strip().startswith("domain:")}
    version = subprocess.run(["fi_info", "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    words = version.split()  # "fi_info: 1.22.0amzn1.0" and more lines
    return {"efa_adapters": len(domains), "libfabric": words[1] if len(words) > 1 else None}


def gpu_facts(local_rank: int) -> dict[str, Any]:
    """This process's GPU as NVML reports it (nothing where there is no GPU or no NVML)."""
    if not torch.cuda.is_available():
        return {}
    facts: dict[str, Any] = {"gpu": torch.cuda.get_device_name(local_rank), "gpus": torch.cuda.device_count(),
                             "cuda": torch.version.cuda,
                             "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    try:
        import pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(local_rank)
        facts.update(driver=n.nvmlSystemGetDriverVersion(),
                     ecc_uncorrected=n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                                  n.NVML_VOLATILE_ECC),
                     sm_clock_mhz=n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                     sm_clock_max_mhz=n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
                     throttle_reasons=int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
                     power_limit_w=n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
    except Exception as e:  # noqa: BLE001 - NVML missing or a query the driver refuses: the rest counts
        facts["nvml_error"] = error_line(e)[:200]
    return facts


def _sustained_rate(work: Any, amount: float, seconds: float, sync: Any) -> float:
    """amount per second of work() repeated for about `seconds` (after one warm-up call): sustained, as
    training runs, so clocks held down part of the time, or a CPU share cut by its scheduler, count. The
    best single call would hide both."""
    work()
    sync()
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < seconds:
        work()
        calls += 1
        if calls % 8 == 0:
            sync()
    sync()
    return calls * amount / (time.perf_counter() - start)


def local_workload(dtype: torch.dtype, device: torch.device, seconds: float) -> dict[str, float]:
    """A square matmul (TFLOPS) and a copy (GB/s read + written) on this device alone."""
    on_gpu = device.type == "cuda"
    n, copy_bytes = (8192, 2 << 30) if on_gpu else (512, 64 << 20)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    tflops = _sustained_rate(lambda: torch.mm(a, b), 2 * n**3 / 1e12, seconds / 2, sync)
    copy = _sustained_rate(lambda: dst.copy_(src), 2 * copy_bytes / 1e9, seconds / 2, sync)
    return {"matmul_tflops": tflops, "copy_gbs": copy}


# How long a rank waits for the next of its round to come (nodes on one machine: meet): a rank that has
# not come by then (a node that never starts) is not waited for, and the workload is timed without it.
MEET_GAP_S = 4.0


def meet(ready_dir: str, name: str, gap_s: float = MEET_GAP_S) -> int:
    """Say this rank is ready, then wait for the others of the round (the preflight wrote how many in
    `expected`), at most gap_s after the last one came: nodes that share a machine's cores then time their
    workloads side by side, each under the same load. Returns how many had come."""
    ready = Path(ready_dir)
    try:
        expected = int((ready / "expected").read_text())
        (ready / name).touch()
    except (OSError, ValueError):  # no meeting prepared: time it alone
        return 0
    came, last = 0, time.monotonic()
    while True:
        now = sum(1 for p in ready.iterdir() if p.name != "expected")
        if now != came:
            came, last = now, time.monotonic()
        if came >= expected or time.monotonic() - last > gap_s:
            return came
        time.sleep(0.02)


def facts(precision: str, results_dir: str, seconds: float, ready_dir: str | None = None) -> dict[str, Any]:
    """This rank's facts, then its workload timed (after meeting the round's other ranks at ready_dir)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    free = shutil.disk_usage(results_dir).free / 2**30 if os.path.isdir(results_dir) else None
    dtype = DTYPES[precision] if device.type == "cuda" else torch.float32  # a CPU's 16-bit is emulated
    found = {"node": node_name(), "host": socket.gethostname(), "local_rank": local_rank,
             "torch": torch.__version__, "python": sys.version.split()[0], "results_free_gib": free,
             "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
             **gpu_facts(local_rank), **ofi_plugin(), **efa_adapters()}
    if ready_dir:
        found["met"] = meet(ready_dir, f"{found['node']}-{local_rank}")
    return found | local_workload(dtype, device, seconds)


def main(argv: list[str]) -> int:
    """The launchers' worker line: a RunSpec's flags (its precision and where results go) and the fault
    hook's, which a preflight takes and ignores."""
    parser = argparse.ArgumentParser(prog="python -m trainer.preflight")
    add_spec_arguments(parser)
    add_fault_arguments(parser)
    parser.add_argument("--run-dir", default=".")
    parser.add_argument("--seconds", type=float, default=2.0, help="time for the timed local workload")
    parser.add_argument("--ready-dir", help="where the round's ranks meet before timing it (one machine)")
    args = parser.parse_args(argv)
    try:
        spec = spec_from_namespace(args)
        record = facts(spec.precision, args.run_dir, args.seconds, args.ready_dir)
    except Exception as e:  # noqa: BLE001 - one line the orchestrator shows against this node
        record = {"node": node_name(), "error": error_line(e)}
    print(format_record("preflight", **record), flush=True)
    return 0 if "error" not in record else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
