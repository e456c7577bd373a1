"""From run dirs to RunSummaries and the results table (one row per run, failed and infeasible too)."""
from __future__ import annotations

import datetime as dt
import io
import statistics
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from bench.core import rundir
from bench.core.config import PreflightConfig
from bench.core.records import RECORDS_DIR, parse_records, unreadable_records
from bench.core.schema import SUMMARY_COLUMNS, RunSpec, RunSummary
from bench.launchers.base import PROJECT_ROOT, TRACE_PREFIX, Outcome
from bench.probes.parse import printed_versions
from bench.probes.records import check_transport, run_records
from bench.run import straggler
from bench.run.classify import classify

_LOG_TAIL_BYTES = 64 * 1024
_LOG_HEAD_BYTES = 256 * 1024  # where NCCL and its plugin print their versions: at init, early in a log
_SUMMARY_FIELDS = {f.name for f in fields(RunSummary)} - {"run_id", "sweep", "status", "spec", "error",
                                                          "extra", "run_dir", "schema_version", "trace_split",
                                                          "trace_collectives", "trace_note"}
_EXTRA_KEYS = ("losses", "step_times_s", "per_rank", "sizes", "transport", "transport_evidence", "nics",
               "network_measurement", "groups", "nccl_tests_version",
               "ranks", "failed_step", "mfu_note", "nvml_available", "nvml_reason", "source",
               "backend", "collectives_per_step")


def _restarts(summary: RunSummary, outcome: Outcome, metas: list[dict[str, Any]]) -> None:
    """What started the run again: the scheduler's executions (a requeued Slurm job), torchrun's restart
    count (TORCHELASTIC_RESTART_COUNT in each worker's meta record). Left None where nothing can tell."""
    torchrun = max((int(m.get("restart_count") or 0) for m in metas), default=0)
    if torchrun:
        summary.extra["torchrun_restarts"] = torchrun
    if outcome.executions:
        summary.extra["executions"] = outcome.executions
    if not outcome.executions and not metas:
        return
    summary.restarts = max(len(outcome.executions) - 1, 0) + torchrun
    starts = [_when(e.get("start")) for e in outcome.executions]
    if len(starts) > 1 and None not in starts:
        summary.restart_lost_s = (starts[-1] - starts[0]).total_seconds()  # type: ignore[operator]


def _job_end(summary: RunSummary, outcome: Outcome) -> None:
    """The scheduler's own word on the job's end (its final condition, who ended it) and what its cleanup
    left behind with the command that removes it, kept in the summary where the launcher says them."""
    if outcome.condition or outcome.ended_by:
        summary.extra["job_end"] = {**(outcome.condition or {}), "ended_by": outcome.ended_by}
    if outcome.left_behind:
        summary.extra["left_behind"] = outcome.left_behind


def logs_note(run_dir_: Path) -> str:
    """What the run's logs hold, in a few words: where a run left no records, where to look and what for."""
    paths = sorted((run_dir_ / rundir.LOGS_DIR).glob("*.log"))
    if not paths:
        return "logs: none saved"
    size = sum(p.stat().st_size for p in paths)
    where = f"{len(paths)} in {run_dir_.name}/{rundir.LOGS_DIR}"
    return f"logs: {where}, all empty" if size == 0 else f"logs: {where}, {size} bytes, no summary record"


def _straggler(summary: RunSummary, tolerance: float) -> None:
    """The slowest node of the run by each rank's own compute (bench/run/straggler.py), named as its straggler
    where it held the others back by more than tolerance."""
    on_gpu = summary.device_name not in (None, "cpu")
    found = straggler.find(summary.extra.get("per_rank") or [], tolerance, name_ranks=on_gpu)
    if found is None:
        return
    summary.slowest_node, summary.slowest_node_excess, summary.slowest_node_held_s = (
        found.unit, found.excess, found.held_s)
    summary.straggler = found.unit if found.named else None


def trace_split(summary: RunSummary, traces: list[dict[str, Any]]) -> None:
    """The run's step split from its ranks' `trace` records (trainer/trace.py): per part the median over
    the ranks that split their trace, each rank's in extra; a run without one says why in trace_note.
    A trace that could not be split never changes the run's status."""
    if not traces:
        summary.trace_note = "no trace recorded (trace.enabled=false, or the worker wrote none)"
        return
    traces = sorted(traces, key=lambda r: r.get("rank", 0))
    summary.extra["trace_per_rank"] = [
        {k: r.get(k) for k in ("rank", "node", "file", "bytes", "record_s", "analyse_s", "step_times_s",
                               "error")}
        | {k: (r.get("split") or {}).get(k) for k in ("parts", "overlapped", "step_s", "unclassified",
                                                     "waiting_by_kind", "waiting_duration_rule", "premise")}
        for r in traces]
    splits = [r["split"] for r in traces if r.get("split")]
    failed = [f"rank {r.get('rank')}: {r.get('error')}" for r in traces if not r.get("split")]
    if failed:
        more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
        summary.trace_note = "; ".join(failed[:3]) + more + ("" if splits else "; no split")
    if not splits:
        return
    parts = {k: statistics.median(s["parts"][k] for s in splits) for k in splits[0]["parts"]}
    overlapped = {f"overlapped_{k}": statistics.median(s["overlapped"][k] for s in splits)
                  for k in splits[0]["overlapped"]}
    summary.trace_split = {**parts, **overlapped, "step_s": statistics.median(s["step_s"] for s in splits),
                           "unclassified": max(s["unclassified"] for s in splits)}
    if all("waiting_duration_rule" in s for s in splits):  # the other reading of waiting, and its premise
        summary.trace_split["waiting_duration_rule"] = statistics.median(
            s["waiting_duration_rule"] for s in splits)
        summary.trace_split |= {f"premise_{k}": max(s["premise"][k] for s in splits)
                                for k in ("checked", "contradicted", "at_stake_s")}
    kinds = sorted({k for s in splits for k in s["collectives"]})
    summary.trace_collectives = {
        k: {"bytes": max(s["collectives"].get(k, {}).get("bytes", 0) for s in splits),
            "s": statistics.median(s["collectives"][k]["s"] for s in splits if k in s["collectives"]),
            "count": max(s["collectives"].get(k, {}).get("count", 0) for s in splits)} for k in kinds}
    for k, rec in summary.trace_collectives.items():  # the waits in them and their group's ranks, if read
        if waits := [s["collectives"][k]["wait_s"] for s in splits
                     if "wait_s" in s["collectives"].get(k, {})]:
            rec["wait_s"] = statistics.median(waits)
        if ranks := max(s["collectives"].get(k, {}).get("ranks") or 0 for s in splits):
            rec["ranks"] = ranks


def _when(text: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text) if text else None
    except ValueError:  # "Unknown", "None": Slurm's words for a time it does not have
        return None


def log_head(run_dir_: Path) -> str:
    """The start of every log of the run: where NCCL prints its version (NCCL_DEBUG=INFO), at init."""
    parts = []
    for path in sorted((run_dir_ / rundir.LOGS_DIR).glob("*.log")):
        with open(path, "rb") as f:
            parts.append(f.read(_LOG_HEAD_BYTES).decode(errors="replace"))
    return "\n".join(parts)


def _record_lines(run_dir_: Path) -> list[str]:
    """The lines rundir.read_records reads records from (the rank files, else the logs): where a record
    cut short is found."""
    attempt = rundir.current_attempt_dir(run_dir_)
    files = (sorted((attempt / RECORDS_DIR).glob("*.jsonl"))
             or sorted((attempt / rundir.LOGS_DIR).glob("*.log")))
    lines: list[str] = []
    for path in files:
        with open(path, errors="replace") as f:
            lines.extend(f)
    return lines


def system_entries(run_dir_: Path, records: list[dict[str, Any]], printed: dict[str, list[str]],
                   backend: str | None) -> list[dict[str, Any]]:
    """One entry per node from the run's `system` records (bench/core/system.py), the last a node wrote:
    {"node", "source", "facts"}, the facts completed with what NCCL and aws-ofi-nccl printed in the logs
    (nccl_printed; aws_ofi_nccl where the plugin's file did not name it). A record cut short, garbled or
    without facts is an entry {"node", "unreadable": why}: the run keeps its status, the report says so."""
    by_node: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["kind"] != "system":
            continue
        node = str(r.get("node") or f"rank {r.get('rank')}")
        facts = r.get("facts")
        if not isinstance(facts, dict):
            why = r.get("error") or "no facts in the record"
            by_node[node] = {"node": node, "source": r.get("source"), "unreadable": f"the worker wrote {why}"}
            continue
        facts = dict(facts)
        facts["nccl_printed"] = ", ".join(printed.get("nccl", [])) or {"missing": (
            "no NCCL: the gloo backend (CPU)" if backend == "gloo" else
            "NCCL printed no version (NCCL_DEBUG=INFO or VERSION makes it)")}
        ofi = printed.get("aws_ofi_nccl", [])
        if ofi and isinstance(facts.get("aws_ofi_nccl"), dict):
            facts["aws_ofi_nccl"] = ", ".join(ofi)
        by_node[node] = {"node": node, "source": r.get("source"), "facts": facts}
    entries = list(by_node.values())
    entries += [{"node": None, "unreadable": f"cut short or garbled: {text}"}
                for text in unreadable_records(_record_lines(run_dir_), "system")]
    return entries


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
                  predicted: dict[str, Any], git_rev: str | None, started_at: str,
                  tolerance: float = PreflightConfig.tolerance) -> RunSummary:
    """Classify the run and lift the steady-state metrics out of its summary record."""
    records = run_records(run_dir_, spec)
    text = log_tail(run_dir_)
    if spec.kind == "nccl":
        records = [check_transport(r, spec, text) if r["kind"] == "summary" else r for r in records]
    summaries = [r for r in records if r["kind"] == "summary"]
    status, error = classify(outcome, summaries, text, logs_note(run_dir_))
    summary = RunSummary(run_id=spec.run_id, sweep=sweep, status=status, spec=spec, error=error,
                         run_dir=str(run_dir_), **predicted, git_rev=git_rev,
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
    printed = printed_versions(log_head(run_dir_))
    if source.get("nccl_version") and source["nccl_version"] not in printed["nccl"]:  # nccl-tests' header
        printed["nccl"].append(source["nccl_version"])
    systems = system_entries(run_dir_, records, printed, source.get("backend"))
    if systems:  # one per node: what it ran with (the report's system section, analysis/system.py)
        summary.extra["system"] = systems
    _restarts(summary, outcome, metas)
    _job_end(summary, outcome)
    if status == "ok":
        _straggler(summary, tolerance)
        trace_split(summary, [r for r in records if r["kind"] == "trace"])
    nccl = source.get("nccl_version") or (metas[0].get("nccl") if metas else None)  # probe, or a GPU worker
    if nccl:
        summary.extra["nccl_version"] = nccl
    if status != "ok" and not summary.error:
        summary.error = f"exit codes {outcome.returncodes}"
    dumps = sorted(run_dir_.glob(f"{TRACE_PREFIX}*"))
    if status != "ok" and dumps:  # the flight recorder's last collectives of each rank say which one lagged
        summary.extra["nccl_trace_files"] = [p.name for p in dumps]
        lagging = status in LAGGING_STATUSES and spec.world_size > 1  # one rank cannot lag behind another
        found = flight_recorder(run_dir_, spec.world_size) if lagging else None
        hosts = {m.get("rank"): m.get("host") for m in metas}
        if found is not None:
            summary.extra["flight_recorder"] = found
            summary.error = f"{lagging_ranks(found, hosts)}; {summary.error}"
        else:
            summary.error += (f"; NCCL flight recorder: {len(dumps)} rank dumps, read them with "
                              f"torchfrtrace {run_dir_} --prefix {TRACE_PREFIX}")
    return summary


LAGGING_STATUSES = ("timeout", "nccl_error")  # a rank late or dead, the others waiting in a collective


def flight_recorder(run_dir_: Path, world: int) -> dict[str, Any] | None:
    """torch's flight-recorder analysis of the run's dumps (`python -m trainer.flight`, a worker command:
    bench never imports torch); None where it cannot run here."""
    argv = [sys.executable, "-m", "trainer.flight", str(run_dir_), "--prefix", TRACE_PREFIX,
            "--world", str(world)]
    try:
        proc = subprocess.run(argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((r for r in parse_records(proc.stdout.splitlines()) if r["kind"] == "flight"), None)


def _ranks(ranks: list[int], hosts: dict[Any, Any]) -> str:
    named = [f"{r} ({hosts[r]})" if hosts.get(r) else str(r) for r in ranks]
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(named)}"


def lagging_ranks(found: dict[str, Any], hosts: dict[Any, Any]) -> str:
    """The flight recorder's answer in one clause: who did not reach which collective, and what the dumps
    could not tell (missing or unreadable dumps, ranks that disagree)."""
    c = found.get("collective")
    if c and c.get("missing_ranks"):
        waiting = sorted(set(c["expected_ranks"]) - set(c["missing_ranks"]))
        text = (f"flight recorder: {_ranks(c['missing_ranks'], hosts)} never reached {c['op']} #{c['seq']} "
                f"(sizes {c['sizes']}) that {_ranks(waiting, hosts)} waited in")
    elif c:
        text = f"flight recorder: the ranks disagree at {c['op']} #{c['seq']} ({c.get('mismatch')})"
    elif found.get("analyzer_error"):
        text = f"flight recorder: the dumps could not be matched ({found['analyzer_error']})"
    elif found.get("missing_dumps") or found.get("unreadable"):
        text = (f"flight recorder: incomplete: the dumps of {_ranks(found.get('dumps', []), hosts)} show no "
                "collective another rank missed")
    else:
        text = (f"flight recorder: every rank joined every recorded collective (last "
                f"#{found.get('last_matched_seq')}): the dumps name no lagging rank")
    if found.get("missing_dumps"):
        text += f"; {_ranks(found['missing_dumps'], hosts)} left no dump"
    for rank, why in found.get("unreadable", {}).items():
        text += f"; rank {rank}'s dump is unreadable ({why})"
    return text


def infeasible_summary(spec: RunSpec, sweep: str, run_dir_: Path, predicted: dict[str, Any],
                       reason: str | None) -> RunSummary:
    return RunSummary(run_id=spec.run_id, sweep=sweep, status="infeasible", spec=spec, error=reason,
                      run_dir=str(run_dir_), **predicted)


def results_frame(sweep_dir: Path) -> Any:
    """All run summaries of a sweep dir as a DataFrame with the schema's columns, in a stable order."""
    import pandas as pd
    rows = [s.to_row() for s in rundir.read_summaries(sweep_dir)]
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
