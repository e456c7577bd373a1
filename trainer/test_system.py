"""The system record as the workers write it: the trainer at start on each node's local rank 0 (read from a
run the session trains anyway, conftest.Series), and `python -m trainer.system`, which a launcher runs before
an nccl-tests binary. On this CPU machine the GPU's facts are missing with why, and energy is not measured,
with why."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.records import parse_records, records_path
from bench.core.system import NO_GPU
from conftest import ROOT, SERIES
from trainer.test_axes import RUNS

pytestmark = pytest.mark.xdist_group("series")  # reads a run of conftest.Series (test_axes' bf16 run)
SERIES.declare(RUNS["bf16"], nproc=2)  # the same run: trained once, whichever module asks first


def test_the_trainer_writes_one_record_per_node_and_no_energy_on_cpu() -> None:
    run = SERIES.result(RUNS["bf16"], nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    [record] = run.of_kind("system")  # two ranks on one node: its local rank 0 alone
    assert record["rank"] == 0 and record["local_rank"] == 0 and record["source"] == "trainer"
    facts = record["facts"]
    assert facts["gpu_model"] == {"missing": NO_GPU} and facts["torch"].startswith("2.")
    assert facts["cuda_runtime"]["missing"].endswith("has no CUDA")  # this CPU build of torch
    assert facts["env"]["OMP_NUM_THREADS"] == "1"
    summary = run.summary
    assert summary["energy_j_per_token"] is None and summary["energy_source"] == "not measured: no GPU"
    assert all(r["nvml_energy_note"] == "not measured: no GPU" for r in summary["per_rank"])


def test_the_command_writes_the_record_a_launcher_runs_it_for(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "trainer.system", "--run-id", "abc123", "--source",
                           "nccl-tests", "--run-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "LOCAL_RANK": "0",
                                                       "NCCL_NET": "Socket", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    [record] = list(parse_records(proc.stdout.splitlines()))
    assert record["kind"] == "system" and record["run_id"] == "abc123" and record["source"] == "nccl-tests"
    assert record["facts"]["env"] == {"CUDA_VISIBLE_DEVICES": "", "NCCL_NET": "Socket"}
    assert record["facts"]["nccl"] == {"missing": NO_GPU}
    assert list(parse_records(records_path(tmp_path, 0).read_text().splitlines())) == [record]
