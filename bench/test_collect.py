"""bench.collect lifts what the worker recorded into the run's summary: here the versions a calibration
keeps."""
from __future__ import annotations

from pathlib import Path

from bench.collect import summarize_run
from bench.core.records import RECORDS_DIR, format_record
from bench.core.schema import RunSpec
from bench.launchers.base import Outcome


def _summary(tmp_path: Path, meta: dict) -> object:
    spec = RunSpec(model="tiny_llama", nodes=1, gpus_per_node=2, micro_batch=2, seq_len=128)
    (tmp_path / RECORDS_DIR).mkdir()
    lines = [format_record("meta", rank=0, **meta),
             format_record("summary", status="ok", tokens_per_s=2000.0, tokens_per_s_per_gpu=1000.0,
                           step_time_s=0.5)]
    (tmp_path / RECORDS_DIR / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    return summarize_run(spec, "smoke", tmp_path, Outcome(returncodes=[0, 0]), predicted={}, git_rev=None,
                         started_at="2026-11-25T00:00:00+00:00")


def test_a_gpu_workers_nccl_version_reaches_the_summary(tmp_path: Path) -> None:
    summary = _summary(tmp_path, {"torch": "2.11.0+cu130", "nccl": "2.27.5", "device_name": "NVIDIA H100"})
    assert summary.status == "ok" and summary.torch_version == "2.11.0+cu130"
    assert summary.extra["nccl_version"] == "2.27.5"


def test_a_cpu_worker_has_no_nccl_version(tmp_path: Path) -> None:
    summary = _summary(tmp_path, {"torch": "2.13.0+cpu", "device_name": "cpu"})
    assert "nccl_version" not in summary.extra
