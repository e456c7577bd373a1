"""From run dirs to RunSummaries and the results table (one row per run, failed and infeasible too)."""
from __future__ import annotations

import io
from dataclasses import fields
from pathlib import Path
from typing import Any

from bench import rundir
from bench.classify import classify
from bench.core.schema import SUMMARY_COLUMNS, RunSpec, RunSummary
from bench.launchers.base import TRACE_PREFIX, Outcome
from nccl.records import check_transport, records_from_logs

_LOG_TAIL_BYTES = 64 * 1024
_SUMMARY_FIELDS = {f.name for f in fields(RunSummary)} - {"run_id", "sweep", "status", "spec", "error",
                                                          "extra", "run_dir", "schema_version"}
_EXTRA_KEYS = ("losses", "step_times_s", "per_rank", "sizes", "transport", "transport_evidence", "nics",
               "network_measurement", "groups", "nccl_tests_version",
               "ranks", "failed_step", "mfu_note", "nvml_available", "nvml_reason", "source")


def log_tail(run_dir_: Path) -> str:
    """The end of every log of the run, for classification and the error line."""
    parts = []
    for path in sorted((run_dir_ / rundir.LOGS_DIR).glob("*.log")):
        with open(path, "rb") as f:
            f.seek(0, io.SEEK_END)
            f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
            parts.append(f.read().decode(errors="replace"))
    return "\n".join(parts)


def summarize_run(spec: RunSpec, sweep: str, run_dir_: Path, outcome: Outcome, *,
                  est_mem_gib: float | None, git_rev: str | None, started_at: str) -> RunSummary:
    """Classify the run and lift the steady-state metrics out of its summary record."""
    records = rundir.read_records(run_dir_)
    text = log_tail(run_dir_)
    if spec.kind == "nccl":
        if not any(r["kind"] == "summary" for r in records):  # nccl-tests binary: parse its output
            records += records_from_logs(run_dir_, spec)
        records = [check_transport(r, spec, text) if r["kind"] == "summary" else r for r in records]
    summaries = [r for r in records if r["kind"] == "summary"]
    status, error = classify(outcome, summaries, text)
    summary = RunSummary(run_id=spec.run_id, sweep=sweep, status=status, spec=spec, error=error,
                         run_dir=str(run_dir_), est_mem_gib=est_mem_gib, git_rev=git_rev,
                         started_at=started_at, wall_s=outcome.wall_s, queue_s=outcome.queue_s)
    metas = sorted((r for r in records if r["kind"] == "meta"), key=lambda r: r.get("rank", 0))
    source = next((s for s in summaries if s.get("status") == status), summaries[0] if summaries else {})
    for key in ("device_name", "host"):
        setattr(summary, key, source.get(key) or (metas[0].get(key) if metas else None))
    summary.torch_version = source.get("torch_version") or (metas[0].get("torch") if metas else None)
    for key, value in source.items():
        if key in _SUMMARY_FIELDS and value is not None and getattr(summary, key) is None:
            setattr(summary, key, value)
    # Probe summaries name their bandwidths without the nccl_ prefix of the table.
    for key in ("busbw_avg_gbs", "busbw_max_gbs", "algbw_max_gbs", "transport"):
        if source.get(key) is not None:
            setattr(summary, f"nccl_{key}", source[key])
    summary.extra = {k: source[k] for k in _EXTRA_KEYS if k in source}
    if status != "ok" and not summary.error:
        summary.error = f"exit codes {outcome.returncodes}"
    dumps = sorted(run_dir_.glob(f"{TRACE_PREFIX}*"))
    if status != "ok" and dumps:  # the flight recorder's last collectives of each rank say which one lagged
        summary.error += (f"; NCCL flight recorder: {len(dumps)} rank dumps, read them with "
                          f"torchfrtrace {run_dir_} --prefix {TRACE_PREFIX}")
        summary.extra["nccl_trace_files"] = [p.name for p in dumps]
    return summary


def infeasible_summary(spec: RunSpec, sweep: str, run_dir_: Path, est_mem_gib: float | None,
                       reason: str | None) -> RunSummary:
    return RunSummary(run_id=spec.run_id, sweep=sweep, status="infeasible", spec=spec, error=reason,
                      run_dir=str(run_dir_), est_mem_gib=est_mem_gib)


def results_frame(sweep_dir: Path) -> Any:
    """All run summaries of a sweep dir as a DataFrame with the schema's columns, in a stable order."""
    import pandas as pd
    rows = [s.to_row() for d in rundir.iter_run_dirs(sweep_dir) if (s := rundir.read_summary(d))]
    frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    return frame.sort_values(["kind", "model", "sharding", "nodes", "repeat", "run_id"], kind="stable",
                             ignore_index=True)


def write_results(sweep_dir: Path) -> Any:
    """Write results.parquet and results.csv atomically; returns the frame."""
    frame = results_frame(sweep_dir)
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    rundir.atomic_write_bytes(sweep_dir / rundir.RESULTS_PARQUET, buf.getvalue())
    rundir.atomic_write_text(sweep_dir / rundir.RESULTS_CSV, frame.to_csv(index=False))
    return frame
