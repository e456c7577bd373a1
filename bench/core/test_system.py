"""A node's system record (bench/core/system.py) on this CPU machine, and its readers against what the real
tools print: `fi_info --version` (AWS's EFA guide, libfabric's docs), the sysfs a node with EFA has, the
aws-ofi-nccl plugin's own version string, git trees clean and dirty, image references. Every fact must be a
value or {"missing": why}; a variable named like a secret never leaves its value in the record."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.core import system
from bench.core.system import (
    MASKED,
    collect,
    container_facts,
    emit_record,
    git_facts,
    is_missing,
    libfabric_version,
    masked_env,
    network_facts,
    plugin_version,
)

# AWS's documented example secret access key (docs.aws.amazon.com, "Managing access keys"), a Hugging Face
# token's shape and an API key's: values that must never reach a record
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SECRETS = {"FI_EFA_AWS_SECRET_ACCESS_KEY": AWS_SECRET, "TORCH_HUB_TOKEN": "hf_kTzvYqBKoWMPnZsXaEJcdL",
           "FSDPBENCH_API_KEY": "sk-proj-3f9a1c7e5b2d", "NCCL_PASSWORD": "hunter2-nccl",
           "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "HF_TOKEN": "hf_kTzvYqBKoWMPnZsXaEJcdL"}


def test_the_environment_keeps_what_shapes_nccl_and_masks_secrets() -> None:
    environ = {"NCCL_DEBUG": "INFO", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_IB_PKEY": "0x8001",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0,1",
               "LD_LIBRARY_PATH": "/opt/amazon/efa/lib", "PATH": "/usr/bin", "HOME": "/root", **SECRETS}
    env = masked_env(environ)
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "FI_EFA_AWS_SECRET_ACCESS_KEY": MASKED,
                   "FI_EFA_USE_DEVICE_RDMA": "1", "FSDPBENCH_API_KEY": MASKED,
                   "LD_LIBRARY_PATH": "/opt/amazon/efa/lib", "NCCL_DEBUG": "INFO",
                   "NCCL_IB_PKEY": "0x8001",  # a partition key (a number), not a secret
                   "NCCL_PASSWORD": MASKED, "OMP_NUM_THREADS": "1", "TORCH_HUB_TOKEN": MASKED,
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_a_secret_in_the_environment_never_reaches_the_record(monkeypatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    text = json.dumps(collect(None, None))
    assert "TORCH_HUB_TOKEN" in text and "FI_EFA_AWS_SECRET_ACCESS_KEY" in text  # named, so a reader knows
    for value in SECRETS.values():
        assert value not in text


@pytest.mark.parametrize("text,want", [
    # AWS's EFA guide (`/opt/amazon/efa/bin/fi_info --version`, EFA installer on a DLAMI)
    ("/opt/amazon/efa/bin/fi_info: 1.22.0amzn5.0\nlibfabric: 1.22.0amzn5.0\nlibfabric api: 1.22\n",
     "1.22.0amzn5.0"),
    # libfabric's installation docs, a build from source
    ("fi_info: 1.21.0a1\nlibfabric: 1.21.0a1\nlibfabric api: 1.20\n", "1.21.0a1"),
    ("fi_info: 1.22.0amzn1.0\n", "1.22.0amzn1.0"),  # the first line alone (trainer/preflight.py's reading)
    ("", None)])
def test_libfabric_version_as_fi_info_prints_it(text: str, want: str | None) -> None:
    assert libfabric_version(text) == want


def test_aws_ofi_nccl_names_itself_in_its_library(tmp_path: Path) -> None:
    """The plugin logs "Initializing " PACKAGE_STRING (src/nccl_ofi_net.c), so the literal is in its
    bytes; before 1.7 it said "Using ..." (sample_01's "NET/OFI Using aws-ofi-nccl 1.5.0aws")."""
    new, old, none = tmp_path / "new.so", tmp_path / "old.so", tmp_path / "none.so"
    new.write_bytes(b"\x7fELF\x02\x01" + os.urandom(4096) + b"\x00Initializing aws-ofi-nccl 1.14.0\x00")
    old.write_bytes(b"\x7fELF" + b"\x00NET/OFI Using aws-ofi-nccl 1.5.0aws\x00")
    none.write_bytes(b"\x7fELF" + b"\x00" * 128)
    assert (plugin_version(str(new)), plugin_version(str(old)), plugin_version(str(none))) == (
        "1.14.0", "1.5.0aws", None)


def test_a_node_with_efa_libfabric_and_the_plugin(tmp_path: Path, monkeypatch) -> None:
    """The sysfs of a p5.48xlarge (32 rdmap devices), fi_info answering as AWS's guide shows, libfabric and
    the plugin on LD_LIBRARY_PATH: each read where the real node has it."""
    sysfs = tmp_path / "infiniband"
    for k in range(32):
        (sysfs / f"rdmap{k + 16}s{k}").mkdir(parents=True)
    bin_dir, lib = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir()
    lib.mkdir()
    fi_info = bin_dir / "fi_info"
    fi_info.write_text("#!/bin/sh\nprintf '/opt/amazon/efa/bin/fi_info: 1.22.0amzn5.0\\nlibfabric: "
                       "1.22.0amzn5.0\\nlibfabric api: 1.22\\n'\n")
    fi_info.chmod(0o755)
    (lib / "libfabric.so.1.25.0").write_bytes(b"\x7fELF")
    os.symlink(lib / "libfabric.so.1.25.0", lib / "libfabric.so.1")
    (lib / "libnccl-net.so").write_bytes(b"\x7fELF\x00Initializing aws-ofi-nccl 1.14.0\x00")
    monkeypatch.setattr(system, "RDMA_SYSFS", sysfs)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib))
    facts = network_facts()
    assert facts["libfabric"] == "1.22.0amzn5.0" and facts["aws_ofi_nccl"] == "1.14.0"
    assert facts["libfabric_lib"] == str(lib / "libfabric.so.1.25.0")  # the file the link names
    assert facts["aws_ofi_nccl_lib"] == str(lib / "libnccl-net.so")
    assert len(facts["rdma_devices"]) == 32 and facts["rdma_devices"][0] == "rdmap16s0"


def test_a_node_without_them_says_why_each_is_missing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(system, "RDMA_SYSFS", tmp_path / "absent")
    monkeypatch.setattr(system, "FI_INFO", (str(tmp_path / "fi_info"),))
    monkeypatch.setattr(system, "EFA_DIRS", (str(tmp_path),))
    monkeypatch.setattr(system, "PLUGIN_DIRS", (str(tmp_path),))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    facts = network_facts()
    assert all(is_missing(v) for v in facts.values()), facts
    assert "no fi_info" in facts["libfabric"]["missing"] and "no aws-ofi-nccl plugin" in facts[
        "aws_ofi_nccl"]["missing"]
    assert "no EFA or InfiniBand" in facts["rdma_devices"]["missing"]


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def test_the_revision_and_whether_the_tree_differs(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    rev = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    assert git_facts(tmp_path) == {"git_rev": rev, "git_dirty": False, "git_diff_sha256": "clean"}
    (tmp_path / "a.py").write_text("x = 2\n")
    first = git_facts(tmp_path)
    (tmp_path / "a.py").write_text("x = 3\n")
    second = git_facts(tmp_path)
    assert first["git_dirty"] is second["git_dirty"] is True
    assert first["git_diff_sha256"] != second["git_diff_sha256"]  # two dirty trees told apart
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "new.py").write_text("")  # untracked: dirty, no diff of tracked files
    assert git_facts(tmp_path)["git_dirty"] is True and git_facts(tmp_path)["git_diff_sha256"] == "clean"
    assert "no git checkout" in git_facts(tmp_path / "sub")["git_rev"]["missing"]


def test_the_image_and_its_digest_where_the_launcher_names_them(tmp_path: Path) -> None:
    digest = "sha256:" + "3f" * 32
    ecr = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp"
    pinned = container_facts({"FSDPBENCH_IMAGE": f"{ecr}@{digest}"})
    assert pinned["container_digest"] == digest
    tagged = container_facts({"FSDPBENCH_IMAGE": "nvcr.io/nvidia/pytorch:24.07-py3"})
    assert tagged["container_image"] == "nvcr.io/nvidia/pytorch:24.07-py3"
    assert "by tag, not by digest" in tagged["container_digest"]["missing"]
    sqsh = tmp_path / "fsdpbench.sqsh"
    sqsh.write_bytes(b"hsqs" + b"\x00" * 96)
    squash = container_facts({"FSDPBENCH_IMAGE": str(sqsh)})
    assert "a squashfs file" in squash["container_digest"]["missing"] and "100 bytes" in squash[
        "container_digest"]["missing"]
    assert "FSDPBENCH_IMAGE unset" in container_facts({})["container_image"]["missing"]


def test_every_fact_on_this_cpu_machine_is_a_value_or_missing_with_why() -> None:
    facts = collect(None, None)
    for key, value in facts.items():
        if key == "env":
            assert isinstance(value, dict)
        elif isinstance(value, dict):
            assert list(value) == ["missing"] and value["missing"], (key, value)
        else:
            assert isinstance(value, (str, int, float, bool, list)), (key, value)
    for key in system.GPU_FACTS + ("gpu_topology",):
        assert facts[key] == {"missing": system.NO_GPU}, key
    assert facts["nccl"] == {"missing": "no torch"}  # torch's facts come from the worker's own module
    assert facts["cpu_count"] == os.cpu_count() and facts["python"].count(".") == 2


def test_only_local_rank_0_writes_one_and_a_failure_is_a_record_not_a_crash(monkeypatch) -> None:
    written: list[tuple[str, dict]] = []
    monkeypatch.setenv("LOCAL_RANK", "1")
    emit_record(lambda kind, **p: written.append((kind, p)), None, None, "trainer")
    assert written == []
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(system, "collect", lambda *a: 1 / 0)
    emit_record(lambda kind, **p: written.append((kind, p)), None, None, "trainer")
    [(kind, payload)] = written
    assert kind == "system" and payload["error"] == "ZeroDivisionError: division by zero"
    assert "facts" not in payload


# This machine's /proc/cpuinfo flags line (2 cores of an "AMD EPYC" VM, AVX2 only), and the same with the
# AVX-512 flags of a Zen 4 added (the kept smoke studies' other machine, also "AMD EPYC", had AVX-512)
ZEN3_FLAGS = "flags\t\t: " + " ".join([
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse",
    "sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology",
    "nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2",
    "x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy",
    "cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall",
    "fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni",
    "xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr wbnoinvd arat umip pku ospke vaes vpclmulqdq",
    "rdpid fsrm",
])
ZEN4_FLAGS = ZEN3_FLAGS + " avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi"
# An AWS Graviton3's Features line (Neoverse V1: SVE and bf16)
GRAVITON3_FEATURES = "Features\t: " + " ".join([
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc",
    "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp",
    "svei8mm svebf16 i8mm bf16 dgh rng",
])


@pytest.mark.parametrize(("cpuinfo", "want"), [
    (f"processor\t: 0\nmodel name\t: AMD EPYC\n{ZEN3_FLAGS}\n", "avx2"),
    (f"processor\t: 0\nmodel name\t: AMD EPYC\n{ZEN4_FLAGS}\n", "avx2 avx512f avx512_bf16"),
    (f"processor\t: 0\n{GRAVITON3_FEATURES}\n", "asimd sve bf16"),
    ("processor\t: 0\nflags\t\t: fpu vme de pse\n", "none of " + " ".join(system.CPU_ISA_FLAGS)),
    ("processor\t: 0\n", {"missing": "no 'flags' or 'Features' in /proc/cpuinfo"}),
])
def test_the_cpu_isa_tells_two_cpus_of_one_model_name_apart(cpuinfo: str, want) -> None:
    """A CPU rank's speed follows its vector units (bf16 matmuls run natively only with avx512_bf16 or
    AMX), which the model name does not say: the kept studies' two "AMD EPYC" machines differ here."""
    assert system.cpu_isa(cpuinfo) == want


@pytest.mark.parametrize(("cpuinfo", "cpufreq", "want"), [
    ("processor\t: 0\ncpu MHz\t\t: 2596.138\nprocessor\t: 1\ncpu MHz\t\t: 1800.000\n", None, 2596.138),
    ("processor\t: 0\ncpu MHz\t\t: 1499.731\n", "3700000", 3700.0),  # bare metal: the cpufreq maximum
    (f"processor\t: 0\n{GRAVITON3_FEATURES}\n", None,
     {"missing": "no cpufreq and no 'cpu MHz' in /proc/cpuinfo"}),
    ("processor\t: 0\ncpu MHz\t\t: unknown\n", "",
     {"missing": "unreadable 'cpu MHz\\t\\t: unknown' in /proc/cpuinfo"}),
])
def test_the_cpu_clock_is_the_first_cpus_or_the_cpufreq_maximum(cpuinfo: str, cpufreq: str | None,
                                                                  want: object) -> None:
    """A CPU rank's peak follows its clock (bench/predict/cpu.py), so a study records it: a VM's nominal
    `cpu MHz`, or on bare metal the cpufreq maximum (its cores' current clocks move with their load)."""
    assert system.cpu_mhz(cpuinfo, cpufreq) == want


def test_this_machines_cpu_facts_are_the_records() -> None:
    facts = system.cpu_facts()
    assert set(facts) == {"cpu_model", "cpu_isa", "cpu_mhz", "cpu_count", "cpus_usable"}
    assert facts.items() <= system.machine_facts().items()
    assert isinstance(facts["cpu_mhz"], float) or list(facts["cpu_mhz"]) == ["missing"]
