"""A full disk under the results directory: one line naming it and the space a write needed, exit 4,
every finished run kept, the sweep dir's lock released, and the same command resumes once there is space.

On a real tiny filesystem (a 160 KiB tmpfs, as root) where one can be mounted, and with ENOSPC injected into
the results table's write otherwise.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import sweep
from bench.core import rundir
from conftest import SMOKE_SHAPE

ROOT = Path(__file__).resolve().parents[1]
TINY = ["axes.global_batch=[null]", "axes.nodes=[1]", "axes.sharding=[FULL_SHARD]",
        "axes.activation_checkpointing=[none]", "nccl.enabled=false", "steps=3", "warmup_steps=1",
        "exclude=[]", "axes.gpus_per_node=[1]", "memory.measure=false", "progress=false"]


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 160 KiB tmpfs (root only), unmounted afterwards."""
    where = tmp_path / "tiny"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(where)]).returncode != 0:
        pytest.skip("this machine does not let us mount a tmpfs")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_write_to_a_full_filesystem_is_one_line_and_leaves_the_old_file(tiny_fs: Path) -> None:
    path = tiny_fs / "results.parquet"
    rundir.atomic_write_bytes(path, b"old")
    with pytest.raises(rundir.NoSpace) as e:
        rundir.atomic_write_bytes(path, b"x" * 300_000)
    assert str(e.value).startswith(f"no space left in {tiny_fs}: writing results.parquet needs 293.0 KiB (")
    assert "\n" not in str(e.value) and e.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"old" and [p.name for p in tiny_fs.iterdir()] == ["results.parquet"]


def test_an_injected_enospc_is_no_space_and_other_errors_stay_what_they_were(tmp_path, monkeypatch) -> None:
    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(rundir.os, "replace", full)
    with pytest.raises(rundir.NoSpace, match=rf"^no space left in {tmp_path}: writing a.json needs 3 B \("):
        rundir.atomic_write_text(tmp_path / "a.json", "{}\n")
    assert list(tmp_path.iterdir()) == []  # the temp file went with it

    def denied(src: str, dst: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(rundir.os, "replace", denied)
    with pytest.raises(PermissionError):
        rundir.atomic_write_text(tmp_path / "a.json", "{}\n")


@pytest.mark.slow  # a real sweep: a minute on 2 cores
def test_enospc_on_the_results_table_stops_the_sweep_keeps_the_run_and_frees_the_lock(tmp_path, monkeypatch,
                                                                                       capsys) -> None:
    """In the sweep's own process: the table's write after the first run fails as a full disk would."""
    write = rundir._atomic_write

    def full_after_a_summary(path: Path, data: bytes, sync: bool) -> None:
        if path.name == rundir.RESULTS_PARQUET and rundir.read_summaries(path.parent):
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, data, sync)
    monkeypatch.setattr(rundir, "_atomic_write", full_after_a_summary)
    argv = ["+sweep=smoke_full", f"results_root={tmp_path}", *SMOKE_SHAPE, *TINY,
            "axes.precision=[fp32,bf16_mixed]"]
    assert sweep.main(argv) == sweep.EXIT_NO_SPACE
    err = capsys.readouterr().err
    where = tmp_path / "smoke_full"
    assert err.startswith(f"error: no space left in {where}: writing results.parquet needs ")
    assert err.count("\n") == 1
    (kept,) = rundir.read_summaries(tmp_path / "smoke_full")
    assert kept.status == "ok"
    with rundir.locked(tmp_path / "smoke_full"):  # free: this process holds no other descriptor of it
        pass
    monkeypatch.setattr(rundir, "_atomic_write", write)
    assert sweep.main(argv) == sweep.EXIT_OK
    out = capsys.readouterr().out
    assert "done: ok 1, skipped 1;" in out
    assert kept.run_id in {s.run_id for s in rundir.read_summaries(tmp_path / "smoke_full")}


@pytest.mark.slow  # three real runs: two minutes on 2 cores
def test_a_sweep_on_a_160_kib_filesystem_stops_in_one_line_and_resumes_with_space(tiny_fs: Path) -> None:
    argv = [sys.executable, "-m", "bench.sweep", "+sweep=smoke_full", f"results_root={tiny_fs}", *SMOKE_SHAPE,
            *TINY, "axes.precision=[fp32,bf16_mixed,fp16_mixed]"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: no space left in {tiny_fs}") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    finished = {s.run_id: s.status for s in rundir.read_summaries(tiny_fs / "smoke_full")}
    assert finished and set(finished.values()) == {"ok"}
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_fs)], check=True)
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"skipped {len(finished)};" in again.stdout  # nothing that finished ran twice
    assert len(rundir.read_summaries(tiny_fs / "smoke_full")) == 3
