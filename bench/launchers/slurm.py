"""Slurm launcher: one sbatch job per run; srun starts one torchrun agent per node with c10d rendezvous
on the job's first node (or, for nccl-tests on GPU clusters, one all_reduce_perf rank per GPU).

The batch script is rendered by a pure function. Every value that comes from configuration is quoted
with shlex or checked against a strict pattern, so no config value can inject a command. The final
state comes from scontrol (jobs stay there MinJobAge seconds), then sacct, then the job-completion log.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import rundir
from bench.config import ConfigError, SweepConfig
from bench.core.schema import RunSpec
from bench.launchers.base import (DONE, IMAGE_PYTHON, PENDING, PROJECT_ROOT, RUNNING, Outcome, Poll,
                                  Submission, fault_args, job_env, python_executable, rendezvous_conf,
                                  torchrun_argv, worker_module_argv)
from nccl.command import JSON_IF_SUPPORTED_SCRIPT, all_reduce_perf_argv
from nccl.records import JSON_FILE

SCRIPT = "job.sbatch"
EFA_LIMIT = "efa_limit.sh"
NCCL_TESTS = "nccl_tests.sh"  # nccl.command.JSON_IF_SUPPORTED_SCRIPT
# Run on every node by srun, before the worker: libfabric's efa provider uses only the devices FI_EFA_IFACE
# lists, so a run of N adapters per node gets the node's first N rdmap devices; a node with fewer fails the
# run rather than measuring something else. Arguments only (the count, then the worker's argv): no config
# value is ever part of this text.
EFA_LIMIT_SCRIPT = """#!/bin/bash
# fsdpbench: use only the first N EFA devices of this node (N = $1), then run the rest of the arguments.
set -euo pipefail
want=$1; shift
sysfs=${FSDPBENCH_EFA_SYSFS:-/sys/class/infiniband}
devices=$({ ls "$sysfs" 2>/dev/null || true; } | awk '/^rdmap/' | sort -V | awk -v n="$want" 'NR <= n' | paste -sd, -)
have=$(printf '%s' "$devices" | awk -F, '{print NF}')
have=${have:-0}
if [ "$have" -lt "$want" ]; then
    echo "fsdpbench: $(hostname) has $have EFA devices, the run asks for $want per node" >&2
    exit 3
fi
export FI_EFA_IFACE=$devices
echo "fsdpbench: $(hostname) FI_EFA_IFACE=$FI_EFA_IFACE" >&2
exec "$@"
"""
ENDPOINT = "@RDZV_HOST@:@RDZV_PORT@"  # replaced by shell variables in the rendered script
# squeue states: waiting for resources (queue time, bounded by queue_timeout_s), and holding them
# (run time, bounded by timeout_s). A job in neither has left the queue.
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.,:+@%=-]+$")
_CMD_TIMEOUT_S = 60


def _check_safe(what: str, value: str) -> str:
    """For values that land in #SBATCH lines, which sbatch does not shell-parse: no quoting possible."""
    if not _SAFE_NAME.match(value):
        raise ConfigError(f"{what}={value!r}: only letters, digits and _.,:+@%=- are allowed")
    return value


def job_name(spec: RunSpec, run_dir: Path) -> str:
    """Readable in squeue and unique per attempt (label, run id, attempt dir)."""
    return f"fsdpbench-{re.sub(r'[^A-Za-z0-9_.-]', '_', spec.label)[:80]}-{spec.run_id}-{run_dir.name}"


def _uses_nccl_tests(cfg: SweepConfig, spec: RunSpec) -> bool:
    """GPU clusters probe with nccl-tests (one MPI rank per GPU); CPU clusters with the torch probe."""
    return spec.kind == "nccl" and cfg.cluster.gpu is not None


def sbatch_lines(cfg: SweepConfig, spec: RunSpec) -> list[str]:
    s = cfg.cluster.slurm
    tasks = spec.gpus_per_node if _uses_nccl_tests(cfg, spec) else 1  # MPI ranks or torchrun agents
    lines = [f"#SBATCH --nodes={spec.nodes}", f"#SBATCH --ntasks-per-node={tasks}",
             f"#SBATCH --time={_check_safe('slurm.time_limit', s.time_limit)}"]
    if s.partition:
        lines.append(f"#SBATCH --partition={_check_safe('slurm.partition', s.partition)}")
    if s.account:
        lines.append(f"#SBATCH --account={_check_safe('slurm.account', s.account)}")
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
            raise ConfigError(f"slurm.extra_sbatch: {extra!r} must be one --option[=value]")
        lines.append(f"#SBATCH {extra}")
    return lines


def _srun_prefix(cfg: SweepConfig, tasks_per_node: int, mpi: str | None = None) -> list[str]:
    s = cfg.cluster.slurm
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
    s = cfg.cluster.slurm
    if not s.container_image:
        return str(path)
    for host, inside in sorted(_mounts(s.container_mounts or ""), key=lambda m: -len(m[0].parts)):
        if path == host or host in path.parents:
            return str(inside / path.relative_to(host))
    raise ConfigError(f"results dir {path} is not under any slurm.container_mounts "
                      f"({s.container_mounts or 'none'}): the runs would write their results inside the "
                      f"container and lose them; mount it, e.g. slurm.container_mounts={path.parent}:{path.parent}")


def _python(cfg: SweepConfig) -> str:
    """launcher.python, else the image's interpreter in a container, else this one (shared install)."""
    if cfg.cluster.slurm.container_image and not cfg.launcher.python:
        return IMAGE_PYTHON
    return python_executable(cfg)


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
    if _uses_nccl_tests(cfg, spec):
        argv = (_srun_prefix(cfg, spec.gpus_per_node, cfg.cluster.slurm.mpi) + _efa_limit(cfg, spec, run_dir)
                + ["bash", _submission_file(cfg, run_dir, NCCL_TESTS), worker_path(cfg, run_dir / JSON_FILE)]
                + all_reduce_perf_argv(spec, binary=cfg.cluster.slurm.nccl_tests_binary))
        return shlex.join(argv)
    argv = (_srun_prefix(cfg, 1) + _efa_limit(cfg, spec, run_dir)
            + torchrun_argv(_python(cfg), spec, ENDPOINT, "@RDZV_ID@", rendezvous_conf(cfg))
            + worker_module_argv(spec, Path(worker_path(cfg, run_dir)), fault_args(cfg, spec)))
    line = shlex.join(argv)
    return (line.replace(ENDPOINT, '"${head_addr}:${rdzv_port}"')
                .replace("@RDZV_ID@", '"${SLURM_JOB_ID}"'))


def render_script(cfg: SweepConfig, spec: RunSpec, run_dir: Path, env: dict[str, str]) -> str:
    """The batch script of one run (pure: the same inputs give the same text)."""
    workdir = cfg.launcher.workdir or str(PROJECT_ROOT)
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
        worker_command(cfg, spec, run_dir),
    ]
    return "\n".join(body) + "\n"


@dataclass
class SlurmHandle:
    job_id: str
    run_dir: Path
    nodes: str | None = None  # the node list while the job runs
    failing: dict[str, str] = field(default_factory=dict)  # nodes that left the running job, as Slurm said
    failed: list[dict[str, str]] = field(default_factory=list)  # per requeue: the nodes down, and why


DOWN_STATES = ("down", "drain", "fail", "no_respond", "not_responding")  # sinfo's %T, any suffix

class SlurmLauncher:
    name = "slurm"

    def __init__(self, cfg: SweepConfig) -> None:
        self.cfg = cfg
        self.env = dict(os.environ)
        self._controller_config: str | None = None  # `scontrol show config`, once it answered
        if cfg.cluster.slurm.conf:
            self.env["SLURM_CONF"] = cfg.cluster.slurm.conf

    def preflight(self) -> None:
        """Fail before launching anything if this machine cannot reach a Slurm controller."""
        if shutil.which("sbatch") is None:
            raise ConfigError(f"sweep {self.cfg.sweep_name} uses launcher=slurm, but `sbatch` is not on PATH: "
                              "run it from a Slurm login node, choose launcher=local or launcher=kubernetes, or "
                              "preview the plan with: python -m bench.sweep "
                              f"+sweep={self.cfg.sweep_name} --dry-run")
        proc = self._run(["sinfo", "-h", "-o", "%P"], check=False)
        if proc.returncode != 0:
            raise ConfigError(f"Slurm controller not reachable (sinfo: {proc.stderr.strip()[:200]}); "
                              "start the test cluster with scripts/slurm_cluster.sh start, or dry-run")

    def node_names(self) -> tuple[list[str], dict[str, str]]:
        """The partition's nodes a job can run on, and those Slurm holds down (by state): the preflight's."""
        partition = self.cfg.cluster.slurm.partition
        left_out = self._excluded()
        nodes = {n: v for n, v in self._nodes(*(["-p", partition] if partition else [])).items()
                 if n not in left_out}
        up = [node for node, (_, down) in nodes.items() if not down]
        return up, {node: state for node, (state, down) in nodes.items() if down}

    def _excluded(self) -> set[str]:
        """Nodes the study's jobs leave out (slurm.extra_sbatch's --exclude=, a hostlist Slurm expands)."""
        lists = [x.split("=", 1)[1] for x in self.cfg.cluster.slurm.extra_sbatch
                 if x.startswith("--exclude=")]
        if not lists:
            return set()
        return set(self._run(["scontrol", "show", "hostnames", ",".join(lists)]).stdout.split())

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=_CMD_TIMEOUT_S,
                              check=check)

    def render(self, spec: RunSpec, run_dir: Path) -> Submission:
        env = job_env(self.cfg, spec, worker_path(self.cfg, run_dir))
        script = render_script(self.cfg, spec, run_dir, env)
        log = rundir.log_path(Path(os.path.abspath(run_dir)), "slurm-%j")
        argv = ("sbatch", "--parsable", f"--job-name={job_name(spec, run_dir)}", f"--output={log}",
                os.path.abspath(run_dir / rundir.SUBMISSION_DIR / SCRIPT))
        files = {SCRIPT: script}
        if limits_efa(self.cfg, spec):
            files[EFA_LIMIT] = EFA_LIMIT_SCRIPT
        if _uses_nccl_tests(self.cfg, spec):
            files[NCCL_TESTS] = JSON_IF_SUPPORTED_SCRIPT
        return Submission(run_id=spec.run_id, argvs=(argv,), env=env, files=files)

    def submit(self, submission: Submission, run_dir: Path) -> SlurmHandle:
        (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
        proc = self._run(list(submission.argvs[0]), check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr.strip()[:500]}")
        return SlurmHandle(job_id=proc.stdout.strip().split(";")[0], run_dir=run_dir)

    def locate(self, handle: SlurmHandle) -> dict[str, Any]:
        return {"job_id": handle.job_id}

    def attach(self, where: dict[str, Any], run_dir: Path) -> SlurmHandle | None:
        """The ledger's job, if Slurm still knows it (in the queue, or finished and still on record)."""
        job_id = where.get("job_id")
        if not job_id:
            return None
        if self._queue_state(job_id)[0] is None and self.final_state(job_id)[0] is None:
            return None
        return SlurmHandle(job_id=str(job_id), run_dir=run_dir)

    def _queue_state(self, job_id: str) -> tuple[str | None, str | None]:
        """(state, reason) while the job is in the queue, (None, None) once it has left."""
        state, reason, _ = self._queue(job_id)
        return state, reason

    def _queue(self, job_id: str) -> tuple[str | None, str | None, str | None]:
        """(state, reason, node list) while the job is in the queue, Nones once it has left."""
        proc = self._run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"], check=False)
        line = proc.stdout.strip().split("\n")[0] if proc.returncode == 0 else ""
        state, reason, nodes = (line.split("|") + ["", ""])[:3]
        return state or None, reason or None, nodes or None

    def _nodes(self, *select: str) -> dict[str, tuple[str, bool]]:
        """sinfo's nodes (those `select` picks, once each): the state as Slurm gives it (with its reason
        where it holds the node down) and whether it does."""
        proc = self._run(["sinfo", "-h", "-N", *select, "-o", "%N|%T|%E"], check=False)
        out = {}
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            node, state, reason = (line.split("|") + ["", ""])[:3]
            down = state.lower().startswith(DOWN_STATES)
            out[node] = (f"{state}: {reason}" if down and reason and reason != "none" else state, down)
        return out

    def down_nodes(self, nodes: str) -> dict[str, str]:
        """The nodes of a node list Slurm holds down, drained or failed, each with Slurm's reason."""
        return {node: state for node, (state, down) in self._nodes("-n", nodes).items() if down}

    def executions(self, handle: SlurmHandle) -> list[dict[str, Any]]:
        """Every time Slurm ran the job (a requeue keeps its id): sacct's duplicates where accounting runs,
        else the job-completion log; each NODE_FAIL one with the nodes seen down when it was requeued."""
        proc = self._run(["sacct", "-n", "-D", "-X", "-P", "-j", handle.job_id, "-o",
                          "State,NodeList,Start,End,ExitCode"], check=False)
        runs = [dict(zip(("state", "nodes", "start", "end", "exit_code"), line.split("|")))
                for line in proc.stdout.splitlines()] if proc.returncode == 0 else []
        runs = runs or self._jobcomp_runs(handle.job_id)
        failed, logged = iter(handle.failed), None
        for run in runs:
            run["state"] = run["state"].split()[0] if run.get("state") else run.get("state")
            if run["state"] not in ("NODE_FAIL", "REQUEUED", "PREEMPTED"):
                continue
            seen = next(failed, None)
            if not seen:  # not seen down while it ran: the controller's log, read once, if at all
                logged = self._logged_failures(handle.job_id) if logged is None else logged
                seen = {node: why for when, node, why in logged if run.get("start")
                        and run["start"][:19] <= when <= (run.get("end") or "9")[:19] + "~"}
            if seen:
                run["failed_nodes"] = seen
        return runs

    def _logged_failures(self, job_id: str) -> list[tuple[str, str, str]]:
        """(time, node, reason) of the controller log's "requeue job JobId=N due to failure of node X" lines,
        where this machine can read the log (the test cluster; a real one keeps it on the controller: there
        the node is the one seen down when the job left its node list, or sacctmgr's events name it)."""
        where = self._config("SlurmctldLogFile")
        try:
            lines = Path(where).read_text(errors="replace").splitlines() if where else []
        except OSError:
            return []
        reasons, out = {}, []
        for line in lines:
            if m := re.match(r"\[(\S+)\] update_node: node (\S+) reason set to: (.*)", line):
                reasons[m.group(2)] = m.group(3)
            elif m := re.match(rf"\[(\S+)\] requeue job JobId={job_id} due to failure of node (\S+)", line):
                reason = reasons.get(m.group(2), "no reason given")
                out.append((m.group(1)[:19], m.group(2), f"down: {reason}"))
        return out

    def _jobcomp_runs(self, job_id: str) -> list[dict[str, Any]]:
        keys = {"JobState": "state", "NodeList": "nodes", "StartTime": "start", "EndTime": "end",
                "ExitCode": "exit_code"}
        return [{new: fields.get(old) for old, new in keys.items()} for line in self._jobcomp_lines(job_id)
                for fields in [dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))]]

    def _jobcomp_lines(self, job_id: str) -> list[str]:
        """The job-completion log's lines of a job (jobcomp/filetxt: one per execution), oldest first."""
        loc = self._config("JobCompLoc")
        if not loc or not Path(loc).is_file():
            return []
        return [ln for ln in Path(loc).read_text().splitlines() if f"JobId={job_id} " in ln]

    def _config(self, key: str) -> str | None:
        """One value of `scontrol show config`: asked once per sweep (the controller's configuration does not
        change under it), again only if the controller did not answer."""
        if self._controller_config is None:
            proc = self._run(["scontrol", "show", "config"], check=False)
            if proc.returncode != 0:
                return None
            self._controller_config = proc.stdout
        found = re.search(rf"^{key}\s*=\s*(\S+)", self._controller_config, re.M)
        return found.group(1) if found else None

    def final_state(self, job_id: str) -> tuple[str | None, int | None, str | None]:
        """(JobState, exit code of the batch script, Reason) once the job has left the queue."""
        proc = self._run(["scontrol", "show", "job", "-o", job_id], check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return _parse_job_record(proc.stdout)
        proc = self._run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            state, code = proc.stdout.strip().splitlines()[0].split("|")
            return state.split()[0], int(code.split(":")[0]), None
        return self._from_jobcomp(job_id)

    def _from_jobcomp(self, job_id: str) -> tuple[str | None, int | None, str | None]:
        lines = self._jobcomp_lines(job_id)
        return _parse_job_record(lines[-1]) if lines else (None, None, None)

    def poll(self, handle: SlurmHandle) -> Poll:
        state, reason, nodes = self._queue(handle.job_id)
        if state in PENDING_STATES:
            if handle.nodes:  # it ran, and is back in the queue: Slurm requeued it (NODE_FAIL, preemption)
                handle.failed.append(handle.failing or self.down_nodes(handle.nodes))
                handle.nodes, handle.failing = None, {}
            return Poll(PENDING, reason=f"Slurm {state} ({reason})" if reason else f"Slurm {state}")
        if state in RUNNING_STATES:
            if handle.nodes and nodes != handle.nodes and not handle.failing:
                # nodes left the job: a failed node drops out at once (the others complete), and Slurm may
                # return it to service within a second: ask now which of the job's nodes it holds down
                handle.failing = self.down_nodes(handle.nodes)
            if state != "COMPLETING":
                handle.nodes = nodes or handle.nodes
            return Poll(RUNNING)
        job_state, code, why = self.final_state(handle.job_id)
        return Poll(DONE, outcome=Outcome(returncodes=[code], scheduler_state=job_state,
                                          detail=why and f"Slurm {job_state}: {why}",
                                          executions=self.executions(handle)))

    def logs(self, handle: SlurmHandle, run_dir: Path) -> None:
        """Nothing to fetch: sbatch --output writes into the run dir (shared file system)."""

    def cleanup(self, handle: SlurmHandle) -> None:
        """scancel a job still in the queue and wait until it has left (its nodes are free again)."""
        if self._queue_state(handle.job_id)[0] is None:
            return
        self._run(["scancel", handle.job_id], check=False)
        deadline = time.monotonic() + max(self.cfg.launcher.grace_s, 10)
        while time.monotonic() < deadline and self._queue_state(handle.job_id)[0] is not None:
            time.sleep(0.5)


def _parse_job_record(text: str) -> tuple[str | None, int | None, str | None]:
    """JobState, ExitCode and Reason from a `scontrol show job -o` or jobcomp/filetxt line."""
    fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))
    state = (fields.get("JobState") or "").split()[0] or None
    code = fields.get("ExitCode")
    reason = fields.get("Reason")
    return state, int(code.split(":")[0]) if code else None, None if reason in (None, "None") else reason
