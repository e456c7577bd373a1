"""Metric records: how a worker writes them and the one parser that finds them again.

A record is a JSON object on one line after RECORD_PREFIX, so it can be found in any log stream
(kubectl logs, srun -l, mpirun --tag-output, timestamps, ANSI colours). Each rank also appends its records
to `<run dir>/records/rank<N>.jsonl` where the run dir is shared; stdout stays the transport where not.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import math
import os
import re
import socket
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TextIO

from bench.core.schema import SCHEMA_VERSION

RECORD_PREFIX = "@@fsdpbench@@ "
# memory, flight and census: the worker commands' answers
# trace: a rank's profiled steps and their split (trainer/trace.py)
# system: what one node ran with (bench/core/system.py), one per node and run
RECORD_KINDS = ("meta", "step", "summary", "nvml", "nccl", "memory", "flight", "census", "preflight", "trace",
                "system")
RECORDS_DIR = "records"
TRACE_DIR = "trace"
# The worker's process-group timeout, from the harness (bench.launchers.base.job_env): a collective that
# waits longer fails the run, and its ranks leave flight-recorder dumps (trainer/flight.py).
COLLECTIVE_TIMEOUT_ENV = "FSDPBENCH_COLLECTIVE_TIMEOUT_S"


def records_path(run_dir: Path, rank: int) -> Path:
    """Where a rank appends its records inside a run's attempt dir."""
    return run_dir / RECORDS_DIR / f"rank{rank}.jsonl"


def trace_path(run_dir: Path, rank: int) -> Path:
    """Where a rank writes its profiler trace inside a run's attempt dir (gzip-compressed Chrome trace JSON,
    which Perfetto and chrome://tracing open as it is)."""
    return run_dir / TRACE_DIR / f"rank{rank}.pt.trace.json.gz"


def error_line(e: BaseException) -> str:
    """An exception as a worker command's answer reports it: its type and first line, cut to 300."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"


# Slurm's count of a job's requeues (sbatch sets it in the job's environment; srun and torchrun pass it on):
# a requeued job appends a second execution's records to the first's, and only the last one counts
EXECUTION_ENV = "SLURM_RESTART_COUNT"


def execution() -> int:
    """Which execution of its job this worker is (0: the first)."""
    try:
        return int(os.environ.get(EXECUTION_ENV, "0"))
    except ValueError:
        return 0


def format_record(kind: str, **payload: Any) -> str:
    """One metric record as a line (no newline). Non-finite floats become null to stay valid JSON. A
    requeued job's records name their execution."""
    if kind not in RECORD_KINDS:
        raise ValueError(f"record kind={kind!r} is not one of: {', '.join(RECORD_KINDS)}")
    body = {"v": SCHEMA_VERSION, "kind": kind, **({"execution": n} if (n := execution()) else {}), **payload}
    return RECORD_PREFIX + json.dumps(_finite(body), separators=(",", ":"), default=str)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_DECODER = json.JSONDecoder()


def parse_records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Yield every metric record found in a log stream, whatever prefixes the launcher added.

    Lines cut short (a crash mid-write, a truncated file) are skipped, not fatal.
    """
    for line in lines:
        at = line.find(RECORD_PREFIX)
        if at < 0:
            continue
        text = line[at + len(RECORD_PREFIX):]
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        try:
            obj, _ = _DECODER.raw_decode(text.strip())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("kind") in RECORD_KINDS:
            yield obj


def unreadable_records(lines: Iterable[str], kind: str) -> Iterator[str]:
    """Lines that carry a record of `kind` (its prefix and kind) but no readable one: cut short by a crash
    or a full disk, or garbled; each as its first 120 characters. parse_records skips them silently."""
    mark = f'"kind":"{kind}"'
    for line in lines:
        at = line.find(RECORD_PREFIX)
        if at < 0 or mark not in line:
            continue
        text = _ANSI.sub("", line[at + len(RECORD_PREFIX):]).strip()
        try:
            obj, _ = _DECODER.raw_decode(text)
        except json.JSONDecodeError:
            yield text[:120]
            continue
        if not isinstance(obj, dict) or obj.get("kind") not in RECORD_KINDS:  # another kind's is readable
            yield text[:120]


class Emitter:
    """Writes records for one rank; safe to call from the sampler thread."""

    def __init__(self, rank: int, run_id: str, run_dir: Path | None, stream: TextIO = sys.stdout) -> None:
        self.rank = rank
        self.run_id = run_id
        self.stream = stream
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self.file_error: str | None = None
        if run_dir is not None:
            try:
                path = records_path(run_dir, rank)
                path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(path, "a", buffering=1)
            except OSError as e:  # no shared file system: stdout stays the transport
                self.file_error = str(e)

    def __call__(self, kind: str, **payload: Any) -> None:
        line = format_record(kind, rank=self.rank, run_id=self.run_id, **payload) + "\n"
        with self._lock:
            self.stream.write(line)
            self.stream.flush()
            if self._file:
                self._file.write(line)

    def close(self) -> None:
        with self._lock:
            if self._file:
                self._file.close()
                self._file = None


def exit_now(code: int) -> NoReturn:
    """Leave a worker without interpreter teardown. Every record is written by now, but after
    destroy_process_group gloo's threads can still abort the process from C++ static destructors
    ("terminate called without an active exception", SIGABRT), which would turn an ok run into a
    failed one; _exit skips those destructors."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def node_name() -> str:
    """The scheduler's name for this node (Slurm's, a Kubernetes node's from the downward API), else the
    host name: several Slurm nodes may share one host."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("FSDPBENCH_NODE_NAME") or socket.gethostname()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """This process's C library, loaded once (before any fork that sets a death signal); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def can_set_death_signal() -> bool:
    """Whether set_death_signal works here (Linux); loads the C library now, so a child after a fork need
    not."""
    return _libc() is not None


def set_death_signal(sig: int) -> None:
    """The kernel sends this process `sig` when the thread that started it ends (PR_SET_PDEATHSIG): the
    sweep's jobs, its warm process and that process's children die with whoever started them, `kill -9`
    included. Nothing off Linux."""
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def process_start_time(pid: int | str = "self") -> int | None:
    """Start time of a process in clock ticks since boot (/proc/<pid>/stat field 22): with the pid it
    names one process for good, even after the pid is reused; None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])
