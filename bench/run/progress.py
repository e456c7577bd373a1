"""Live progress of a sweep: runs done, failed, every run in flight (nodes, elapsed), nodes busy, ETA.

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
    def __init__(self, total: int, enabled: bool = True, budget: int | None = None,
                 stream: TextIO | None = None) -> None:
        self.total = total
        self.budget = budget  # node budget of runs in flight (None: one run at a time)
        self.enabled = enabled
        self.stream = stream or sys.stdout  # the stdout of when the sweep starts, not of this module's import
        self.counts: Counter[str] = Counter()
        self.durations: list[float] = []
        self.running: dict[str, tuple[int, float]] = {}  # label -> (nodes, start time)
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
        """Median run time x runs left, divided by how many run side by side now."""
        if not self.durations:
            return None
        return statistics.median(self.durations) * (self.total - self.done) / max(1, len(self.running))

    def status_line(self) -> str:
        parts = [f"{k} {v}" for k, v in sorted(self.counts.items())]
        now = time.monotonic()
        if self.running:
            busy = sum(n for n, _ in self.running.values())
            parts.append(f"nodes {busy}/{self.budget} busy" if self.budget is not None
                         else f"nodes {busy} busy, one run at a time")
            parts.append("running " + ", ".join(f"{label} ({n}n {_fmt_s(now - t)})"
                                                for label, (n, t) in self.running.items()))
        if self.durations:
            parts.append(f"{_fmt_s(statistics.median(self.durations))}/run")
        eta = self.eta_s()
        if eta is not None:
            parts.append(f"ETA {_fmt_s(eta)}")
        return " · ".join(parts)

    def start(self, label: str, nodes: int = 1) -> None:
        self.running[label] = (nodes, time.monotonic())
        self._refresh(f"[{self.done + len(self.running)}/{self.total}] start {label} ({nodes} node"
                      f"{'s' if nodes != 1 else ''})")

    def tick(self) -> None:
        if self._rich:
            self._rich.update(self._task, status=self.status_line())

    def finish(self, label: str, status: str, duration_s: float | None, note: str | None = None,
               queued_s: float | None = None, left: str | None = None) -> None:
        """One line for a run that ended: its run time, else (it never ran) its time in the queue; its note
        (cut), and in full what its cleanup left behind with the command that removes it."""
        self.counts[status] += 1
        if duration_s is not None:
            self.durations.append(duration_s)
        self.running.pop(label, None)
        line = f"[{self.done}/{self.total}] {status:<16} {label}"
        if duration_s is not None:
            line += f" ({duration_s:.1f}s)"
        elif queued_s is not None:
            line += f" (never ran, {queued_s:.1f}s in the queue)"
        if note:
            line += f": {note[:200]}"
        if left:
            line += f"; {left}"
        self._refresh(line)

    def _refresh(self, line: str) -> None:
        if self._rich:
            self._rich.update(self._task, completed=self.done, status=self.status_line())
            self._rich.console.print(line, highlight=False, markup=False)
        elif self.enabled:
            self.stream.write(line + ("  | " + self.status_line() if self.done else "") + "\n")
            self.stream.flush()
