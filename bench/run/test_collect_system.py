"""bench.run.collect keeps each node's system record in the run's summary (extra["system"]), completed with
what NCCL and its plugin printed in the logs; a record cut short or without facts is marked unreadable and
the run keeps its status."""
from __future__ import annotations

from pathlib import Path

from bench.core import rundir
from bench.core.records import RECORDS_DIR, format_record
from bench.core.schema import RunSpec
from bench.launchers.base import Outcome
from bench.run.collect import summarize_run

SPEC = RunSpec(model="tiny_llama", nodes=2, gpus_per_node=1, micro_batch=2, seq_len=128)
FACTS = {"gpu_model": "NVIDIA H100 80GB HBM3", "nccl": "2.21.5",
         "aws_ofi_nccl": {"missing": "no plugin file"}, "env": {"NCCL_DEBUG": "INFO"}}
OK = format_record("summary", status="ok", tokens_per_s=2000.0, tokens_per_s_per_gpu=1000.0, step_time_s=0.5,
                   backend="nccl", energy_j_per_token=0.21, energy_source="NVML energy counter")
# NCCL's INFO lines as a p5 node prints them under srun -l (aws-samples/awsome-distributed-training's FSDP
# guide): NCCL 2.26.2 and aws-ofi-nccl 1.14.0
LOG = ("1: p5-dy-gpu-2:62571:62571 [1] NCCL INFO NCCL version 2.26.2+cuda12.2\n"
       "2: p5-dy-gpu-3:60823:61204 [2] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0\n")


def _summarize(attempt: Path, lines: list[str], log: str = LOG):
    (attempt / RECORDS_DIR).mkdir(parents=True)
    (attempt / RECORDS_DIR / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    (attempt / rundir.LOGS_DIR).mkdir()
    (attempt / rundir.LOGS_DIR / "node0.log").write_text(log)
    return summarize_run(SPEC, "study", attempt, Outcome(returncodes=[0, 0]), predicted={}, git_rev=None,
                         started_at="2026-11-25T00:00:00+00:00")


def test_each_nodes_record_is_kept_with_what_nccl_printed(tmp_path: Path) -> None:
    lines = [format_record("system", rank=0, node="p5-dy-gpu-2", source="trainer", facts=FACTS),
             format_record("system", rank=1, node="p5-dy-gpu-3", source="trainer", facts=FACTS), OK]
    summary = _summarize(tmp_path, lines)
    assert summary.status == "ok" and summary.energy_j_per_token == 0.21
    assert summary.energy_source == "NVML energy counter"
    nodes = summary.extra["system"]
    assert [n["node"] for n in nodes] == ["p5-dy-gpu-2", "p5-dy-gpu-3"]
    facts = nodes[0]["facts"]
    assert facts["nccl"] == "2.21.5" and facts["nccl_printed"] == "2.26.2+cuda12.2"  # torch's and NCCL's own
    assert facts["aws_ofi_nccl"] == "1.14.0"  # the plugin file said nothing: its log line does
    assert facts["env"] == {"NCCL_DEBUG": "INFO"}


def test_a_half_written_record_is_unreadable_and_the_run_stays_ok(tmp_path: Path) -> None:
    whole = format_record("system", rank=0, node="p5-dy-gpu-2", source="trainer", facts=FACTS)
    cut = format_record("system", rank=1, node="p5-dy-gpu-3", source="trainer", facts=FACTS)[:90]
    failed = format_record("system", rank=2, node="p5-dy-gpu-4", source="trainer",
                           error="PermissionError: [Errno 13] Permission denied: '/proc/meminfo'")
    other = format_record("meta", rank=0, nested={"kind": "system"})  # readable: another kind's record
    summary = _summarize(tmp_path, [whole, cut, failed, other, OK], log="")
    assert summary.status == "ok" and summary.error is None
    nodes = {n["node"]: n for n in summary.extra["system"]}
    assert nodes["p5-dy-gpu-2"]["facts"]["nccl_printed"] == {
        "missing": "NCCL printed no version (NCCL_DEBUG=INFO or VERSION makes it)"}
    assert nodes["p5-dy-gpu-4"]["unreadable"] == ("the worker wrote PermissionError: [Errno 13] Permission "
                                                  "denied: '/proc/meminfo'")
    assert nodes[None]["unreadable"].startswith('cut short or garbled: {"v":1,"kind":"system"')
    assert len(summary.extra["system"]) == 3


def test_a_run_of_another_time_has_no_system_entry(tmp_path: Path) -> None:
    summary = _summarize(tmp_path, [OK], log="")
    assert "system" not in summary.extra
