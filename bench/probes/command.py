"""nccl-tests command lines and the NCCL/EFA environment of each EFA setting.

EFA runs pin NCCL's network to the aws-ofi-nccl plugin (NCCL_NET="AWS Libfabric", FI_PROVIDER=efa), so a
node whose plugin or adapters are missing fails loudly instead of silently falling back to TCP sockets.
0-EFA runs force NCCL's socket transport. NCCL_DEBUG=INFO with the INIT,NET subsystems makes NCCL print
the transport it really chose ("Using network ..."), which the parser records beside the result.
"""
from __future__ import annotations

import posixpath

from bench.core.schema import COLLECTIVES, RunSpec

ALL_REDUCE_PERF = "all_reduce_perf"
PERF_SUFFIX = "_perf"  # nccl-tests names each binary <collective>_perf (a build may append "_mpi")
LIBFABRIC_NETWORK = "AWS Libfabric"
SOCKET_NETWORK = "Socket"


def expected_network(efa_per_node: int) -> str:
    return LIBFABRIC_NETWORK if efa_per_node > 0 else SOCKET_NETWORK


def nccl_env(efa_per_node: int, socket_ifname: str | None = None) -> dict[str, str]:
    """Environment for NCCL (training and probes) with `efa_per_node` adapters per node.

    `socket_ifname` pins the interfaces of NCCL's bootstrap and socket transport (NCCL_SOCKET_IFNAME,
    e.g. "^lo,docker,veth": all but loopback and container bridges), so 0-EFA figures from Slurm hosts
    and Kubernetes pods go over the same kind of interface.
    """
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = socket_ifname
    if efa_per_node > 0:
        env.update({"NCCL_NET": LIBFABRIC_NETWORK, "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1",
                    "FI_EFA_FORK_SAFE": "1", "NCCL_IB_DISABLE": "1"})
    else:
        env.update({"NCCL_NET": SOCKET_NETWORK, "NCCL_IB_DISABLE": "1"})
    return env


def perf_binary(all_reduce_binary: str, collective: str) -> str:
    """The nccl-tests binary of `collective` beside the configured all_reduce_perf (same directory, same
    suffix: `/opt/nccl-tests/build/all_reduce_perf_mpi` -> `.../all_gather_perf_mpi`)."""
    head, name = posixpath.split(all_reduce_binary)
    stem = ALL_REDUCE_PERF[:-len(PERF_SUFFIX)]
    if not name.startswith(stem + PERF_SUFFIX):
        raise ValueError(f"{all_reduce_binary!r} is not an nccl-tests all_reduce_perf binary: the other "
                         "collectives' binaries are found beside it")
    return posixpath.join(head, collective + name[len(stem):])


def anchored_min_bytes(spec: RunSpec) -> int:
    """The sweep's first size: nccl-tests doubles from -b, so starting at the largest study size halved
    down to the configured minimum makes that size (a block's gathered parameters or gradients) one of
    the rows. Without study sizes, the configured minimum."""
    sizes = [s for s in spec.study_sizes if spec.nccl_min_bytes <= s <= spec.nccl_max_bytes]
    if not sizes:
        return spec.nccl_min_bytes
    size = max(sizes)
    while size % 2 == 0 and size // 2 >= spec.nccl_min_bytes:
        size //= 2
    return size


def perf_argv(spec: RunSpec, *, binary: str = ALL_REDUCE_PERF, gpus_per_process: int = 1,
              warmup_iters: int = 5, dtype: str = "float") -> list[str]:
    """nccl-tests arguments for one probe of spec.collective: sizes doubling from min (anchored on the
    study's largest size, anchored_min_bytes) to max, data checked; `binary` is all_reduce_perf's path,
    the probe's own binary is found beside it (perf_binary).

    With one process per GPU (MPI/srun), -g is 1; a single process driving all GPUs uses -g G.
    On Slurm, JSON_IF_SUPPORTED_SCRIPT adds `-J file.json` where the binary has it.
    """
    argv = [perf_binary(binary, spec.collective), "-b", str(anchored_min_bytes(spec)),
            "-e", str(spec.nccl_max_bytes), "-f", "2", "-g", str(gpus_per_process),
            "-n", str(spec.nccl_iters), "-w", str(warmup_iters), "-d", dtype]
    if spec.collective != "all_gather":  # a gather reduces nothing (nccl-tests prints redop "none")
        argv += ["-o", "sum"]
    return argv + ["-c", "1"]



def split_env(gpus_per_node: int) -> dict[str, str]:
    """nccl-tests' NCCL_TESTS_SPLIT (2.13.4+): one group per local GPU index, so every group has one rank
    per node and crosses the network only; each group reports its own bandwidth."""
    return {"NCCL_TESTS_SPLIT": f"MOD {gpus_per_node}"}


# Run by srun on every rank of a Slurm probe: nccl-tests learned -J (JSON output) in 2.17.3; an older
# binary takes -J for an unknown option, prints its usage and exits 0, so it would measure nothing. Its own
# usage text (`-h` returns before MPI_Init) says whether it knows --output_file: grep reads it whole (no
# -q: under pipefail, grep leaving at the first match would fail the binary with SIGPIPE while it still
# writes, and the probe would lose -J). Arguments only: the JSON path, then the binary's argv; no config
# value is part of this text.
JSON_IF_SUPPORTED_SCRIPT = """#!/bin/bash
# fsdpbench: run nccl-tests ($2 ...) with -J $1 when the binary supports it (2.17.3+), else without.
set -euo pipefail
json=$1; shift
if "$1" -h 2>/dev/null | grep -- '--output_file' >/dev/null; then
    exec "$@" -J "$json"
fi
if [ "${SLURM_PROCID:-0}" = 0 ]; then
    echo "fsdpbench: $1 has no -J (nccl-tests older than 2.17.3); its text table is parsed" >&2
fi
exec "$@"
"""


def busbw_factor(ranks: int, collective: str = "all_reduce") -> float:
    """nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md): busbw = algbw * 2(n-1)/n for an all-reduce,
    algbw * (n-1)/n for an all-gather or reduce-scatter (size: the gathered output, the reduced input)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective {collective!r} is not one of: {', '.join(COLLECTIVES)}")
    return (2.0 if collective == "all_reduce" else 1.0) * (ranks - 1) / ranks


def collective_of_binary(name: str) -> str | None:
    """The collective an nccl-tests binary name measures ("all_gather_perf_mpi" -> "all_gather")."""
    base = posixpath.basename(name.strip())
    return next((c for c in COLLECTIVES if base.startswith(c + PERF_SUFFIX)), None)
