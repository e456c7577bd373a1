"""The trace from the harness's side: the config section (bad values one line, exit 2), the worker's command
line (the trace on it, the run id unchanged), and the ranks' trace records lifted into the summary (a
rank without a split leaves the run ok and says why)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.core.load_config import from_dict
from bench.core.records import RECORDS_DIR, format_record
from bench.core.schema import RunSpec
from bench.launchers import launcher_sections
from bench.launchers.base import Outcome
from bench.launchers.local import LocalLauncher
from bench.run.collect import summarize_run
from bench.sweep import compose, main


@pytest.mark.parametrize(("overrides", "message"), [
    (["trace.ranks=some"], "trace.ranks='some' is not one of: all, per_node"),
    (["trace.steps=0"], "trace.steps=0 must be >= 1"),
])
def test_bad_trace_config_is_one_line_and_exit_2(overrides, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["+sweep=smoke", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_worker_is_told_to_trace_and_the_run_id_stays(tmp_path: Path) -> None:
    spec = RunSpec(model="tiny_llama", nodes=2, gpus_per_node=2, micro_batch=2)
    ids = {}
    for overrides in ([], ["trace.ranks=per_node", "trace.steps=2"], ["trace.enabled=false"]):
        raw = compose(["+sweep=smoke", f"results_root={tmp_path}", *overrides])[0]
        cfg = from_dict(raw, launcher_sections())
        argv = LocalLauncher(cfg).render(spec, tmp_path).argvs[0]
        ids[tuple(overrides)] = spec.run_id
        tail = list(argv[argv.index("--trace-steps"):][:4]) if "--trace-steps" in argv else []
        assert tail == {0: ["--trace-steps", "3", "--trace-ranks", "all"],  # the smoke's three steps
                        2: ["--trace-steps", "2", "--trace-ranks", "per_node"], 1: []}[len(overrides)]
    assert len(set(ids.values())) == 1


def test_a_sweep_run_from_another_dir_keeps_each_trace_in_its_own_run_dir(
        tmp_path: Path, monkeypatch) -> None:
    """The workers start in the project root: a run dir relative to the sweep's cwd would put the traces
    (written by the worker under --run-dir) in the project's results/ instead of the study's."""
    monkeypatch.chdir(tmp_path)
    spec = RunSpec(model="tiny_llama", nodes=2, gpus_per_node=2, micro_batch=2)
    cfg = from_dict(compose(["+sweep=smoke", "results_root=results"])[0], launcher_sections())
    submission = LocalLauncher(cfg).render(spec, Path("results/smoke/runs") / spec.run_id)
    argv = submission.argvs[0]
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    assert run_dir == tmp_path / "results/smoke/runs" / spec.run_id


def _records(tmp_path: Path, traces: list[dict]) -> object:
    spec = RunSpec(model="tiny_llama", nodes=1, gpus_per_node=2, micro_batch=2, seq_len=128)
    (tmp_path / RECORDS_DIR).mkdir()
    for rank in (0, 1):
        lines = [format_record("summary", status="ok", tokens_per_s=2000.0, tokens_per_s_per_gpu=1000.0,
                               step_time_s=0.5)] if rank == 0 else []
        lines += [format_record("trace", **t) for t in traces if t["rank"] == rank]
        (tmp_path / RECORDS_DIR / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return summarize_run(spec, "smoke", tmp_path, Outcome(returncodes=[0, 0]), predicted={}, git_rev=None,
                         started_at="2026-11-25T00:00:00+00:00")


def _split(compute: float, waiting: float, ag_s: float) -> dict:
    parts = {"compute": compute, "exposed_all_gather_fwd": 0.1, "exposed_all_gather_bwd": 0.0,
             "exposed_reduce_scatter": 0.05, "exposed_all_reduce": 0.0, "waiting": waiting,
             "optimizer": 0.01, "other": 0.04}
    overlapped = {"all_gather_fwd": 0.02, "all_gather_bwd": 0.0, "reduce_scatter": 0.0, "all_reduce": 0.0}
    return {"parts": parts, "overlapped": overlapped,
            "step_s": sum(parts.values()), "unclassified": 0, "steps": 2, "device": "cpu",
            "collectives": {"all_gather_fwd": {"bytes": 4096, "s": ag_s, "count": 5}}}


def test_the_ranks_splits_reach_the_summary_as_medians(tmp_path: Path) -> None:
    summary = _records(tmp_path, [{"rank": 0, "split": _split(0.3, 0.0, 0.10), "error": None},
                                  {"rank": 1, "split": _split(0.2, 0.1, 0.20), "error": None}])
    assert summary.status == "ok" and summary.trace_note is None
    assert summary.trace_split["compute"] == pytest.approx(0.25)
    assert summary.trace_split["waiting"] == pytest.approx(0.05)
    assert summary.trace_split["overlapped_all_gather_fwd"] == pytest.approx(0.02)
    assert summary.trace_collectives == {"all_gather_fwd": {"bytes": 4096, "s": pytest.approx(0.15),
                                                            "count": 5}}
    assert [r["rank"] for r in summary.extra["trace_per_rank"]] == [0, 1]
    row = summary.to_row()  # JSON in the table, a dict again when read back
    assert isinstance(row["trace_split"], str)
    assert type(summary).from_row(row).trace_split == summary.trace_split


def test_a_rank_whose_trace_could_not_be_split_leaves_the_run_ok_and_says_why(tmp_path: Path) -> None:
    why = ("trace rank1.pt.trace.json.gz was written by torch 2.4.0, this reader knows torch 2.13.0's event "
           "names")
    missing = "no trace at /x/rank0.pt.trace.json.gz"
    summary = _records(tmp_path, [{"rank": 0, "split": None, "error": missing},
                                  {"rank": 1, "split": None, "error": why}])
    assert summary.status == "ok" and summary.trace_split is None and summary.trace_collectives is None
    assert "rank 0: no trace at" in summary.trace_note and why in summary.trace_note
    assert summary.trace_note.endswith("no split")


def test_a_run_without_trace_records_says_so(tmp_path: Path) -> None:
    summary = _records(tmp_path, [])
    assert summary.status == "ok" and summary.trace_split is None
    assert summary.trace_note.startswith("no trace recorded")
