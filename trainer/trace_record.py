"""Recording a run's profiler trace: after its timed steps a rank runs `steps` more under torch.profiler
(the throughput figures stay those of unprofiled steps), each inside a STEP_RANGE range, and writes a
gzip-compressed Chrome trace (Perfetto, chrome://tracing) named by rank, carrying the torch version that wrote
it (META_KEY). Reading it back is trainer/trace.py's."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainer.trace import META_KEY, STEP_RANGE

# What kineto writes to standard error at every profiler start and stop, at its highest log level (USDT,
# above ERROR: no KINETO_LOG_LEVEL silences it without silencing kineto's errors): the trace's bounds, not
# news, which a run's log would otherwise repeat in every traced run.
KINETO_NOTICE = re.compile(rb"USDT:.*\] profiler_(start|stop)")


@contextlib.contextmanager
def without_kineto_notices() -> Iterator[None]:
    """Standard error (fd 2, where C++ writes too) held while the profiler starts or stops, then written
    back without kineto's start and stop notices (KINETO_NOTICE); anything else it wrote is kept."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if not KINETO_NOTICE.match(line)]
            if kept:
                os.write(2, b"".join(kept))


GZIP_LEVEL = 6  # zlib's default: a tiny CPU run's 8 MB trace in 0.1 s where torch's 9 takes 0.5 s, 12% larger


def write_compressed(prof: Any, path: Path) -> None:
    """The profiler's Chrome trace, gzip-compressed at GZIP_LEVEL into `path` (torch's own .gz export
    compresses at level 9: five times the time of every rank of every traced run, for a tenth less size).
    As torch's does, it exports the uncompressed JSON to a temporary file of this node's own first (never
    to the run dir, a shared filesystem that may be small or slow), removed whatever happens; so only the
    compressed write can fail for the run dir's space, as an OSError."""
    with tempfile.NamedTemporaryFile("w+b", suffix=".json") as raw:
        prof.export_chrome_trace(raw.name)
        # opened again by name: kineto writes its own .tmp file and renames it over this one
        with open(raw.name, "rb") as fin, gzip.open(path, "wb", compresslevel=GZIP_LEVEL) as fout:
            shutil.copyfileobj(fin, fout)


def record(run_step: Callable[[int], None], steps: range, path: Path | None, cuda: bool,
           meta: dict[str, Any]) -> tuple[list[float], str | None]:
    """Run `steps` (every rank must: they hold collectives), each inside a STEP_RANGE range, under
    torch.profiler where `path` is set, and write the trace there; returns each step's seconds by
    perf_counter, the clock the split is checked against, and why no trace was written where the write
    failed (a full disk): the run keeps its figures, its split says why it has none."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    times: list[float] = []

    def one(step: int) -> None:
        began = time.perf_counter()
        with record_function(STEP_RANGE):
            run_step(step)
        times.append(time.perf_counter() - began)
    if path is None:
        for step in steps:
            one(step)
        return times, None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, record_shapes=True)
    with without_kineto_notices():
        prof.__enter__()
    try:
        prof.add_metadata_json(META_KEY, json.dumps({**meta, "torch": torch.__version__}))
        for step in steps:
            one(step)
    finally:
        with without_kineto_notices():
            prof.__exit__(None, None, None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_compressed(prof, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            path.unlink()  # no half-written trace left behind
        return times, f"trace not written to {path.parent} ({e.strerror or e})"
    return times, None


