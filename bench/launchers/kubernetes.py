"""Kubernetes launcher: one Kubeflow job per run through the official `kubernetes` client.

create -> poll the job until a terminal condition, the deadline or Ctrl-C -> read pod statuses and logs
-> delete with foreground propagation and wait until it is gone, so the next run never meets a leftover
job. Pod problems that never resolve on their own (ImagePullBackOff, Unschedulable) end the run after
grace_s. The worker's stdout is the transport of the metric records (pod logs land in logs/).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import rundir
from bench.config import ConfigError, SweepConfig
from bench.launchers.base import Outcome, Submission
from bench.launchers.k8s_manifests import MPIJOB, PYTORCHJOB, RUN_ID_LABEL, manifest
from bench.launchers.k8s_schema import crd_dir, validate
from bench.schema import RunSpec

MANIFEST = "manifest.yaml"
STUCK_WAITING = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError"}
DELETE_WAIT_S = 120


@dataclass
class K8sHandle:
    name: str
    api: dict[str, str]  # group/version/plural of the job kind
    run_id: str
    started: float = field(default_factory=time.monotonic)
    pods: list[Any] = field(default_factory=list)


def _attempt_suffix() -> str:
    """A short, time-based suffix: each attempt of a run gets a job name of its own."""
    n, digits, out = int(time.time() * 10), "0123456789abcdefghijklmnopqrstuvwxyz", ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out[-6:]


def terminal_condition(job: dict[str, Any]) -> tuple[str, str] | None:
    """(Succeeded|Failed, reason: message) once the job has a true terminal condition."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return cond["type"], f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
    return None


def pod_problem(pods: list[Any]) -> tuple[str, str] | None:
    """The first pod state that decides the run: OOMKilled, Evicted, stuck image pulls, Unschedulable."""
    for pod in pods:
        status = pod.status
        if status.reason == "Evicted":
            return "Evicted", f"pod {pod.metadata.name} evicted: {status.message or ''}".strip()
        for cs in status.container_statuses or []:
            term = cs.state.terminated if cs.state else None
            if term and term.reason == "OOMKilled":
                return "OOMKilled", f"pod {pod.metadata.name} container {cs.name} OOMKilled"
            wait = cs.state.waiting if cs.state else None
            if wait and wait.reason in STUCK_WAITING:
                return wait.reason, f"pod {pod.metadata.name}: {wait.reason}: {wait.message or ''}".strip()
        for cond in status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                return "Unschedulable", f"pod {pod.metadata.name} unschedulable: {cond.message or ''}".strip()
    return None


def exit_codes(pods: list[Any]) -> list[int | None]:
    codes = []
    for pod in pods:
        for cs in pod.status.container_statuses or []:
            term = cs.state.terminated if cs.state else None
            codes.append(term.exit_code if term else None)
    return codes


class KubernetesLauncher:
    name = "kubernetes"

    def __init__(self, cfg: SweepConfig, custom: Any = None, core: Any = None, version: Any = None) -> None:
        self.cfg = cfg
        self.namespace = cfg.cluster.kubernetes.namespace
        self._custom, self._core, self._version = custom, core, version

    def _connect(self) -> None:
        if self._custom is not None:
            return
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
        try:
            config.load_kube_config(config_file=self.cfg.launcher.kubeconfig, context=self.cfg.launcher.context)
        except (ConfigException, FileNotFoundError, TypeError) as e:
            try:
                config.load_incluster_config()
            except ConfigException:
                raise ConfigError(f"no Kubernetes configuration: {e}; set KUBECONFIG or launcher.kubeconfig, "
                                  "or preview with --dry-run") from None
        self._custom, self._core, self._version = client.CustomObjectsApi(), client.CoreV1Api(), client.VersionApi()

    def preflight(self) -> None:
        """Configuration, image and reachability, before anything is created."""
        if not self.cfg.cluster.kubernetes.image:
            raise ConfigError(f"cluster {self.cfg.cluster.name}: set cluster.kubernetes.image to your worker "
                              "image (see the Dockerfile)")
        self._connect()
        try:
            self._version.get_code(_request_timeout=15)
        except Exception as e:
            raise ConfigError(f"Kubernetes API not reachable: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                              ) from None

    def render(self, spec: RunSpec, run_dir: Path) -> Submission:
        obj = manifest(self.cfg, spec)
        if crd_dir().is_dir():
            errors = validate(obj)
            if errors:
                raise ConfigError(f"rendered {obj['kind']} does not validate: {errors[0]}")
        return Submission(run_id=spec.run_id, argvs=(), files={MANIFEST: yaml.safe_dump(obj, sort_keys=False)})

    def submit(self, submission: Submission, run_dir: Path) -> K8sHandle:
        self._connect()
        body = yaml.safe_load(submission.files[MANIFEST])
        body["metadata"]["name"] = f"{body['metadata']['name']}-{_attempt_suffix()}"
        api = PYTORCHJOB if body["kind"] == PYTORCHJOB["kind"] else MPIJOB
        self._custom.create_namespaced_custom_object(api["group"], api["version"], self.namespace, api["plural"],
                                                     body)
        rundir.atomic_write_text(run_dir / rundir.SUBMISSION_DIR / "job-name.txt", body["metadata"]["name"] + "\n")
        return K8sHandle(name=body["metadata"]["name"], api=api, run_id=submission.run_id)

    def _get(self, handle: K8sHandle) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException
        try:
            return self._custom.get_namespaced_custom_object(handle.api["group"], handle.api["version"],
                                                             self.namespace, handle.api["plural"], handle.name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _pods(self, handle: K8sHandle) -> list[Any]:
        return self._core.list_namespaced_pod(self.namespace, label_selector=f"{RUN_ID_LABEL}={handle.run_id}").items

    def wait(self, handle: K8sHandle, timeout_s: float, stop: threading.Event) -> Outcome:
        deadline = handle.started + timeout_s
        stuck_since: float | None = None
        outcome = Outcome(returncodes=[])
        while True:
            job = self._get(handle)
            handle.pods = self._pods(handle)
            done = terminal_condition(job) if job else ("Failed", "job disappeared")
            problem = pod_problem(handle.pods)
            now = time.monotonic()
            if done:
                state, detail = done
                if problem:  # a more specific reason (OOMKilled, Evicted) than "Failed"
                    state, detail = problem
                elif "deadline" in detail.lower():
                    state = "DeadlineExceeded"
                outcome.scheduler_state, outcome.detail = (None if state == "Succeeded" else state), detail
                break
            if problem and problem[0] in ("OOMKilled", "Evicted"):
                outcome.scheduler_state, outcome.detail = problem
                break
            if problem:
                stuck_since = stuck_since or now
                if now - stuck_since > self.cfg.launcher.grace_s:
                    outcome.scheduler_state, outcome.detail = problem
                    break
            else:
                stuck_since = None
            if stop.is_set():
                outcome.cancelled = True
                break
            if now > deadline:
                outcome.timed_out = True
                break
            stop.wait(self.cfg.launcher.poll_s)
        outcome.returncodes = exit_codes(handle.pods)
        outcome.wall_s = time.monotonic() - handle.started
        return outcome

    def logs(self, handle: K8sHandle, run_dir: Path) -> None:
        """Save every pod's log into the run dir, then delete the job (logs are gone after that)."""
        for pod in handle.pods or self._pods(handle):
            for container in pod.spec.containers:
                try:
                    text = self._core.read_namespaced_pod_log(pod.metadata.name, self.namespace,
                                                              container=container.name)
                except Exception as e:  # pod never started, node gone ...
                    text = f"fsdpbench: could not read log of {pod.metadata.name}/{container.name}: {e}\n"
                rundir.atomic_write_text(rundir.log_path(run_dir, f"{pod.metadata.name}-{container.name}"), text)
        self.cancel(handle)

    def cancel(self, handle: K8sHandle) -> None:
        """Delete with foreground propagation (pods first) and wait until the job is gone."""
        from kubernetes.client import V1DeleteOptions
        from kubernetes.client.exceptions import ApiException
        try:
            self._custom.delete_namespaced_custom_object(
                handle.api["group"], handle.api["version"], self.namespace, handle.api["plural"], handle.name,
                body=V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as e:
            if e.status != 404:
                raise
        deadline = time.monotonic() + DELETE_WAIT_S
        while self._get(handle) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {handle.name} still present {DELETE_WAIT_S} s after its deletion")
            time.sleep(min(self.cfg.launcher.poll_s, 1.0))
