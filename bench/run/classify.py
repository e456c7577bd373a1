"""Turn what a launcher saw and what the worker reported into one status of the taxonomy.

The worker's own summary is the best evidence (it knows an OOM from a NaN); scheduler states (Slurm,
Kubernetes) come next; the text patterns below are the last resort when a worker died without a
summary. They are the only log patterns in the project besides the two parsers (records, nccl-tests).
"""
from __future__ import annotations

import math
import re
from typing import Any

from bench.launchers.base import ENDED_BY_DELETION, Outcome, condition_text

_FAILURE_PRIORITY = ("oom", "nan_loss", "nccl_error", "rendezvous_error", "failed")

_TEXT_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|oom-kill|OOMKilled|"
                       r"out of memory|Killed process \d+", re.I)),
    ("nccl_error", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
                              r"ncclRemoteError|NCCL WARN .*(?:failed|error)|DistBackendError|"
                              # gloo's collective timeout (CPU runs): the same failure as NCCL's watchdog
                              r"Timed out waiting \d+ms for (?:send|recv) operation", re.I)),
    ("rendezvous_error", re.compile(r"RendezvousTimeoutError|RendezvousClosedError|"
                                    r"RendezvousConnectionError|rendezvous.*(?:timed out|failed)|"
                                    r"The server socket has failed to listen|EADDRINUSE|"
                                    r"address already in use", re.I)),
    ("launch_error", re.compile(r"No module named|command not found|No such file or directory: '|"
                                r"exec format error|Permission denied|"
                                # Open MPI's mpirun could not start its daemons over ssh (MPIJob workers)
                                r"ORTE was unable to reliably start one or more daemons|"
                                r"ssh: connect to host \S+ port \d+: Connection refused", re.I)),
]

# NCCL's watchdog (torch ProcessGroupNCCL.cpp): the commonest failure of a multi-node run.
_WATCHDOG = re.compile(r"\[Rank (\d+)\] Watchdog caught collective operation timeout: "
                       r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+).*?\) ran for (\d+) milliseconds")
# torch's desync report (TraceUtils.h, TORCH_NCCL_DESYNC_DEBUG=1): who lagged, in its three forms. The
# ranks it names sit at the lowest sequence number: never joined any collective, stuck inside one, or done
# with one and never at the next (the one the other ranks wait in).
_NEVER_JOINED = re.compile(r"ranks \[([\d, ]+)\] are the lagging ranks that caused this timeout")
_DID_NOT_FINISH = re.compile(r"\[([\d, ]+)\] joined but didn't finish collective #(\d+)")
_NOT_AT_NEXT = re.compile(r"\[([\d, ]+)\] finished collective #(\d+), but didn't join collective #(\d+)")
# torchrun's ChildFailedError summary: the root cause's rank, host and exit code (negative: a signal).
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:(.*?)(?:\n=|$)", re.S)
_FIELD = re.compile(r"^\s*(host|rank|exitcode)\s*:\s*(\S+)", re.M)


def desync(text: str) -> str | None:
    """The lagging ranks and collective torch's desync report names, in one clause; None without one."""
    if lagging := _NEVER_JOINED.search(text):
        return f"desync report: ranks [{lagging.group(1)}] never joined any collective"
    if lagging := _DID_NOT_FINISH.search(text):
        return (f"desync report: ranks [{lagging.group(1)}] joined but did not finish collective "
                f"#{lagging.group(2)}")
    if lagging := _NOT_AT_NEXT.search(text):
        ranks, done, waited = lagging.groups()
        return (f"desync report: ranks [{ranks}] finished collective #{done} but never joined #{waited}, "
                "which the other ranks waited in")
    return None


def diagnose(text: str) -> tuple[str, str] | None:
    """(status, reason) for the failures whose texts say more than any single error line: an NCCL watchdog
    timeout (the collective, its sequence number, the lagging ranks when torch's desync report names
    them), and a rank killed by SIGKILL (exit code -9 in torchrun's summary)."""
    if watchdog := _WATCHDOG.search(text):
        rank, seq, op, ms = watchdog.groups()
        reason = (f"NCCL watchdog timeout: {op} #{seq} did not finish on rank {rank} "
                  f"within {int(ms) / 1000:.0f} s")
        return "nccl_error", f"{reason}; {report}" if (report := desync(text)) else reason
    if report := desync(text):
        return "nccl_error", report
    if root := _ROOT_CAUSE.search(text):
        fields = dict(_FIELD.findall(root.group(1)))
        if fields.get("exitcode") == "-9":
            status = "oom" if classify_text(text) == "oom" else "failed"  # the kernel's OOM line beside it
            return status, (f"rank {fields.get('rank', '?')} on {fields.get('host', '?')} was killed by "
                            "SIGKILL (exitcode -9): the host's OOM killer or the scheduler; see the node's "
                            "dmesg or the scheduler's log")
    return None


# Scheduler states -> status (Slurm job states, Kubernetes container/condition reasons).
SCHEDULER_STATES: dict[str, str] = {
    "OUT_OF_MEMORY": "oom", "OOMKilled": "oom",
    "TIMEOUT": "timeout", "DeadlineExceeded": "timeout",
    "NODE_FAIL": "failed", "BOOT_FAIL": "launch_error", "PREEMPTED": "cancelled",
    "CANCELLED": "cancelled", "DEADLINE": "timeout",
    "ImagePullBackOff": "launch_error", "ErrImagePull": "launch_error", "InvalidImageName": "launch_error",
    "CreateContainerConfigError": "launch_error", "Unschedulable": "launch_error",
    "Evicted": "failed", "NodeLost": "failed",
}


def error_line(text: str, last_line: bool = True) -> str | None:
    """The most telling line of a log: the last one that names an error, else (last_line) its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.search(r"error|exception|killed|failed|fatal", line, re.I) and "Warning" not in line:
            return line[-500:]
    return lines[-1][-500:] if lines and last_line else None


def classify_text(text: str) -> str | None:
    for status, pattern in _TEXT_PATTERNS:
        if pattern.search(text):
            return status
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def valid_throughput(summary: dict[str, Any]) -> bool:
    """Training: tokens/s > 0. All-reduce probe: algbw > 0 (busbw is 0 by definition on one rank)."""
    if "busbw_avg_gbs" in summary:
        return _positive(summary.get("algbw_max_gbs"))
    return _positive(summary.get("tokens_per_s"))


def _worst(failures: list[dict[str, Any]]) -> dict[str, Any]:
    return min(failures, key=lambda s: _FAILURE_PRIORITY.index(s["status"])
               if s["status"] in _FAILURE_PRIORITY else len(_FAILURE_PRIORITY))


def _harness_reason(outcome: Outcome) -> tuple[str, str] | None:
    """(status, reason) where the runner itself ended the job: Ctrl-C, the run timeout, the queue timeout.
    Whatever the workers wrote then is the echo of that (gloo's "Connection closed by peer" after our
    SIGTERM), never the cause."""
    if outcome.cancelled:
        return "cancelled", "cancelled by the user (Ctrl-C / SIGTERM)"
    if outcome.timed_out:
        requeued = (outcome.execution or 1) > 1
        execution = f" of execution {outcome.execution} (the job was requeued)" if requeued else ""
        return "timeout", (f"no result within the run's time limit ({outcome.wall_s or 0:.0f} s{execution}); "
                           "killed by the harness")
    if outcome.queue_timed_out:
        return "launch_error", outcome.launch_error or "gave up in the queue"
    if outcome.ended_by == ENDED_BY_DELETION:  # not the runner, but as much from outside the job
        return "cancelled", outcome.detail or ENDED_BY_DELETION
    return None


def _has_verdict(outcome: Outcome) -> bool:
    """The scheduler said how the job ended: then a probe summary that only says nccl-tests printed
    nothing is no evidence of its own (the job never got so far, or its logs are gone)."""
    return bool(outcome.condition or outcome.ended_by or outcome.scheduler_state in SCHEDULER_STATES
                or outcome.launch_error or outcome.error)


def _job_verdict(outcome: Outcome, log_text: str, logs: str) -> tuple[str, str] | None:
    """The job's own final condition where its workers left nothing that says more (Kubernetes: the
    operator's): Failed in its reason and message, with the workers' last error line if any; Succeeded
    without one record, which no run's figures can come from."""
    condition = outcome.condition
    if not condition:
        return None
    if condition["type"] == "Failed":
        said = condition_text(condition)
        last = error_line(log_text, last_line=False)
        return "failed", f"{said}; the workers' last error: {last}" if last else said
    return "failed", f"the job succeeded but its pods left no records ({logs})"


def classify(outcome: Outcome, summaries: list[dict[str, Any]], log_text: str, logs: str = "logs: not read"
             ) -> tuple[str, str | None]:
    """(status, error line). A run is ok only with an ok summary, valid throughput and clean exits. `logs`
    says in a few words what the run's logs held (bench.run.collect.logs_note), for a run without records."""
    if _has_verdict(outcome):
        summaries = [s for s in summaries if not s.get("no_output")]
    failures = [s for s in summaries if s.get("status") not in (None, "ok")]
    if harness := _harness_reason(outcome):  # the runner ended it: its reason first, the worker's after
        last = _worst(failures).get("error") if failures else error_line(log_text, last_line=False)
        status, reason = harness
        return status, f"{reason}; the worker's last error: {last}" if last else reason
    if failures:
        worst = _worst(failures)
        status = worst["status"]
        if status == "failed":
            status = classify_text(worst.get("error") or "") or "failed"
        report = desync(log_text) if status in ("nccl_error", "failed") else None
        return status, f"{report}; {worst.get('error')}" if report else worst.get("error")
    if outcome.launch_error:
        return "launch_error", outcome.launch_error
    if outcome.error:
        return "failed", outcome.error
    if outcome.scheduler_state and outcome.scheduler_state in SCHEDULER_STATES:
        mapped = SCHEDULER_STATES[outcome.scheduler_state]
        return mapped, outcome.detail or f"scheduler state {outcome.scheduler_state}"
    ok = [s for s in summaries if s.get("status") == "ok"]
    clean = all(c == 0 for c in outcome.returncodes)
    if ok and clean:
        if valid_throughput(ok[0]):
            return "ok", None
        return "failed", "summary has no valid throughput"
    if ok and not clean:
        return "failed", f"worker reported ok but exited with {outcome.returncodes}: " + (
            error_line(log_text) or "")
    if known := diagnose(log_text):
        return known
    status = classify_text(log_text)
    if status is None and (verdict := _job_verdict(outcome, log_text, logs)):
        return verdict
    status = status or "failed"
    if outcome.returncodes and all(c == 127 for c in outcome.returncodes):
        status = "launch_error"
    return status, error_line(log_text) or f"exit codes {outcome.returncodes}, no summary"
