"""torch's flight recorder: a rank's dump when its run fails or is stopped, and the analysis of a run's
dumps that names the rank(s) that lagged.

Dumps. Every launcher asks for the recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) and a dump path per rank
(TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank, in the attempt dir). NCCL's watchdog writes it on a collective
timeout; gloo has no watchdog, and a rank stopped by the harness never reaches one, so the worker writes
its own with torch's dump call (`_dump_fr_trace`, the same pickle) when a step fails or SIGTERM arrives,
unless the watchdog's dump is already there.

Analysis. `python -m trainer.flight DIR --prefix P --world N` reads each rank's dump with torch's loader,
matches the collectives across ranks with torch's analyzer (torch.distributed.flight_recorder, as
`torchfrtrace` does) and prints one `flight` metric record: the first collective not every rank joined
(op, sequence number, sizes, the ranks missing from it), dumps missing or unreadable, and where the
dumps disagree. It names what the dumps show and no more.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from bench.core.records import format_record

DUMP_PATH_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"  # torch's own variable: the dump path without the rank


def dump_path(rank: int) -> Path | None:
    prefix = os.environ.get(DUMP_PATH_ENV)
    return Path(f"{prefix}{rank}") if prefix else None


def write_dump(rank: int) -> Path | None:
    """This rank's recorder, written where the watchdog would have (kept if the watchdog already wrote).
    Never raises: a failing run must still report why it failed."""
    path = dump_path(rank)
    if path is None or path.exists():
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace
        data = _dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # a reader never sees half a dump from us
        return path
    except Exception:  # no recorder in this torch, no process group, an unwritable dir
        return None


BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # torch's own variable: the recorder keeps this many entries
# its newer name, which torch 2.13 reads first, warning on every rank that the older one is deprecated
NEW_BUFFER_ENV, NEW_BUFFER_TORCH = "TORCH_FR_BUFFER_SIZE", (2, 13)


def adopt_buffer_env(torch_version: str) -> None:
    """The harness asks for the recorder under the name every torch reads (BUFFER_ENV); on a torch that
    reads the newer one, the worker moves the value there before its first process group, so no rank
    logs the deprecation notice."""
    release = tuple(int(p) for p in torch_version.split("+")[0].split(".")[:2] if p.isdigit())
    value = os.environ.get(BUFFER_ENV)
    if value is not None and release >= NEW_BUFFER_TORCH and NEW_BUFFER_ENV not in os.environ:
        os.environ[NEW_BUFFER_ENV] = os.environ.pop(BUFFER_ENV)


def _buffer_entries() -> int:
    return max(int(os.environ.get(name, "0") or 0) for name in (BUFFER_ENV, NEW_BUFFER_ENV))


def collectives_between(start_ns: int, end_ns: int) -> dict[str, dict[str, int]] | None:
    """The collectives this rank started in a window of wall-clock time (time.time_ns(), the recorder's
    clock), counted by process group (its description: the mesh dimension, 'mesh_shard', 'mesh_replicate')
    and operation as the backend names it (gloo runs FSDP2's reduce-scatter as an all_reduce of the whole
    gradient). What the run really did, not what a model of FSDP says it should; None where the recorder
    is off (no BUFFER_ENV) or this torch has none."""
    if _buffer_entries() <= 0:
        return None
    try:
        import pickle

        from torch._C._distributed_c10d import _dump_fr_trace
        entries = pickle.loads(_dump_fr_trace(includeCollectives=True, includeStackTraces=False,
                                              onlyActive=False))["entries"]
    except Exception:
        return None
    counts: dict[str, dict[str, int]] = {}
    for e in entries:
        if start_ns <= e["time_created_ns"] < end_ns:
            group = counts.setdefault(e["process_group"][1] or e["process_group"][0], {})
            op = e["profiling_name"].split(":", 1)[-1]
            group[op] = group.get(op, 0) + 1
    return counts


def dump_on_sigterm(rank: int) -> None:
    """The harness (or torchrun, when another rank failed) stops a rank with SIGTERM: dump, then exit."""
    def handler(signum: int, frame: Any) -> None:
        write_dump(rank)
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def _read(files: list[Path], prefix: str) -> tuple[dict[str, dict[str, Any]], dict[int, str]]:
    """torch's loader, one file at a time: a truncated or corrupt dump is reported, not fatal."""
    from torch.distributed.flight_recorder.components.loader import read_dump
    details, unreadable = {}, {}
    for path in files:
        rank = int(path.name[len(prefix):])
        try:
            details[path.name] = _named_groups(read_dump(prefix, str(path)))
        except Exception as e:
            unreadable[rank] = f"{type(e).__name__}: {str(e)[:120]}"
    return details, unreadable


def _named_groups(dump: dict[str, Any]) -> dict[str, Any]:
    """gloo's dump (torch 2.13) leaves its one process group's name and description empty in pg_config,
    while each entry names it ('0', 'default_pg'); the analyzer matches on the name. Where that is
    unambiguous (one group, one name in the entries) the name is taken from the entries; else the dump is
    left as written and the analyzer says what it cannot match."""
    config, entries = dump["pg_config"], dump["entries"]
    named = {tuple(e["process_group"]) for e in entries}
    if list(config) == [""] and len(named) == 1:
        name, desc = named.pop()
        dump["pg_config"] = {name: {**config[""], "name": name, "desc": desc}}
    return dump


def analyze(trace_dir: Path, prefix: str, world: int) -> dict[str, Any]:
    """What the dumps say about who lagged (see the module docstring)."""
    files = sorted(p for p in trace_dir.glob(f"{prefix}*") if p.name[len(prefix):].isdigit())
    details, unreadable = _read(files, prefix)
    present = sorted(d["rank"] for d in details.values())
    out: dict[str, Any] = {"dumps": present, "missing_dumps": sorted(set(range(world)) - set(present)
                                                                     - set(unreadable)),
                           "unreadable": {str(k): v for k, v in sorted(unreadable.items())}}
    if not details:
        return out
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    args = JobConfig().parse_args([str(trace_dir), "--prefix", prefix, "--allow-incomplete-ranks"])
    version = str(next(iter(details.values()))["version"])
    try:
        db = build_db(details, args, version)
    except (Exception, SystemExit) as e:  # torch's analyzer refuses what it cannot match
        out["analyzer_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        return out
    # a collective some rank never joined keeps pass_check=True in torch 2.13: its missing_ranks says it
    failing = [c for c in db.collectives if c.missing_ranks or not c.pass_check]
    if failing:
        first = min(failing, key=lambda c: c.collective_seq_id)
        out["collective"] = {"op": first.collective_name, "seq": first.collective_seq_id,
                             "sizes": first.input_sizes, "group": first.pg_desc,
                             "expected_ranks": sorted(first.expected_ranks),
                             "missing_ranks": sorted(first.missing_ranks or []),
                             "mismatch": str(first.type_of_mismatch) if first.type_of_mismatch else None}
    else:
        out["last_matched_seq"] = max((c.collective_seq_id for c in db.collectives), default=None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.flight", description=__doc__)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--world", type=int, required=True, help="ranks the run had (dumps expected)")
    args = parser.parse_args(argv)
    result = analyze(args.trace_dir, args.prefix, args.world)
    sys.stdout.flush()
    print(format_record("flight", **result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
