"""Slurm launcher: one sbatch job per run, its script rendered by bench/launchers/slurm_script.py. Polls read
what one look at every job in flight said (bench/launchers/slurm_queue.py: one squeue, one sacct for the
jobs that left the queue). A job's final state is squeue's while the controller holds it (MinJobAge seconds
after its end), then sacct's, then the job-completion log's.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from bench.core import rundir
from bench.core.config import NON_NEGATIVE, ConfigError, SweepConfig
from bench.core.schema import RunSpec
from bench.launchers.base import (
    DONE,
    PENDING,
    RUNNING,
    Launcher,
    Outcome,
    Placement,
    Poll,
    Submission,
    cluster_placement,
    job_env,
)
from bench.launchers.processes import WarmWorkers, cold_env
from bench.launchers.slurm_queue import (
    GONE,
    PENDING_STATES,
    RUNNING_STATES,
    Board,
    Row,
    ask_accounting,
    ask_queue,
    exit_code,
)
from bench.launchers.slurm_script import (
    EFA_LIMIT,
    EFA_LIMIT_SCRIPT,
    NCCL_TESTS,
    SCRIPT,
    job_name,
    limits_efa,
    render_script,
    uses_nccl_tests,
    warm_here,
    worker_path,
)
from bench.probes.command import JSON_IF_SUPPORTED_SCRIPT

_CMD_TIMEOUT_S = 60
Admission = Literal["harness", "slurm"]
ADMISSIONS: tuple[Admission, ...] = get_args(Admission)  # launcher.slurm.admission
# admission=slurm: each job's --time is its predicted duration times this (a run slower than that is ended
# by Slurm: TIMEOUT); backfill packs by these limits
TIME_LIMIT_FACTOR = 2.0


@dataclass
class SlurmSettings:
    """The Slurm launcher's own keys: sbatch's options, the pyxis/enroot container, and where the project
    and its interpreter are on the nodes. A cluster file may set them for its cluster
    (sweeps/cluster/slurm_local.yaml: its partition and SLURM_CONF)."""

    partition: str | None = None
    """sbatch --partition; null: the cluster's default partition."""
    account: str | None = None
    """sbatch --account; null: the user's default account."""
    time_limit: str = "02:00:00"
    """sbatch --time of each run (Slurm's time format, e.g. HH:MM:SS); with admission=slurm only of a run
    that has no prediction, the others getting twice their predicted duration."""
    admission: Admission = "harness"
    """Who packs the study's runs onto nodes: `harness` (the runner submits what fits launcher.max_nodes,
    the largest first) or `slurm` (every run submitted at once, each with --time from its prediction, and
    Slurm's backfill packs them within the partition); `benchmarks/schedule_slurm.py` measures both."""
    exclusive: bool = True
    """sbatch --exclusive: no other job shares a benchmarked node."""
    gpus_per_node: Annotated[int | None, NON_NEGATIVE] = None
    """sbatch --gpus-per-node; null: the cluster's GPUs per node where it names a GPU; 0: no GRES request
    (a cluster without GPU GRES)."""
    container_image: str | None = None
    """The pyxis/enroot image each run's srun starts in (e.g. a .sqsh file); null: run on the host."""
    container_mounts: str | None = None
    """pyxis mounts, SRC:DST[,...]: they must cover results_root, or nothing comes back."""
    container_workdir: str = "/workspace/fsdpbench"
    """The project's directory inside the image (the Dockerfile's WORKDIR)."""
    extra_sbatch: list[str] = field(default_factory=list)
    """Further `#SBATCH` options, one `--option[=value]` each, e.g. `--qos=high`."""
    conf: str | None = None
    """SLURM_CONF for the client commands (sbatch, squeue, sacct, ...); null: the environment's."""
    nccl_tests_binary: str = "all_reduce_perf"
    """nccl-tests' all-reduce binary, a name on the nodes' PATH or a path (GPU clusters; CPU clusters use
    the torch probe); all_gather_perf and reduce_scatter_perf are taken from beside it."""
    mpi: str = "pmix"
    """srun --mpi for the nccl-tests probes (one MPI rank per GPU)."""
    python: str | None = None
    """The interpreter on the nodes; null: this one (pyxis: the image's `python`)."""
    workdir: str | None = None
    """The project checkout on the nodes; null: this checkout."""
    warm_workers: bool = True
    """Where the nodes are this machine (the local test cluster, instance type local) and the runs on its
    CPU: each job's torchrun agents and workers start from one warm process per sweep, as the local
    launcher's do (launcher.local.warm_workers), each child joining its cgroups so the job's limits hold it.
    false: every agent and worker starts cold. On a real cluster's nodes they always start cold."""


@dataclass
class SlurmHandle:
    job_id: str
    run_dir: Path
    nodes: str | None = None  # the node list while the job runs
    failing: dict[str, str] = field(default_factory=dict)  # nodes that left the running job, as Slurm said
    failed: list[dict[str, str]] = field(default_factory=list)  # per requeue: the nodes down, and why


DOWN_STATES = ("down", "drain", "fail", "no_respond", "not_responding")  # sinfo's %T, any suffix

class SlurmLauncher(Launcher):
    name = "slurm"
    settings = SlurmSettings

    @classmethod
    def placement(cls, cfg: SweepConfig) -> Placement:
        """launcher.slurm.admission=slurm: every run submitted at once, Slurm's backfill packing them (and
        holding the node cap: a cap of the harness's own is refused)."""
        admits_all = cfg.launcher.slurm.admission == "slurm"
        if admits_all and cfg.launcher.max_nodes is not None:
            raise ConfigError("launcher.slurm.admission=slurm leaves the node cap to Slurm: name a partition "
                              "(launcher.slurm.partition), or a --qos or --reservation in "
                              "launcher.slurm.extra_sbatch, instead of launcher.max_nodes")
        return cluster_placement(cfg, cls.name, admits_all=admits_all)

    def __init__(self, cfg: SweepConfig) -> None:
        self.cfg = cfg
        self.env = cold_env(dict(os.environ))  # sbatch exports it to the job
        self._controller_config: str | None = None  # `scontrol show config`, once it answered
        own: SlurmSettings = cfg.launcher.slurm  # launcher.slurm: this launcher's keys
        if own.conf:
            self.env["SLURM_CONF"] = own.conf
        # Where the nodes are this machine's CPUs (the local test cluster), the jobs' torchrun agents and
        # workers start warm as a local run's do; each warm child joins its job's cgroups (trainer/warm.py),
        # so a node's limits hold it as they would a cold one
        self.warm = WarmWorkers(True, own.python or sys.executable) if warm_here(cfg) else None
        # the jobs in flight, looked at together: at most once a launcher.poll_s
        self.board = Board(self._ask, least_s=cfg.launcher.poll_s)

    def preflight(self) -> None:
        """Fail before launching anything if this machine cannot reach a Slurm controller."""
        if shutil.which("sbatch") is None:
            raise ConfigError(f"sweep {self.cfg.sweep_name} uses launcher=slurm, but `sbatch` is not on "
                              "PATH: run it from a Slurm login node, choose launcher=local or "
                              "launcher=kubernetes, or preview the plan with: python -m bench.sweep "
                              f"+sweep={self.cfg.sweep_name} --dry-run")
        proc = self._run(["sinfo", "-h", "-o", "%P"], check=False)
        if proc.returncode != 0:
            raise ConfigError(f"Slurm controller not reachable (sinfo: {proc.stderr.strip()[:200]}); "
                              "start the test cluster with scripts/slurm_cluster.sh start, or dry-run")

    def node_names(self) -> tuple[list[str], dict[str, str]]:
        """The partition's nodes a job can run on, and those Slurm holds down (by state): the preflight's."""
        partition = self.cfg.launcher.slurm.partition
        left_out = self._excluded()
        nodes = {n: v for n, v in self._nodes(*(["-p", partition] if partition else [])).items()
                 if n not in left_out}
        up = [node for node, (_, down) in nodes.items() if not down]
        return up, {node: state for node, (state, down) in nodes.items() if down}

    def leave_out(self, nodes: list[str]) -> str:
        """sbatch's --exclude, a Slurm hostlist (the preflight leaves the nodes out too: _excluded)."""
        return f"\"launcher.slurm.extra_sbatch=['--exclude={','.join(nodes)}']\""

    def _excluded(self) -> set[str]:
        """Nodes the study's jobs leave out (launcher.slurm.extra_sbatch's --exclude=, a hostlist Slurm
        expands)."""
        lists = [x.split("=", 1)[1] for x in self.cfg.launcher.slurm.extra_sbatch
                 if x.startswith("--exclude=")]
        if not lists:
            return set()
        return set(self._run(["scontrol", "show", "hostnames", ",".join(lists)]).stdout.split())

    def _run(self, argv: list[str], check: bool = True, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env=env or self.env,
                              timeout=_CMD_TIMEOUT_S, check=check)

    def _ask(self, argv: list[str]) -> subprocess.CompletedProcess:
        """A Slurm command whose failure its caller reads (the controller did not answer)."""
        return self._run(argv, check=False)

    def close(self) -> None:
        """Stop the warm process, if one was started."""
        if self.warm:
            self.warm.close()

    def render(self, spec: RunSpec, run_dir: Path, seconds: float | None = None) -> Submission:
        own = self.cfg.launcher.slurm
        env = job_env(self.cfg, spec, worker_path(self.cfg, run_dir), image=own.container_image)
        script = render_script(self.cfg, spec, run_dir, env)
        log = rundir.log_path(Path(os.path.abspath(run_dir)), "slurm-%j")
        limit = time_limit(seconds) if own.admission == "slurm" and seconds else None
        argv = ("sbatch", "--parsable", f"--job-name={job_name(spec, run_dir)}", f"--output={log}",
                *([f"--time={limit}"] if limit else []),  # over the script's #SBATCH --time
                os.path.abspath(run_dir / rundir.SUBMISSION_DIR / SCRIPT))
        files = {SCRIPT: script}
        if limits_efa(self.cfg, spec):
            files[EFA_LIMIT] = EFA_LIMIT_SCRIPT
        if uses_nccl_tests(self.cfg, spec):
            files[NCCL_TESTS] = JSON_IF_SUPPORTED_SCRIPT
        return Submission(run_id=spec.run_id, argvs=(argv,), env=env, files=files)

    def submit(self, submission: Submission, run_dir: Path) -> SlurmHandle:
        (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
        env = self.warm.env(self.env, None) if self.warm else self.env
        proc = self._run(list(submission.argvs[0]), check=False, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr.strip()[:500]}")
        handle = SlurmHandle(job_id=proc.stdout.strip().split(";")[0], run_dir=run_dir)
        self.board.add(handle.job_id)
        return handle

    def locate(self, handle: SlurmHandle) -> dict[str, Any]:
        return {"job_id": handle.job_id}

    def attach(self, where: dict[str, Any], run_dir: Path) -> SlurmHandle | None:
        """The ledger's job, if Slurm still knows it (in the queue, or finished and still on record)."""
        job_id = where.get("job_id")
        if not job_id:
            return None
        job_id = str(job_id)
        row = (ask_queue(self._ask, [job_id]) or {}).get(job_id, GONE)
        if row.state is None and self.final_state(job_id, row)[0] is None:
            return None
        self.board.add(job_id, row)
        return SlurmHandle(job_id=job_id, run_dir=run_dir)

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
        runs = [dict(run) for run in self._accounted(handle.job_id)] or self._jobcomp_runs(handle.job_id)
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

    def _accounted(self, job_id: str) -> list[dict[str, str]]:
        """sacct's executions of the job: as the look that saw it leave the queue asked, else asked now."""
        runs = self.board.runs.get(job_id)
        return ask_accounting(self._ask, [job_id]).get(job_id, []) if runs is None else runs

    def final_state(self, job_id: str, row: Row) -> tuple[str | None, int | None, str | None]:
        """(JobState, exit code of the batch script, Reason) of a job that has left the queue (`row`, as
        squeue last showed it): squeue's while the controller holds it, else accounting's last execution,
        else the job-completion log's."""
        if row.state is not None:
            return row.state, row.exit_code, row.reason
        if runs := self._accounted(job_id):
            return runs[-1]["state"].split()[0], exit_code(runs[-1].get("exit_code", "")), None
        return self._from_jobcomp(job_id)

    def _from_jobcomp(self, job_id: str) -> tuple[str | None, int | None, str | None]:
        lines = self._jobcomp_lines(job_id)
        return _parse_job_record(lines[-1]) if lines else (None, None, None)

    def poll(self, handle: SlurmHandle) -> Poll:
        """What the last look at every job in flight said of this one (bench/launchers/slurm_queue.py); a
        job submitted since is pending."""
        row = self.board.row(handle.job_id)
        if row is None:
            return Poll(PENDING)
        state, reason, nodes = row.state, row.reason, row.nodes
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
        job_state, code, why = self.final_state(handle.job_id, row)
        return Poll(DONE, outcome=Outcome(returncodes=[code], scheduler_state=job_state,
                                          detail=why and f"Slurm {job_state}: {why}",
                                          executions=self.executions(handle)))

    def logs(self, handle: SlurmHandle, run_dir: Path) -> None:
        """Nothing to fetch: sbatch --output writes into the run dir (shared file system)."""

    def cleanup(self, handle: SlurmHandle) -> None:
        """scancel a job still in the queue and wait until it has left (its nodes are free again); it leaves
        the board."""
        try:
            if self._left(handle.job_id, asked=self.board.rows.get(handle.job_id)):
                return
            self._run(["scancel", handle.job_id], check=False)
            deadline = time.monotonic() + max(self.cfg.launcher.grace_s, 10)
            while time.monotonic() < deadline and not self._left(handle.job_id):
                time.sleep(0.5)
        finally:
            self.board.drop(handle.job_id)

    def _left(self, job_id: str, asked: Row | None = None) -> bool:
        """Whether the job has left the queue: as the last look saw it (`asked`), else as Slurm says now; not
        where Slurm does not answer (scancel is sent all the same)."""
        if asked is not None and not asked.in_queue:
            return True
        rows = ask_queue(self._ask, [job_id])
        return rows is not None and not rows[job_id].in_queue


def time_limit(seconds: float) -> str:
    """sbatch --time for a run predicted to take `seconds`: TIME_LIMIT_FACTOR times it, in whole minutes (the
    unit Slurm keeps limits in), at least one."""
    return str(max(1, math.ceil(TIME_LIMIT_FACTOR * seconds / 60)))


def _parse_job_record(text: str) -> tuple[str | None, int | None, str | None]:
    """JobState, ExitCode and Reason from a `scontrol show job -o` or jobcomp/filetxt line."""
    fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))
    state = (fields.get("JobState") or "").split()[0] or None
    code = fields.get("ExitCode")
    reason = fields.get("Reason")
    return state, int(code.split(":")[0]) if code else None, None if reason in (None, "None") else reason
