"""Metric records out of the worker: one line on stdout and, when it can, the run dir's record file."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn, TextIO

from bench.rundir import records_path
from bench.schema import format_record


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
