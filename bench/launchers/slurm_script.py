"""The Slurm batch script of one run, rendered by pure functions: srun starts one torchrun agent per node
with c10d rendezvous on the job's first node (or, for nccl-tests on GPU clusters, one rank of the probe's
<collective>_perf per GPU). Every value that comes from configuration is quoted with shlex or checked
against a strict pattern, so no config value can inject a command.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from bench.core import rundir
from bench.core.config import ConfigError, SweepConfig
from bench.core.schema import RunSpec
from bench.launchers.base import (
    IMAGE_PYTHON,
    PROJECT_ROOT,
    TORCHRUN_MODULE,
    WARM_AGENT_MODULE,
    nodes_are_this_machine,
    rendezvous_conf,
    torchrun_argv,
    worker_args,
    worker_module_argv,
)
from bench.probes.command import perf_argv
from bench.probes.records import JSON_FILE

SCRIPT = "job.sbatch"
EFA_LIMIT = "efa_limit.sh"
NCCL_TESTS = "nccl_tests.sh"  # bench.probes.command.JSON_IF_SUPPORTED_SCRIPT
# Run on every node by srun, before the worker: libfabric's efa provider uses only the devices FI_EFA_IFACE
# lists, so a run of N adapters per node gets the node's first N rdmap devices; a node with fewer fails the
# run rather than measuring something else. Arguments only (the count, then the worker's argv): no config
# value is ever part of this text.
EFA_LIMIT_SCRIPT = ("""#!/bin/bash
# fsdpbench: use only the first N EFA devices of this node (N = $1), then run the rest of the arguments.
set -euo pipefail
want=$1; shift
sysfs=${FSDPBENCH_EFA_SYSFS:-/sys/class/infiniband}
devices=$({ ls "$sysfs" 2>/dev/null || true; } | awk '/^rdmap/' | sort -V"""  # one line in the script
                    """ | awk -v n="$want" 'NR <= n' | paste -sd, -)
have=$(printf '%s' "$devices" | awk -F, '{print NF}')
have=${have:-0}
if [ "$have" -lt "$want" ]; then
    echo "fsdpbench: $(hostname) has $have EFA devices, the run asks for $want per node" >&2
    exit 3
fi
export FI_EFA_IFACE=$devices
echo "fsdpbench: $(hostname) FI_EFA_IFACE=$FI_EFA_IFACE" >&2
exec "$@"
""")
ENDPOINT = "@RDZV_HOST@:@RDZV_PORT@"  # replaced by shell variables in the rendered script
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.,:+@%=-]+$")


def _check_safe(what: str, value: str) -> str:
    """For values that land in #SBATCH lines, which sbatch does not shell-parse: no quoting possible."""
    if not _SAFE_NAME.match(value):
        raise ConfigError(f"{what}={value!r}: only letters, digits and _.,:+@%=- are allowed")
    return value


def job_name(spec: RunSpec, run_dir: Path) -> str:
    """Readable in squeue and unique per attempt (label, run id, attempt dir)."""
    return f"fsdpbench-{re.sub(r'[^A-Za-z0-9_.-]', '_', spec.label)[:80]}-{spec.run_id}-{run_dir.name}"


def uses_nccl_tests(cfg: SweepConfig, spec: RunSpec) -> bool:
    """GPU clusters probe with nccl-tests (one MPI rank per GPU); CPU clusters with the torch probe."""
    return spec.kind == "nccl" and cfg.cluster.gpu is not None


def sbatch_lines(cfg: SweepConfig, spec: RunSpec) -> list[str]:
    s = cfg.launcher.slurm
    tasks = spec.gpus_per_node if uses_nccl_tests(cfg, spec) else 1  # MPI ranks or torchrun agents
    lines = [f"#SBATCH --nodes={spec.nodes}", f"#SBATCH --ntasks-per-node={tasks}",
             f"#SBATCH --time={_check_safe('launcher.slurm.time_limit', s.time_limit)}"]
    if s.partition:
        lines.append(f"#SBATCH --partition={_check_safe('launcher.slurm.partition', s.partition)}")
    if s.account:
        lines.append(f"#SBATCH --account={_check_safe('launcher.slurm.account', s.account)}")
    if s.exclusive:
        lines.append("#SBATCH --exclusive")
    if spec.hosts:  # a preflight's job on its node, or its pair of nodes: a node that fails the launch is
        # the answer, not a job to requeue (Slurm holds such a requeue, and it outlived the preflight)
        lines += [f"#SBATCH --nodelist={_check_safe('hosts', spec.hosts)}", "#SBATCH --no-requeue"]
    gpus = s.gpus_per_node if s.gpus_per_node is not None else (cfg.cluster.gpus_per_node if cfg.cluster.gpu
                                                                 else None)
    if gpus:  # 0: a cluster without GPU GRES, which would reject the option
        lines.append(f"#SBATCH --gpus-per-node={int(gpus)}")
    for extra in s.extra_sbatch:
        if not extra.startswith("--") or any(c in extra for c in "\n\r"):
            raise ConfigError(f"launcher.slurm.extra_sbatch: {extra!r} must be one --option[=value]")
        lines.append(f"#SBATCH {extra}")
    return lines


def _srun_prefix(cfg: SweepConfig, tasks_per_node: int, mpi: str | None = None) -> list[str]:
    s = cfg.launcher.slurm
    srun = ["srun", "--label", "--kill-on-bad-exit=1", f"--ntasks-per-node={tasks_per_node}"]
    if mpi:
        srun.append(f"--mpi={mpi}")
    if s.container_image:  # pyxis starts in the image's WORKDIR, not in the batch script's directory
        srun += [f"--container-image={s.container_image}", f"--container-workdir={s.container_workdir}"]
    if s.container_mounts:
        srun.append(f"--container-mounts={s.container_mounts}")
    return srun


def _mounts(spec: str) -> list[tuple[Path, Path]]:
    """(host, container) pairs of pyxis' --container-mounts=SRC[:DST[:FLAGS]][,...]."""
    pairs = []
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        dst = parts[1] if len(parts) > 1 and parts[1].startswith("/") else parts[0]
        pairs.append((Path(parts[0]), Path(dst)))
    return pairs


def worker_path(cfg: SweepConfig, path: Path) -> str:
    """An absolute host path as the worker sees it: itself on the host, its mount target in a pyxis
    container. A results dir no mount covers would be written inside the container and lost with it."""
    path = Path(os.path.abspath(path))
    s = cfg.launcher.slurm
    if not s.container_image:
        return str(path)
    for host, inside in sorted(_mounts(s.container_mounts or ""), key=lambda m: -len(m[0].parts)):
        if path == host or host in path.parents:
            return str(inside / path.relative_to(host))
    raise ConfigError(f"results dir {path} is not under any launcher.slurm.container_mounts "
                      f"({s.container_mounts or 'none'}): the runs would write their results inside the "
                      "container and lose them; mount it, e.g. "
                      f"launcher.slurm.container_mounts={path.parent}:{path.parent}")


def _python(cfg: SweepConfig) -> str:
    """launcher.slurm.python, else the image's interpreter in a container, else this one (shared
    install)."""
    s = cfg.launcher.slurm
    return s.python or (IMAGE_PYTHON if s.container_image else sys.executable)


def warm_here(cfg: SweepConfig) -> bool:
    """Whether the jobs' agents and workers start from the sweep's warm process: where the nodes are this
    machine's CPUs (the local test cluster) and launcher.slurm.warm_workers holds. A real cluster's nodes
    run torchrun itself, cold."""
    return nodes_are_this_machine(cfg) and cfg.cluster.gpu is None and cfg.launcher.slurm.warm_workers


def limits_efa(cfg: SweepConfig, spec: RunSpec) -> bool:
    """Fewer adapters than the node has: libfabric must be told which ones to use."""
    return cfg.cluster.gpu is not None and 0 < spec.efa_per_node < cfg.cluster.efa_per_node


def _submission_file(cfg: SweepConfig, run_dir: Path, name: str) -> str:
    return worker_path(cfg, run_dir / rundir.SUBMISSION_DIR / name)


def _efa_limit(cfg: SweepConfig, spec: RunSpec, run_dir: Path) -> list[str]:
    if not limits_efa(cfg, spec):
        return []
    return ["bash", _submission_file(cfg, run_dir, EFA_LIMIT), str(spec.efa_per_node)]


def worker_command(cfg: SweepConfig, spec: RunSpec, run_dir: Path) -> str:
    """The srun line of the batch script, every argument quoted, every path absolute as the worker sees
    it (on the host, or inside the pyxis container)."""
    if uses_nccl_tests(cfg, spec):
        try:
            probe = perf_argv(spec, binary=cfg.launcher.slurm.nccl_tests_binary)
        except ValueError as e:  # a binary whose siblings cannot be found
            raise ConfigError(f"launcher.slurm.nccl_tests_binary: {e}") from None
        argv = (_srun_prefix(cfg, spec.gpus_per_node, cfg.launcher.slurm.mpi) + _efa_limit(cfg, spec, run_dir)
                + ["bash", _submission_file(cfg, run_dir, NCCL_TESTS), worker_path(cfg, run_dir / JSON_FILE)]
                + probe)
        return shlex.join(argv)
    argv = (_srun_prefix(cfg, 1) + _efa_limit(cfg, spec, run_dir)
            + torchrun_argv(_python(cfg), spec, ENDPOINT, "@RDZV_ID@", rendezvous_conf(cfg),
                            worker_path(cfg, run_dir / rundir.TORCHELASTIC_DIR),
                            module=WARM_AGENT_MODULE if warm_here(cfg) else TORCHRUN_MODULE)
            + worker_module_argv(spec, Path(worker_path(cfg, run_dir)),
                                 worker_args(cfg, spec)))
    line = shlex.join(argv)
    return (line.replace(ENDPOINT, '"${head_addr}:${rdzv_port}"')
                .replace("@RDZV_ID@", '"${SLURM_JOB_ID}"'))


def system_command(cfg: SweepConfig, spec: RunSpec) -> list[str]:
    """nccl-tests writes no system record: each node's from `python -m trainer.system` first (one task per
    node, in the probe's container, its output in the job's log); a node where it cannot run is named in
    the log and the probe still runs."""
    if not uses_nccl_tests(cfg, spec):
        return []
    argv = _srun_prefix(cfg, 1) + [_python(cfg), "-m", "trainer.system", "--run-id", spec.run_id,
                                   "--source", "nccl-tests"]
    said = 'echo "fsdpbench: python -m trainer.system failed on a node of $SLURM_JOB_NODELIST" >&2'
    return [f"if ! {shlex.join(argv)}; then {said}; fi"]


def render_script(cfg: SweepConfig, spec: RunSpec, run_dir: Path, env: dict[str, str]) -> str:
    """The batch script of one run (pure: the same inputs give the same text)."""
    workdir = cfg.launcher.slurm.workdir or str(PROJECT_ROOT)
    body = [
        "#!/bin/bash",
        f"# fsdpbench run {spec.run_id}: {spec.label}",
        *sbatch_lines(cfg, spec),
        "set -euo pipefail",
        f"cd {shlex.quote(workdir)}",
        *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())),
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'head_addr=$(scontrol show node "$head_node" | tr " " "\\n" | sed -n "s/^NodeAddr=//p" | head -n 1)',
        'head_addr=${head_addr:-$head_node}',
        "rdzv_port=$((29500 + SLURM_JOB_ID % 20000))",
        'echo "fsdpbench: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous ${head_addr}:${rdzv_port}"',
        *system_command(cfg, spec),
        worker_command(cfg, spec, run_dir),
    ]
    return "\n".join(body) + "\n"
