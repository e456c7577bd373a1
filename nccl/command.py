"""nccl-tests command lines and the NCCL/EFA environment of each EFA setting.

EFA runs pin NCCL's network to the aws-ofi-nccl plugin (NCCL_NET="AWS Libfabric", FI_PROVIDER=efa), so a
node whose plugin or adapters are missing fails loudly instead of silently falling back to TCP sockets.
0-EFA runs force NCCL's socket transport. NCCL_DEBUG=INFO with the INIT,NET subsystems makes NCCL print
the transport it really chose ("Using network ..."), which the parser records beside the result.
"""
from __future__ import annotations

from bench.schema import RunSpec

ALL_REDUCE_PERF = "all_reduce_perf"
LIBFABRIC_NETWORK = "AWS Libfabric"
SOCKET_NETWORK = "Socket"


def expected_network(efa_per_node: int) -> str:
    return LIBFABRIC_NETWORK if efa_per_node > 0 else SOCKET_NETWORK


def nccl_env(efa_per_node: int) -> dict[str, str]:
    """Environment for NCCL (training and probes) with `efa_per_node` adapters per node."""
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    if efa_per_node > 0:
        env.update({"NCCL_NET": LIBFABRIC_NETWORK, "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1",
                    "FI_EFA_FORK_SAFE": "1", "NCCL_IB_DISABLE": "1"})
    else:
        env.update({"NCCL_NET": SOCKET_NETWORK, "NCCL_IB_DISABLE": "1"})
    return env


def all_reduce_perf_argv(spec: RunSpec, *, binary: str = ALL_REDUCE_PERF, gpus_per_process: int = 1,
                         warmup_iters: int = 5, dtype: str = "float", json_file: str | None = None,
                         ) -> list[str]:
    """all_reduce_perf arguments for one probe: sizes doubling from min to max, data checked.

    With one process per GPU (MPI/srun), -g is 1; a single process driving all GPUs uses -g G.
    `-J file.json` (nccl-tests 2.17+) adds machine-readable output beside the text table.
    """
    argv = [binary, "-b", str(spec.nccl_min_bytes), "-e", str(spec.nccl_max_bytes), "-f", "2",
            "-g", str(gpus_per_process), "-n", str(spec.nccl_iters), "-w", str(warmup_iters),
            "-d", dtype, "-o", "sum", "-c", "1"]
    if json_file:
        argv += ["-J", json_file]
    return argv


def busbw_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor: busbw = algbw * 2(n-1)/n."""
    return 2.0 * (ranks - 1) / ranks
