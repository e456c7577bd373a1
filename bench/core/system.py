"""What one node ran with, as the payload of one `system` record, so a study can be reproduced on another
cluster a year later and two studies' differences named (analysis/system.py).

The trainer and the torch probe write one at start on each node's local rank 0 (`emit_record`); a launcher
runs `python -m trainer.system` before an nccl-tests binary, which writes none (bench/launchers). It lives
here, beside the records, because both workers write it and neither may import the other; it never imports
torch: a worker hands its torch module in. Each fact is a value or {"missing": why} ("no GPU", "no
nvidia-smi"), never a guess:

    GPU          gpu_model, gpu_count (the node's, NVML), gpu_visible (this process's, CUDA), gpu_driver,
                 cuda_driver (what the driver supports), cuda_runtime (torch's), cudnn, gpu_memory_gib,
                 gpu_power_limit_w, gpu_sm_clock_max_mhz, gpu_vbios, gpu_ecc, gpu_mig (NVML, the GPU
                 opened by open_gpu as trainer/nvml.py's sampler and the GPU check open it), gpu_topology
                 (`nvidia-smi topo -m`)
    network      nccl (torch.cuda.nccl.version(); what NCCL itself prints is added from the logs by
                 bench/run/collect.py as nccl_printed), libfabric (`fi_info --version`), libfabric_lib,
                 aws_ofi_nccl (the plugin's own version string, else from NCCL's log), aws_ofi_nccl_lib,
                 rdma_devices (/sys/class/infiniband: EFA's rdmapN, InfiniBand's mlx5_N)
    machine      instance_type (DMI product name: the EC2 instance type), dmi_vendor, cpu_model, cpu_isa
                 (its vector and matrix units: two CPUs of one model name can differ), cpu_mhz (its
                 clock), cpu_count, cpus_usable, mem_total_gib, kernel, os
    software     python, torch, transformers, torchao, numpy, nvidia_ml_py, nccl_wheel, git_rev, git_dirty,
                 git_diff_sha256 (of `git diff HEAD`: two dirty trees told apart), container_image,
                 container_digest (where the launcher knows it: FSDPBENCH_IMAGE)
    where        host, slurm_job_id, slurm_nodelist, k8s_pod (the node's identity, not its system; the
                 record's `node` is the scheduler's name for it)
    env          NCCL_*, FI_*, TORCH_*, CUDA_*, OMP_*, OFI_NCCL_*, PYTORCH_*, NVIDIA_*, FSDPBENCH_*,
                 LD_LIBRARY_PATH, LD_PRELOAD as the process saw them; a variable named like a secret
                 (SECRET, TOKEN, PASSWORD, ..._KEY) is recorded by name only, its value masked

Slow facts (subprocesses, git, the plugin's bytes) are read once per process: a test series of runs in one
process reads them once.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.core.records import error_line, node_name

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# the container image a launcher ran the worker in (bench.launchers.base.job_env sets it)
IMAGE_ENV = "FSDPBENCH_IMAGE"
ENV_PREFIXES = ("NCCL_", "FI_", "TORCH_", "CUDA_", "OMP_", "OFI_NCCL_", "PYTORCH_", "NVIDIA_", "FSDPBENCH_")
ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
# Names that hold credentials (AWS_SECRET_ACCESS_KEY, HF_TOKEN, ..._PASSWORD, ..._API_KEY); NCCL_IB_PKEY (an
# InfiniBand partition key, a number) is no secret: KEY must stand alone between underscores
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSW|CREDENTIAL|PRIVATE|SESSION|(?:^|_)(?:API_?)?KEY(?:$|_)", re.I)
MASKED = "<masked: the name looks like a secret's>"
# Where AWS's images (DLAMI, EKS and ParallelCluster AMIs) install the EFA software, beside LD_LIBRARY_PATH
EFA_DIRS = ("/opt/amazon/efa/lib", "/opt/amazon/efa/lib64")
# where those images put the aws-ofi-nccl plugin (as trainer/preflight.py looks for it)
PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib", "/usr/local/lib")
FI_INFO = ("/opt/amazon/efa/bin/fi_info",)
RDMA_SYSFS = Path("/sys/class/infiniband")
DMI = Path("/sys/class/dmi/id")
CPUFREQ_MAX = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz, where cpufreq drives it
# aws-ofi-nccl logs "Initializing " PACKAGE_STRING at init (src/nccl_ofi_net.c; "Using ..." before 1.7): the
# literal "aws-ofi-nccl 1.14.0" is in the plugin's own bytes
PLUGIN_VERSION = re.compile(rb"aws-ofi-nccl (\d+\.\d+[0-9A-Za-z.+-]*)")
PLUGIN_READ_MAX = 64 << 20  # bytes of the plugin searched for it (a build is a few MB)
COMMAND_TIMEOUT_S = 20
NO_GPU = "no GPU (torch.cuda.is_available() is False)"
# The CPU flags that set how fast a CPU rank computes (x86's AVX and AMX, Arm's SVE and bf16), as
# /proc/cpuinfo names them: a VM of one model name may pass AVX-512 through or not
CPU_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "asimd", "sve",
                 "sve2", "bf16")
GPU_FACTS = ("gpu_model", "gpu_count", "gpu_driver", "cuda_driver", "gpu_memory_gib", "gpu_power_limit_w",
             "gpu_sm_clock_max_mhz", "gpu_vbios", "gpu_ecc", "gpu_mig")


def missing(why: str) -> dict[str, str]:
    """A fact that could not be read, with why."""
    return {"missing": why}


def is_missing(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"missing"}


def masked_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment that shapes NCCL, libfabric, torch and OpenMP, sorted; values of variables named like
    a secret replaced (the value never enters the record)."""
    keep = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return {k: MASKED if SECRET_NAME.search(k) else keep[k] for k in sorted(keep)}


def _run(argv: list[str]) -> tuple[str | None, str]:
    """A command's stdout, or None and why."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, error_line(e)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip()[:200]
        return None, f"{' '.join(argv[:3])} exited {proc.returncode}: {said}"
    return proc.stdout, ""


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def libfabric_version(text: str) -> str | None:
    """libfabric's version from `fi_info --version` ("/opt/amazon/efa/bin/fi_info: 1.22.0amzn5.0",
    "libfabric: 1.22.0amzn5.0", "libfabric api: 1.22"): the library's line, else the first line's."""
    lines = text.splitlines()
    for line in lines:
        if line.startswith("libfabric:"):
            return line.split(":", 1)[1].strip() or None
    words = lines[0].split(":", 1)[1].split() if lines and ":" in lines[0] else []
    return words[0] if words else None


def topology_matrix(text: str) -> str:
    """`nvidia-smi topo -m` without its legend (the same text on every machine): the matrix lines only."""
    return text.split("Legend:", 1)[0].rstrip()


def plugin_version(path: str) -> str | None:
    """aws-ofi-nccl's version from its own bytes (PLUGIN_VERSION), None where the string is not there."""
    try:
        with open(path, "rb") as f:
            found = PLUGIN_VERSION.search(f.read(PLUGIN_READ_MAX))
    except OSError:
        return None
    return found.group(1).decode() if found else None


def physical_gpu_index(local_index: int, visible: str | None) -> int | str:
    """Map a CUDA ordinal to the NVML index through CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    if not visible:
        return local_index
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if local_index >= len(entries):
        raise ValueError(f"CUDA device {local_index} not in CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[local_index]
    return int(entry) if entry.isdigit() else entry


def open_gpu(local_index: int, nvml: Any = None) -> tuple[Any, Any, int | str]:
    """NVML initialised and the handle of this rank's GPU (CUDA ordinal `local_index`, mapped through
    CUDA_VISIBLE_DEVICES): the one path trainer/nvml.py's sampler and the system record read a GPU by.
    Raises what NVML raises (no library, no driver)."""
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    index = physical_gpu_index(local_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    handle = (nvml.nvmlDeviceGetHandleByIndex(index) if isinstance(index, int)
              else nvml.nvmlDeviceGetHandleByUUID(index))
    return nvml, handle, index


def _text(value: Any) -> str:
    """NVML strings: bytes from older pynvml releases, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version(code: int) -> str:
    """CUDA's version code as NVML (and NCCL's "cudaDriverVersion 12040") print it: 1000 x major + 10 x
    minor -> "12.4"."""
    return f"{code // 1000}.{code % 1000 // 10}"


def gpu_facts(local_index: int, nvml: Any = None) -> dict[str, Any]:
    """This rank's GPU as NVML reports it, for the system record: each fact a value or {"missing": why}
    (a query the driver refuses is missing with NVML's error, the others still read)."""
    try:
        nvml, h, _ = open_gpu(local_index, nvml)
    except Exception as e:  # ImportError, NVMLError_LibraryNotFound, driver mismatch ...
        return dict.fromkeys(GPU_FACTS, missing(f"NVML: {type(e).__name__}: {e}"))
    n = nvml
    queries: dict[str, Any] = {
        "gpu_model": lambda: _text(n.nvmlDeviceGetName(h)),
        "gpu_count": n.nvmlDeviceGetCount,  # every GPU of the node, visible to this process or not
        "gpu_driver": lambda: _text(n.nvmlSystemGetDriverVersion()),
        "cuda_driver": lambda: cuda_version(n.nvmlSystemGetCudaDriverVersion()),  # what the driver supports
        "gpu_memory_gib": lambda: round(n.nvmlDeviceGetMemoryInfo(h).total / 2**30, 2),
        "gpu_power_limit_w": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,  # milliwatts
        "gpu_sm_clock_max_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
        "gpu_vbios": lambda: _text(n.nvmlDeviceGetVbiosVersion(h)),
        "gpu_ecc": lambda: "on" if n.nvmlDeviceGetEccMode(h)[0] else "off",  # [current, pending]
        "gpu_mig": lambda: "on" if n.nvmlDeviceGetMigMode(h)[0] else "off",
    }
    out: dict[str, Any] = {}
    for key, query in queries.items():
        try:
            out[key] = query()
        except Exception as e:  # NVMLError_NotSupported (MIG on a GPU without it), ...
            out[key] = missing(f"NVML: {type(e).__name__}: {e}")
    return out


def _library_dirs(extra: tuple[str, ...]) -> list[str]:
    return [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(extra)


def network_facts() -> dict[str, Any]:
    """libfabric (its fi_info and library), the aws-ofi-nccl plugin NCCL would load, the RDMA devices."""
    out: dict[str, Any] = {}
    fi_info = shutil.which("fi_info") or next((p for p in FI_INFO if os.access(p, os.X_OK)), None)
    if fi_info is None:
        out["libfabric"] = missing(f"no fi_info on PATH or in {', '.join(FI_INFO)} (libfabric not installed)")
    else:
        text, why = _run([fi_info, "--version"])
        version = libfabric_version(text) if text else None
        out["libfabric"] = version or missing(why or f"fi_info --version printed no version: {text!r}"[:200])
    libs = sorted({os.path.realpath(p) for d in _library_dirs(EFA_DIRS)
                   for p in glob.glob(os.path.join(d, "libfabric.so*"))})
    out["libfabric_lib"] = libs[0] if libs else missing(
        f"no libfabric.so in LD_LIBRARY_PATH or {', '.join(EFA_DIRS)}")
    plugins = sorted({p for d in _library_dirs(PLUGIN_DIRS)
                      for p in glob.glob(os.path.join(d, "libnccl-net*.so"))})
    if plugins:
        out["aws_ofi_nccl_lib"] = os.path.realpath(plugins[0])
        out["aws_ofi_nccl"] = plugin_version(plugins[0]) or missing(
            f"no 'aws-ofi-nccl <version>' string in {plugins[0]} (NCCL's log may name it)")
    else:
        why = f"no libnccl-net*.so in LD_LIBRARY_PATH or {', '.join(PLUGIN_DIRS)} (no aws-ofi-nccl plugin)"
        out["aws_ofi_nccl_lib"] = out["aws_ofi_nccl"] = missing(why)
    try:
        out["rdma_devices"] = sorted(os.listdir(RDMA_SYSFS))
    except OSError:
        out["rdma_devices"] = missing(f"no {RDMA_SYSFS} (no RDMA device driver: no EFA or InfiniBand)")
    return out


def machine_facts() -> dict[str, Any]:
    """The instance (DMI: EC2 names its instance type there), CPU, memory, kernel and OS."""
    out: dict[str, Any] = {}
    for key, name in (("instance_type", "product_name"), ("dmi_vendor", "sys_vendor")):
        out[key] = _read(DMI / name) or missing(f"no {DMI / name} (no DMI table here: a container or VM "
                                                "that hides it)")
    out.update(cpu_facts())
    meminfo = _read(Path("/proc/meminfo")) or ""
    total = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)
    # whole GiB: the kernel's reservations move MemTotal by megabytes between nodes of one instance type
    out["mem_total_gib"] = round(int(total.group(1)) / 2**20) if total else missing("no /proc/meminfo")
    out["kernel"] = platform.release() or missing("platform.release() empty")
    release = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', _read(Path("/etc/os-release")) or "", re.M)
    out["os"] = release.group(1) if release else missing("no PRETTY_NAME in /etc/os-release")
    return out


def cpu_facts() -> dict[str, Any]:
    """This machine's CPU: its model name, vector and matrix units, clock and cores (what a CPU rank's speed
    follows: bench/predict/cpu.py reads a study's from its runs' records)."""
    cpuinfo = _read(Path("/proc/cpuinfo")) or ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith(("model name", "Model name"))), None)
    return {"cpu_model": model or missing("no 'model name' in /proc/cpuinfo"), "cpu_isa": cpu_isa(cpuinfo),
            "cpu_mhz": cpu_mhz(cpuinfo, _read(CPUFREQ_MAX)),
            "cpu_count": os.cpu_count() or missing("os.cpu_count() unknown"),
            "cpus_usable": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                            else missing("no sched_getaffinity on this platform"))}


def cpu_mhz(cpuinfo: str, cpufreq_max_khz: str | None) -> Any:
    """The CPU's clock in MHz: the kernel's cpufreq maximum where it has one (a bare-metal core's current
    clock moves with its load, so two reads of one node would differ), else the first CPU's `cpu MHz` in
    /proc/cpuinfo (a VM's, its host's nominal clock)."""
    if cpufreq_max_khz and cpufreq_max_khz.isdigit():
        return int(cpufreq_max_khz) / 1000
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("cpu MHz")), None)
    if line is None:
        return missing("no cpufreq and no 'cpu MHz' in /proc/cpuinfo")
    try:
        return float(line.split(":", 1)[1])
    except ValueError:
        return missing(f"unreadable {line.strip()!r} in /proc/cpuinfo")


def cpu_isa(cpuinfo: str) -> Any:
    """The CPU_ISA_FLAGS the first CPU lists (x86's `flags`, Arm's `Features`), space-separated in that
    order ("none of ..." where it lists none of them)."""
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith(("flags", "Features"))), None)
    if line is None:
        return missing("no 'flags' or 'Features' in /proc/cpuinfo")
    have = set(line.split(":", 1)[1].split())
    return " ".join(f for f in CPU_ISA_FLAGS if f in have) or f"none of {' '.join(CPU_ISA_FLAGS)}"


def _version(dist: str) -> Any:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return missing(f"{dist} not installed")


def software_facts() -> dict[str, Any]:
    """Python and the packages a run's numbers depend on, read from their metadata (nothing imported)."""
    out: dict[str, Any] = {"python": platform.python_version()}
    for key, dist in (("torch", "torch"), ("transformers", "transformers"), ("torchao", "torchao"),
                      ("numpy", "numpy"), ("nvidia_ml_py", "nvidia-ml-py")):
        out[key] = _version(dist)
    wheels = sorted(f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
                    if (d.metadata["Name"] or "").lower().startswith("nvidia-nccl"))
    out["nccl_wheel"] = ", ".join(wheels) or missing("no nvidia-nccl-* wheel (torch's own build, or CPU)")
    return out


def git_facts(root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The project's revision as this worker runs it, whether its tree differs, and a hash of how."""
    git = shutil.which("git")
    if git is None:
        return dict.fromkeys(("git_rev", "git_dirty", "git_diff_sha256"), missing("no git on PATH"))
    if not (root / ".git").exists():
        why = missing(f"no git checkout at {root} (an image without .git: its digest names the code)")
        return dict.fromkeys(("git_rev", "git_dirty", "git_diff_sha256"), why)
    rev, why = _run([git, "-C", str(root), "rev-parse", "HEAD"])
    status, why_status = _run([git, "-C", str(root), "status", "--porcelain"])
    diff, why_diff = _run([git, "-C", str(root), "diff", "HEAD"])
    return {"git_rev": rev.strip() if rev else missing(why),
            "git_dirty": bool(status.strip()) if status is not None else missing(why_status),
            "git_diff_sha256": (hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else "clean")
            if diff is not None else missing(why_diff)}


def container_facts(environ: Mapping[str, str]) -> dict[str, Any]:
    """The image the launcher ran this worker in (FSDPBENCH_IMAGE) and its digest where the reference pins
    one (name@sha256:...); a pyxis squashfs file is named by its size and time instead."""
    image = environ.get(IMAGE_ENV)
    if not image:
        why = missing(f"the launcher named no container image ({IMAGE_ENV} unset: a local or bare-metal run)")
        return {"container_image": why, "container_digest": why}
    digest = re.search(r"@(sha\d+:[0-9a-f]{32,})", image)
    if digest:
        return {"container_image": image, "container_digest": digest.group(1)}
    if image.startswith("/") and os.path.isfile(image):
        stat = os.stat(image)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stat.st_mtime))
        return {"container_image": image,
                "container_digest": missing(f"a squashfs file, not a registry image: {stat.st_size} bytes, "
                                            f"modified {when}")}
    return {"container_image": image,
            "container_digest": missing("referenced by tag, not by digest (pin it as name@sha256:...)")}


def where_facts(environ: Mapping[str, str]) -> dict[str, Any]:
    """The node's identity: its host, and the scheduler's names for the job and the node."""
    slurm = "not a Slurm job (no SLURM_JOB_ID)"
    pod = environ.get("KUBERNETES_SERVICE_HOST") is not None
    return {"host": socket.gethostname(),
            "slurm_job_id": environ.get("SLURM_JOB_ID") or missing(slurm),
            "slurm_nodelist": (environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
                               or missing(slurm)),
            "k8s_pod": (environ.get("HOSTNAME") or socket.gethostname()) if pod else missing(
                "not a Kubernetes pod (no KUBERNETES_SERVICE_HOST)")}


def torch_facts(torch: Any, local_index: int | None) -> dict[str, Any]:
    """What the worker's torch (handed in: bench never imports it) was built with and sees."""
    if torch is None:
        return dict.fromkeys(("cuda_runtime", "cudnn", "nccl", "gpu_visible"), missing("no torch"))
    cuda = torch.version.cuda
    out: dict[str, Any] = {"cuda_runtime": cuda or missing(f"torch {torch.__version__} has no CUDA")}
    cudnn = torch.backends.cudnn.version() if cuda else None
    out["cudnn"] = cudnn or missing(f"torch {torch.__version__} has no " + ("cuDNN" if cuda else "CUDA"))
    if local_index is None:
        out["nccl"] = missing(NO_GPU)
        out["gpu_visible"] = 0
        return out
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # a torch built without NCCL
        out["nccl"] = missing(error_line(e))
    out["gpu_visible"] = torch.cuda.device_count()
    return out


def gpu_topology() -> Any:
    """`nvidia-smi topo -m` (links between the GPUs and NICs, CPU and NUMA affinity), legend dropped."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return missing("no nvidia-smi")
    text, why = _run([smi, "topo", "-m"])
    return topology_matrix(text) if text else missing(why)


@functools.lru_cache(maxsize=4)
def _static(local_index: int | None) -> dict[str, Any]:
    """The facts that do not change while the process lives (read once: subprocesses, git, files)."""
    if local_index is None:
        gpu: dict[str, Any] = dict.fromkeys(GPU_FACTS, missing(NO_GPU))
        topology: Any = missing(NO_GPU)
    else:
        gpu, topology = gpu_facts(local_index), gpu_topology()
    return {**gpu, "gpu_topology": topology, **network_facts(), **machine_facts(), **software_facts(),
            **git_facts()}


def collect(torch: Any, local_index: int | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every fact of this node (module docstring); local_index: this process's CUDA device, None on CPU."""
    environ = os.environ if environ is None else environ
    return {**where_facts(environ), **_static(local_index), **torch_facts(torch, local_index),
            **container_facts(environ), "env": masked_env(environ)}


def record(torch: Any, local_index: int | None, source: str) -> dict[str, Any]:
    """A `system` record's payload: the node, who wrote it, its facts, and what reading them cost."""
    began = time.monotonic()
    facts = collect(torch, local_index)
    return {"node": node_name(), "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "source": source,
            "facts": facts, "collect_s": round(time.monotonic() - began, 3)}


def emit_record(emit: Callable[..., None], torch: Any, local_index: int | None, source: str) -> None:
    """Write this node's system record through a worker's emitter, on its local rank 0 only; a failure to
    read the facts is a record with the error (the run goes on: collect marks it unreadable)."""
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    try:
        payload = record(torch, local_index, source)
    except Exception as e:  # noqa: BLE001 - a fact reader's bug must not cost the run
        payload = {"node": node_name(), "source": source, "error": error_line(e)}
    emit("system", **payload)
