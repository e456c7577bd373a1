"""What Slurm says of the Slurm launcher's jobs in flight, asked for all of them at once: one `squeue` a look
(ended jobs the controller still holds included), and one `sacct` for the jobs that left the queue since the
last look. Every user of a cluster shares its controller: requests of each job at each poll grow with the
jobs in flight (all of a study's, where Slurm admits them), one look does not. The next look comes `least_s`
(launcher.poll_s) after a change and later while nothing changes, up to LOOK_MAX_S; a poll between two looks
reads the last one.
"""
from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# squeue states: waiting for resources (queue time, bounded by queue_timeout_s), and holding them
# (run time, bounded by timeout_s). A job in neither has left the queue.
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# each look that finds nothing changed waits this much longer for the next: a job's end is seen late by about
# a tenth of the quiet time before it at most, so the harness, which starts a run as one ends, barely waits
LOOK_GROWTH = 1.1
# the longest a job's end goes unseen while no other job changes: a twelfth of what a cluster run costs
# before its first step (base.CLUSTER_STARTUP_S)
LOOK_MAX_S = 10.0
QUEUE_FIELDS = ("JobID", "State", "Reason", "NodeList", "exit_code")
# sacct's fields of an execution, and the keys an execution is recorded under (the run's ledger, summary)
EXECUTION_FIELDS = {"State": "state", "NodeList": "nodes", "Start": "start", "End": "end",
                    "ExitCode": "exit_code"}

Ask = Callable[[list[str]], subprocess.CompletedProcess]  # runs a Slurm command, never raising on its exit


@dataclass(frozen=True)
class Row:
    """A job as squeue shows it. `state` None: the controller no longer holds it (MinJobAge after its end)."""

    state: str | None
    reason: str | None = None
    nodes: str | None = None
    exit_code: int | None = None  # the batch script's, once the job has ended

    @property
    def in_queue(self) -> bool:
        return self.state in PENDING_STATES or self.state in RUNNING_STATES


GONE = Row(None)


def ask_queue(ask: Ask, job_ids: list[str]) -> dict[str, Row] | None:
    """squeue's row of each job (GONE for one the controller no longer holds), or None where it did not
    answer. One request for them all: `-t all` keeps the ended jobs it holds, so their state, reason and exit
    code come with the rest."""
    spec = ",".join(f"{name}:|" for name in QUEUE_FIELDS)  # no width (nothing cut), '|' after each field
    proc = ask(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-O", spec])
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:  # a lone job id it no longer holds
        return None
    rows = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        job, state, reason, nodes, status = (line.split("|") + [""] * 5)[:5]
        rows[job] = Row(state or None, None if reason in ("", "None") else reason, nodes or None,
                        exit_code(status))
    return {job: rows.get(job, GONE) for job in job_ids}


def exit_code(status: str) -> int | None:
    """The batch script's exit code from squeue's exit_code (the wait status: code << 8 | signal), or from
    sacct's and scontrol's "code:signal"."""
    if not status.strip():
        return None
    return int(status.split(":")[0]) if ":" in status else int(status) >> 8


def ask_accounting(ask: Ask, job_ids: list[str]) -> dict[str, list[dict[str, str]]]:
    """sacct's record of each time Slurm ran each job (a requeued job runs again under its id), oldest
    first, in one request; no entry for a job accounting does not have (none without a slurmdbd)."""
    proc = ask(["sacct", "-n", "-D", "-X", "-P", "-j", ",".join(job_ids), "-o",
                ",".join(["JobID", *EXECUTION_FIELDS])])
    found: dict[str, list[dict[str, str]]] = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        job, *values = line.split("|")
        found.setdefault(job, []).append(dict(zip(EXECUTION_FIELDS.values(), values)))
    return found


@dataclass
class Board:
    """The jobs in flight and what the last look said of each; a job is on it from its submission (or
    re-attachment) to its cleanup."""

    ask: Ask
    least_s: float
    clock: Callable[[], float] = time.monotonic
    rows: dict[str, Row | None] = field(default_factory=dict)  # None: not looked at yet (just submitted)
    runs: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # sacct's, of the jobs that left
    wait_s: float = 0.0  # from the last look to the next
    last_at: float = -math.inf

    def add(self, job_id: str, row: Row | None = None) -> None:
        """A job now in flight: the next look, `least_s` after the last, asks about it."""
        self.rows[job_id] = row
        self.wait_s = self.least_s

    def drop(self, job_id: str) -> None:
        self.rows.pop(job_id, None)
        self.runs.pop(job_id, None)

    def row(self, job_id: str) -> Row | None:
        """The job's row as of the last look, taken now for every job in flight where one is due; None before
        the job's first look."""
        if job_id not in self.rows:
            self.add(job_id)
        if self.clock() >= self.last_at + self.wait_s:
            self.look(sorted(self.rows))
        return self.rows.get(job_id)

    def look(self, job_ids: list[str]) -> None:
        """One squeue for the jobs, one sacct for those of them that left the queue since; where the
        controller does not answer, what it said last stands until the next look."""
        rows = ask_queue(self.ask, job_ids)
        self.last_at = self.clock()
        if rows is None:
            return
        left = [job for job, row in rows.items() if not row.in_queue and job not in self.runs]
        if left:
            found = ask_accounting(self.ask, left)
            self.runs |= {job: found.get(job, []) for job in left}
        changed = any(moved(self.rows.get(job), row) for job, row in rows.items())
        self.rows |= rows
        self.wait_s = self.least_s if changed else min(self.wait_s * LOOK_GROWTH, LOOK_MAX_S)


def moved(before: Row | None, now: Row) -> bool:
    """Whether a job changed from one look to the next: seen for the first time, in another state or on
    other nodes (a pending job's reason may change at every scheduling pass: not a change)."""
    return before is None or (before.state, before.nodes) != (now.state, now.nodes)
