"""Kubernetes launcher: one Kubeflow job per run through the official `kubernetes` client.

create -> poll the job until a terminal condition -> read pod statuses and logs -> cleanup: delete with
foreground propagation and wait until it is gone, so the next run never meets a leftover job. A job is
pending while any of its pods is not running yet (Unschedulable included: the cluster may be busy or
scaling up; the runner's queue timeout bounds it); image problems that never resolve on their own
(ImagePullBackOff ...) end the run after grace_s. The worker's stdout is the transport of the metric
records (pod logs land in logs/).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.core import rundir
from bench.core.config import ConfigError, SweepConfig
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
)
from bench.launchers.k8s_manifests import MPIJOB, PYTORCHJOB, RUN_ID_LABEL, manifest
from bench.launchers.k8s_schema import CRD_NAMES, validate

MANIFEST = "manifest.yaml"
STUCK_WAITING = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError"}
DELETE_WAIT_S = 120


@dataclass
class K8sHandle:
    name: str
    api: dict[str, str]  # group/version/plural of the job kind
    run_id: str
    uid: str | None = None
    pods: list[Any] = field(default_factory=list)
    stuck_since: float | None = None


def _api(kind: str | None) -> dict[str, str]:
    """group/version/plural of a job kind (training runs: PyTorchJob; probes: MPIJob)."""
    return PYTORCHJOB if kind == PYTORCHJOB["kind"] else MPIJOB


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


# Pod disruption conditions (kubernetes.io/docs/concepts/workloads/pods/disruptions/, "Pod disruption
# conditions"): the reasons of a DisruptionTarget condition that mean the pod's node went away
NODE_LOST_REASONS = ("DeletionByTaintManager", "DeletionByPodGC")
ENDED_BY_NODE = ("Evicted", "NodeLost")  # a pod's end that its node decided


def _node(pod: Any) -> str:
    return getattr(pod.spec, "node_name", None) or "?"


def pod_problem(pods: list[Any]) -> tuple[str, str] | None:
    """The first pod state that decides the run: OOMKilled, Evicted or its node lost (each naming the node),
    stuck image pulls, Unschedulable."""
    return next((problem for pod in pods if (problem := _problem(pod))), None)


def _problem(pod: Any) -> tuple[str, str] | None:
    status, name = pod.status, pod.metadata.name
    if status.reason == "Evicted":
        return "Evicted", f"pod {name} on node {_node(pod)} evicted: {status.message or ''}".strip()
    for cond in status.conditions or []:
        if cond.type == "DisruptionTarget" and cond.status == "True":
            state = "NodeLost" if cond.reason in NODE_LOST_REASONS else "Evicted"
            return state, (f"pod {name} on node {_node(pod)} disrupted ({cond.reason}): "
                           f"{cond.message or ''}").strip()
    for cs in status.container_statuses or []:
        term = cs.state.terminated if cs.state else None
        if term and term.reason == "OOMKilled":
            return "OOMKilled", f"pod {name} container {cs.name} OOMKilled"
        wait = cs.state.waiting if cs.state else None
        if wait and wait.reason in STUCK_WAITING:
            return wait.reason, f"pod {name}: {wait.reason}: {wait.message or ''}".strip()
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return "Unschedulable", f"pod {name} unschedulable: {cond.message or ''}".strip()
    return None


def exit_codes(pods: list[Any]) -> list[int | None]:
    codes = []
    for pod in pods:
        for cs in pod.status.container_statuses or []:
            term = cs.state.terminated if cs.state else None
            codes.append(term.exit_code if term else None)
    return codes


def _restart(pod: Any, terminated: Any) -> dict[str, Any]:
    """One earlier run of a pod's worker container: its node, and what ended it where Kubernetes kept it."""
    node = _node(pod)
    reason = terminated.reason if terminated else "restarted"
    return {"state": f"pod restart ({reason})", "nodes": node,
            "start": str(terminated.started_at) if terminated else None,
            "end": str(terminated.finished_at) if terminated else None,
            "failed_nodes": {node: f"{pod.metadata.name}: {reason}"}}


def pod_executions(pods: list[Any], final: str) -> list[dict[str, Any]]:
    """A worker container that Kubernetes restarted ran more than once (restartPolicy Never forbids it,
    a user's policy may not): one entry per restart (only the last termination is kept by Kubernetes),
    then the final execution, on the record however it ended (a pod evicted or its node lost names that
    node); [] when no pod was seen."""
    earlier = []
    for pod in pods:
        for cs in pod.status.container_statuses or []:
            last = cs.last_state.terminated if cs.last_state else None
            earlier += [_restart(pod, last if i == cs.restart_count - 1 else None)
                        for i in range(cs.restart_count or 0)]
    if not pods:
        return []
    final_run: dict[str, Any] = {"state": final, "nodes": ",".join(sorted({_node(p) for p in pods}))}
    lost = {_node(p): problem[1] for p in pods if (problem := _problem(p)) and problem[0] in ENDED_BY_NODE}
    if lost:
        final_run["failed_nodes"] = lost
    return [*earlier, final_run]


class KubernetesLauncher(Launcher):
    name = "kubernetes"

    @classmethod
    def placement(cls, cfg: SweepConfig) -> Placement:
        return cluster_placement(cfg, cls.name)

    def __init__(self, cfg: SweepConfig, custom: Any = None, core: Any = None, version: Any = None,
                 extensions: Any = None) -> None:
        self.cfg = cfg
        self.namespace = cfg.cluster.kubernetes.namespace
        self._custom, self._core, self._version, self._ext = custom, core, version, extensions
        self.crds: dict[str, dict[str, Any]] | None = None  # kind -> CRD the cluster serves (preflight)

    def _connect(self) -> None:
        if self._custom is not None:
            return
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
        try:
            config.load_kube_config(config_file=self.cfg.launcher.kubeconfig,
                                    context=self.cfg.launcher.context)
        except (ConfigException, FileNotFoundError, TypeError) as e:
            try:
                config.load_incluster_config()
            except ConfigException:
                raise ConfigError(f"no Kubernetes configuration: {e}; set KUBECONFIG or launcher.kubeconfig, "
                                  "or preview with --dry-run") from None
        self._custom, self._core = client.CustomObjectsApi(), client.CoreV1Api()
        self._version = client.VersionApi()
        self._ext = client.ApiextensionsV1Api()

    def preflight(self) -> None:
        """Configuration, image and reachability, before anything is created."""
        if not self.cfg.cluster.kubernetes.image:
            raise ConfigError(f"cluster {self.cfg.cluster.name}: set cluster.kubernetes.image to your worker "
                              "image (see the Dockerfile)")
        self._connect()
        try:
            self._version.get_code(_request_timeout=15)
        except Exception as e:
            raise ConfigError(f"Kubernetes API not reachable: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200]}") from None
        self.crds = self.read_crds()

    def node_names(self) -> tuple[list[str], dict[str, str]]:
        """The nodes of the cluster's instance type that are Ready, and those that are not (by why): the
        preflight's."""
        self._connect()
        label = self.cfg.cluster.kubernetes.instance_type_label
        kind = self.cfg.cluster.instance_type
        selector = f"{label}={kind}" if kind != "local" else None
        up, down = [], {}
        for node in self._core.list_node(label_selector=selector, _request_timeout=30).items:
            ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "Unknown")
            if ready == "True" and not node.spec.unschedulable:
                up.append(node.metadata.name)
            else:
                down[node.metadata.name] = "cordoned" if node.spec.unschedulable else f"Ready={ready}"
        return up, down

    def read_crds(self) -> dict[str, dict[str, Any]]:
        """The Kubeflow CRDs installed in the cluster (apiextensions.k8s.io/v1), by kind; a kind whose CRD is
        missing is left out (a sweep without probes needs no MPI operator)."""
        from kubernetes.client.exceptions import ApiException
        crds = {}
        for kind, name in CRD_NAMES.items():
            try:
                response = self._ext.read_custom_resource_definition(name, _preload_content=False)
            except ApiException as e:
                if e.status == 404:
                    continue
                raise ConfigError(f"cannot read CRD {name}: {e.status} {e.reason}") from None
            crds[kind] = json.loads(response.data)
        return crds

    def render(self, spec: RunSpec, run_dir: Path, seconds: float | None = None) -> Submission:
        """The manifest; checked against the cluster's own CRDs once preflight has read them (a dry run
        without a cluster checks nothing here)."""
        obj = manifest(self.cfg, spec)
        if self.crds is not None:
            errors = validate(obj, self.crds)
            if errors:
                raise ConfigError(f"rendered {obj['kind']} does not validate against the cluster's CRD: "
                                  f"{errors[0]}")
        return Submission(run_id=spec.run_id, argvs=(),
                          files={MANIFEST: yaml.safe_dump(obj, sort_keys=False)})

    def admit(self, submission: Submission) -> None:
        """Server-side dry run of the create: the API server's own validation, defaulting and admission
        webhooks judge the manifest, and nothing is created."""
        from kubernetes.client.exceptions import ApiException
        self._connect()
        body = yaml.safe_load(submission.files[MANIFEST])
        api = _api(body["kind"])
        try:
            self._custom.create_namespaced_custom_object(api["group"], api["version"], self.namespace,
                                                         api["plural"], body, dry_run="All")
        except ApiException as e:
            message = e.reason
            try:
                message = json.loads(e.body or "{}").get("message") or message
            except ValueError:
                pass
            raise ConfigError(f"the cluster refuses the {body['kind']} of run {submission.run_id} "
                              f"(server-side dry run): {e.status} {message}") from None

    def submit(self, submission: Submission, run_dir: Path) -> K8sHandle:
        self._connect()
        body = yaml.safe_load(submission.files[MANIFEST])
        body["metadata"]["name"] = f"{body['metadata']['name']}-{_attempt_suffix()}"
        api = _api(body["kind"])
        created = self._custom.create_namespaced_custom_object(api["group"], api["version"], self.namespace,
                                                               api["plural"], body)
        uid = ((created or {}).get("metadata") or {}).get("uid")
        return K8sHandle(name=body["metadata"]["name"], api=api, run_id=submission.run_id, uid=uid)

    def locate(self, handle: K8sHandle) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": handle.name, "uid": handle.uid,
                "kind": handle.api["kind"]}

    def attach(self, where: dict[str, Any], run_dir: Path) -> K8sHandle | None:
        """The ledger's job if it still exists with the same uid (a job re-created under the name is not
        it)."""
        if not where.get("name"):
            return None
        self._connect()
        api = _api(where.get("kind"))
        handle = K8sHandle(name=where["name"], api=api, run_id="", uid=where.get("uid"))
        job = self._get(handle)
        if job is None or (handle.uid and job["metadata"].get("uid") != handle.uid):
            return None
        handle.run_id = job["metadata"]["labels"][RUN_ID_LABEL]  # its pods carry the same label
        return handle

    def _get(self, handle: K8sHandle) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException
        try:
            return self._custom.get_namespaced_custom_object(
                handle.api["group"], handle.api["version"], self.namespace, handle.api["plural"], handle.name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _pods(self, handle: K8sHandle) -> list[Any]:
        return self._core.list_namespaced_pod(self.namespace,
                                              label_selector=f"{RUN_ID_LABEL}={handle.run_id}").items

    def poll(self, handle: K8sHandle) -> Poll:
        job = self._get(handle)
        handle.pods = self._pods(handle)
        done = terminal_condition(job) if job else ("Failed", "job disappeared")
        problem = pod_problem(handle.pods)
        if done:
            state, detail = done
            if problem and problem[0] != "Unschedulable":  # more specific (OOMKilled, Evicted) than "Failed"
                state, detail = problem
            elif "deadline" in detail.lower():
                state = "DeadlineExceeded"
            return self._done(handle, None if state == "Succeeded" else state, detail)
        if problem and problem[0] in ("OOMKilled", *ENDED_BY_NODE):
            return self._done(handle, *problem)
        if problem and problem[0] in STUCK_WAITING:
            handle.stuck_since = handle.stuck_since or time.monotonic()
            if time.monotonic() - handle.stuck_since > self.cfg.launcher.grace_s:
                return self._done(handle, *problem)
        else:
            handle.stuck_since = None
        if handle.pods and all(p.status.phase in ("Running", "Succeeded", "Failed") for p in handle.pods):
            return Poll(RUNNING)
        return Poll(PENDING, reason=problem[1] if problem else "pods not running yet")

    def _done(self, handle: K8sHandle, state: str | None, detail: str) -> Poll:
        return Poll(DONE, outcome=Outcome(returncodes=exit_codes(handle.pods), scheduler_state=state,
                                          detail=detail,
                                          executions=pod_executions(handle.pods, state or "Succeeded")))

    def logs(self, handle: K8sHandle, run_dir: Path) -> None:
        """Save every pod's log into the run dir (before cleanup deletes the job, and the logs with it)."""
        for pod in handle.pods or self._pods(handle):
            for container in pod.spec.containers:
                try:
                    text = self._core.read_namespaced_pod_log(pod.metadata.name, self.namespace,
                                                              container=container.name)
                except Exception as e:  # pod never started, node gone ...
                    text = f"fsdpbench: could not read log of {pod.metadata.name}/{container.name}: {e}\n"
                path = rundir.log_path(run_dir, f"{pod.metadata.name}-{container.name}")
                rundir.atomic_write_text(path, text)

    def cleanup(self, handle: K8sHandle) -> None:
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
