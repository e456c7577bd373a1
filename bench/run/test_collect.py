"""bench.run.collect lifts what the worker recorded into the run's summary: here the versions a calibration
keeps."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.core.records import RECORDS_DIR, format_record
from bench.core.schema import RunSpec
from bench.launchers.base import Outcome
from bench.run.collect import summarize_run


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


def test_a_requeued_jobs_executions_are_counted_with_the_time_they_cost(tmp_path: Path) -> None:
    spec = RunSpec(model="tiny_llama", nodes=2, gpus_per_node=2, micro_batch=2, seq_len=128)
    (tmp_path / RECORDS_DIR).mkdir()
    (tmp_path / RECORDS_DIR / "rank0.jsonl").write_text(format_record(
        "summary", status="ok", tokens_per_s=2000.0, tokens_per_s_per_gpu=500.0, step_time_s=0.5) + "\n")
    runs = [{"state": "NODE_FAIL", "nodes": "node[1-2]", "start": "2026-11-25T10:17:20",
             "end": "2026-11-25T10:17:21", "failed_nodes": {"node2": "down: bad DIMM"}},
            {"state": "COMPLETED", "nodes": "node[1,3]", "start": "2026-11-25T10:19:23",
             "end": "2026-11-25T10:19:43"}]
    summary = summarize_run(spec, "smoke", tmp_path, Outcome(returncodes=[0], executions=runs), predicted={},
                            git_rev=None, started_at="2026-11-25T10:17:00+00:00")
    assert summary.status == "ok" and summary.restarts == 1 and summary.restart_lost_s == 123.0
    assert summary.extra["executions"] == runs
    from analysis.scaling import restart_notes
    frame = pd.DataFrame([{**summary.to_row(), "sweep": "smoke"}])
    (note,) = restart_notes(frame)
    assert "1 run(s) restarted 1 time(s)" in note and "node2 (down: bad DIMM)" in note
    assert "2.0 min of wall time and 0.07 node-hours" in note
    assert restart_notes(frame.assign(restarts=0)) == []


def test_a_requeued_job_is_judged_by_its_last_execution(tmp_path: Path, monkeypatch) -> None:
    """The first execution's workers, left running when their node's slurmd died, wrote gloo's error as
    the job was requeued; the second (SLURM_RESTART_COUNT=1 in its workers' environment) ran to the end."""
    spec = RunSpec(model="tiny_llama", nodes=2, gpus_per_node=2, micro_batch=2, seq_len=128)
    (tmp_path / RECORDS_DIR).mkdir()
    first = [format_record("meta", rank=1, host="node2"),
             format_record("summary", rank=1, status="failed",
                           error="RuntimeError: Connection closed by peer")]
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second = [format_record("meta", rank=1, host="node4"),
              format_record("summary", rank=1, status="ok", tokens_per_s=2000.0, tokens_per_s_per_gpu=500.0,
                            step_time_s=0.5)]
    (tmp_path / RECORDS_DIR / "rank1.jsonl").write_text("\n".join(first + second) + "\n")
    summary = summarize_run(spec, "smoke", tmp_path, Outcome(returncodes=[0]), predicted={}, git_rev=None,
                            started_at="2026-11-27T02:54:46+00:00")
    assert summary.status == "ok" and summary.host == "node4" and summary.error is None
