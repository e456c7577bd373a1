"""Live progress of a sweep: runs done, failed, running, time per run, ETA.

A rich progress bar on a terminal; one plain line per event otherwise (CI logs, `| tee`).
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import Counter
from typing import Any, TextIO


def _fmt_s(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else (
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s")


class Progress:
    def __init__(self, total: int, enabled: bool = True, stream: TextIO = sys.stdout) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream
        self.counts: Counter[str] = Counter()
        self.durations: list[float] = []
        self.current: str | None = None
        self.current_started = 0.0
        self._rich: Any = None
        self._task: Any = None
        self._closed = threading.Event()

    def __enter__(self) -> Progress:
        if self.enabled and self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn
            self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[status]}"), transient=False)
            self._rich.__enter__()
            self._task = self._rich.add_task("sweep", total=self.total, status="")
            self._ticker = threading.Thread(target=self._tick_loop, daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        if self._rich:
            self._rich.__exit__(*exc)

    def _tick_loop(self) -> None:
        """Keep the running time and ETA moving while the sweep waits on a run."""
        while not self._closed.wait(1.0):
            self.tick()

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def eta_s(self) -> float | None:
        if not self.durations:
            return None
        return statistics.median(self.durations) * (self.total - self.done)

    def status_line(self) -> str:
        parts = [f"{k} {v}" for k, v in sorted(self.counts.items())]
        if self.current:
            parts.append(f"running {self.current} {_fmt_s(time.monotonic() - self.current_started)}")
        if self.durations:
            parts.append(f"{_fmt_s(statistics.median(self.durations))}/run")
        eta = self.eta_s()
        if eta is not None:
            parts.append(f"ETA {_fmt_s(eta)}")
        return " · ".join(parts)

    def start(self, label: str) -> None:
        self.current, self.current_started = label, time.monotonic()
        self._refresh(f"[{self.done + 1}/{self.total}] start {label}")

    def tick(self) -> None:
        if self._rich:
            self._rich.update(self._task, status=self.status_line())

    def finish(self, label: str, status: str, duration_s: float | None, note: str | None = None) -> None:
        self.counts[status] += 1
        if duration_s is not None:
            self.durations.append(duration_s)
        self.current = None
        line = f"[{self.done}/{self.total}] {status:<16} {label}"
        if duration_s is not None:
            line += f" ({duration_s:.1f}s)"
        if note:
            line += f": {note[:200]}"
        self._refresh(line)

    def _refresh(self, line: str) -> None:
        if self._rich:
            self._rich.update(self._task, completed=self.done, status=self.status_line())
            self._rich.console.print(line, highlight=False, markup=False)
        elif self.enabled:
            self.stream.write(line + ("  | " + self.status_line() if self.done else "") + "\n")
            self.stream.flush()
