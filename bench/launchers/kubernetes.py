"""Kubernetes launcher: one Kubeflow job per run through the official `kubernetes` client.

create -> poll the job (a GET of the job, a LIST of its pods by label, every launcher.poll_s) until a
terminal condition -> read pod statuses and logs -> cleanup: delete with foreground propagation; the runner
then asks, between its looks at the other runs, until the job is gone (`remains`), so the next run never
meets a leftover job and a deletion that never finishes is named with the command that ends it. A job is
pending while any of its pods is not running yet (Unschedulable included: the cluster may be busy or
scaling up; the runner's queue timeout bounds it); image problems that never resolve on their own
(ImagePullBackOff ...) end the run after grace_s. The job's own final condition (the operator's Succeeded
or Failed, its deadline) and a deletion by someone else end the run with their words. The worker's stdout
is the transport of the metric records (pod logs land in logs/). Every failed API call is one line
(k8s_api.py); what the job's conditions and pod statuses say is read in k8s_status.py.
"""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml

from bench.core import rundir
from bench.core.config import ConfigError, Matches, SweepConfig
from bench.core.schema import RunSpec
from bench.launchers.base import (
    DONE,
    ENDED_BY_DEADLINE,
    ENDED_BY_DELETION,
    PENDING,
    RUNNING,
    Launcher,
    Outcome,
    Placement,
    Poll,
    Remains,
    Submission,
    cluster_placement,
    condition_text,
)
from bench.launchers.k8s_api import Api, ApiError, load_config
from bench.launchers.k8s_manifests import MPIJOB, PYTORCHJOB, RUN_ID_LABEL, manifest
from bench.launchers.k8s_schema import CRD_NAMES, validate
from bench.launchers.k8s_status import (
    ENDED_BY_NODE,
    STUCK_WAITING,
    ended_by,
    exit_codes,
    node_of,
    pod_executions,
    pod_problem,
    ran,
    terminal_condition,
)

MANIFEST = "manifest.yaml"
# Seconds a deleted job may take to go (its pods' grace period, then the garbage collector's foreground
# deletion, seconds on a healthy cluster) before its run is recorded with the job still there and the
# command that removes it; the runner waits between its looks at the other runs
DELETE_WAIT_S = 120
DELETED = "the job was deleted outside the sweep"


# What the Kubernetes API accepts (RFC 1123 labels and subdomains, resource quantities, image references),
# declared on the settings below so a bad value is one line before anything is written, not a refused
# create per run
RFC1123_LABEL = Matches(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
                        "an RFC 1123 label of lower-case letters, digits and -")
_SUBDOMAIN = r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
SECRET, SERVICE_ACCOUNT, NODE = (Matches(_SUBDOMAIN, f"a {what} name")
                                 for what in ("Secret", "ServiceAccount", "node"))
QUANTITY = Matches(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?", "a quantity such as 64Gi")
IMAGE = Matches(r"(?=.{1,253}$)(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                r"(?:@sha256:[0-9a-f]{64})?", "an image reference such as registry/repo:tag")


@dataclass
class KubernetesSettings:
    """The Kubernetes launcher's own keys: which API server and namespace, the worker image, and what each
    run's pods get (a Kubeflow PyTorchJob per training run, an MPIJob per nccl-tests probe)."""

    kubeconfig: str | None = None
    """The kubeconfig file; null: $KUBECONFIG, else ~/.kube/config, else the in-cluster config."""
    context: str | None = None
    """The kubeconfig context; null: its current context."""
    namespace: Annotated[str, RFC1123_LABEL] = "default"
    """The namespace the jobs are created in."""
    image: Annotated[str | None, IMAGE] = None
    """Your worker image, built from this repository's Dockerfile (registry/repo:tag); needed to launch."""
    instance_type_label: str = "node.kubernetes.io/instance-type"
    """The node label the pods select on, with the value cluster.instance_type."""
    shm_size: Annotated[str, QUANTITY] = "64Gi"
    """Size of each worker's /dev/shm (NCCL and data loaders need more than the default)."""
    hf_token_secret: Annotated[str | None, SECRET] = None
    """Name of a Secret with key `token` (a Hugging Face token), referenced by the pods, never inlined;
    null: none."""
    image_pull_secret: Annotated[str | None, SECRET] = None
    """Name of the Secret the pods pull the image with; null: none."""
    service_account: Annotated[str | None, SERVICE_ACCOUNT] = None
    """The ServiceAccount the pods run as; null: the namespace's default."""
    exclude_nodes: Annotated[list[str], NODE] = field(default_factory=list)
    """Nodes the study's pods keep off, by node name as `kubectl get nodes` and the preflight name them (a
    required node affinity on each pod: metadata.name NotIn); the preflight leaves them out too."""


@dataclass
class K8sHandle:
    name: str
    api: dict[str, str]  # group/version/plural of the job kind
    run_id: str
    uid: str | None = None
    pods: list[Any] = field(default_factory=list)
    stuck_since: float | None = None
    deleted_at: float | None = None  # when cleanup deleted it (monotonic)


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


def deleted_outside(job: dict[str, Any] | None, handle: K8sHandle) -> bool:
    """The job is gone, being deleted, or another under its name, while the sweep has not deleted it."""
    if job is None:
        return True
    meta = job.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) or bool(handle.uid and meta.get("uid") != handle.uid)


class KubernetesLauncher(Launcher):
    name = "kubernetes"
    settings = KubernetesSettings

    @classmethod
    def placement(cls, cfg: SweepConfig) -> Placement:
        return cluster_placement(cfg, cls.name)

    def __init__(self, cfg: SweepConfig, custom: Any = None, core: Any = None, version: Any = None,
                 extensions: Any = None) -> None:
        self.cfg = cfg
        self.namespace = cfg.launcher.kubernetes.namespace
        self._custom, self._core, self._version, self._ext = custom, core, version, extensions
        self.server = ""  # the API server's address, once connected through a kubeconfig
        self.crds: dict[str, dict[str, Any]] | None = None  # kind -> CRD the cluster serves (preflight)

    def _connect(self) -> None:
        if self._custom is not None:
            return
        from kubernetes import client
        own = self.cfg.launcher.kubernetes
        self.server = load_config(own.kubeconfig, own.context)
        self._custom, self._core = client.CustomObjectsApi(), client.CoreV1Api()
        self._version = client.VersionApi()
        self._ext = client.ApiextensionsV1Api()

    # The client's API objects, connected on first use, each failed call one ApiError (k8s_api.py)
    @property
    def custom(self) -> Any:
        self._connect()
        return Api(self._custom, self.server)

    @property
    def core(self) -> Any:
        self._connect()
        return Api(self._core, self.server)

    def preflight(self) -> None:
        """Configuration, image and reachability, before anything is created."""
        if not self.cfg.launcher.kubernetes.image:
            raise ConfigError(f"cluster {self.cfg.cluster.name}: set launcher.kubernetes.image to your "
                              "worker image (see the Dockerfile)")
        self._connect()
        where = f"Kubernetes API at {self.server}" if self.server else "Kubernetes API"
        try:
            Api(self._version, self.server).get_code(_request_timeout=15)
        except ApiError as e:  # unreachable (no status): its text names the server
            raise ConfigError(str(e) if e.status is None else f"{where}: {e}") from None
        except Exception as e:  # noqa: BLE001 - whatever else the client raises, in one line
            first = str(e).splitlines()[0][:200] if str(e) else ""
            raise ConfigError(f"{where} not usable: {type(e).__name__}: {first}") from None
        self.crds = self.read_crds()

    def node_selector(self) -> str | None:
        """The label selector of the study's nodes (the instance type's label); None: every node."""
        kind = self.cfg.cluster.instance_type
        return f"{self.cfg.launcher.kubernetes.instance_type_label}={kind}" if kind != "local" else None

    def node_names(self) -> tuple[list[str], dict[str, str]]:
        """The Ready nodes of the cluster's instance type, and those that are not (by why), less the ones
        the study leaves out (launcher.kubernetes.exclude_nodes): the preflight's. None Ready is one
        ConfigError naming the selector and what to do."""
        selector = self.node_selector()
        try:
            listed = self.core.list_node(label_selector=selector, _request_timeout=30).items
        except ApiError as e:  # a user whose rights end at its namespace may not list nodes
            raise ConfigError(f"preflight: cannot list the nodes ({selector or 'all'}): {e}; name them with "
                              "preflight.nodes=[...], or preflight.mode=off") from None
        left_out = set(self.cfg.launcher.kubernetes.exclude_nodes)
        up, down = [], {}
        for node in (n for n in listed if n.metadata.name not in left_out):
            ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "Unknown")
            if ready == "True" and not node.spec.unschedulable:
                up.append(node.metadata.name)
            else:
                down[node.metadata.name] = "cordoned" if node.spec.unschedulable else f"Ready={ready}"
        if not up:
            raise ConfigError(self._no_ready_node(selector, down, len(listed) - len(up) - len(down)))
        return up, down

    def _no_ready_node(self, selector: str | None, down: dict[str, str], left_out: int) -> str:
        seen = (f"{len(down)} not Ready: " + ", ".join(f"{n} ({why})" for n, why in list(down.items())[:3])
                + (" ..." if len(down) > 3 else "")) if down else "the cluster lists none"
        if left_out:
            seen += f"; {left_out} left out by launcher.kubernetes.exclude_nodes"
        label = self.cfg.launcher.kubernetes.instance_type_label
        return (f"preflight: no Ready node matches {selector or 'any node'} ({seen}); check "
                f"cluster.instance_type and launcher.kubernetes.instance_type_label against `kubectl get "
                f"nodes -L {label}`, or scale the node group up (preflight.mode=off lets the runs' own pods "
                "do it)")

    def leave_out(self, nodes: list[str]) -> str:
        """A required node affinity on every pod of the study (k8s_manifests.py); the preflight leaves them
        out too (node_names)."""
        return f"launcher.kubernetes.exclude_nodes=[{','.join(nodes)}]"

    def read_crds(self) -> dict[str, dict[str, Any]]:
        """The Kubeflow CRDs installed in the cluster (apiextensions.k8s.io/v1), by kind; a kind whose CRD is
        missing is left out (a sweep without probes needs no MPI operator)."""
        crds = {}
        for kind, name in CRD_NAMES.items():
            try:
                response = Api(self._ext, self.server).read_custom_resource_definition(
                    name, _preload_content=False)
            except ApiError as e:
                if e.status == 404:
                    continue
                raise ConfigError(f"cannot read CRD {name}: {e}") from None
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
        body = yaml.safe_load(submission.files[MANIFEST])
        api = _api(body["kind"])
        try:
            self.custom.create_namespaced_custom_object(api["group"], api["version"], self.namespace,
                                                        api["plural"], body, dry_run="All")
        except ApiError as e:
            raise ConfigError(f"the cluster refuses the {body['kind']} of run {submission.run_id} "
                              f"(server-side dry run): {e}") from None

    def submit(self, submission: Submission, run_dir: Path) -> K8sHandle:
        body = yaml.safe_load(submission.files[MANIFEST])
        body["metadata"]["name"] = f"{body['metadata']['name']}-{_attempt_suffix()}"
        api = _api(body["kind"])
        created = self.custom.create_namespaced_custom_object(api["group"], api["version"], self.namespace,
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
        api = _api(where.get("kind"))
        handle = K8sHandle(name=where["name"], api=api, run_id="", uid=where.get("uid"))
        job = self._get(handle)
        if job is None or (handle.uid and job["metadata"].get("uid") != handle.uid):
            return None
        handle.run_id = job["metadata"]["labels"][RUN_ID_LABEL]  # its pods carry the same label
        return handle

    def _get(self, handle: K8sHandle) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                handle.api["group"], handle.api["version"], self.namespace, handle.api["plural"], handle.name)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def _pods(self, handle: K8sHandle) -> list[Any]:
        return self.core.list_namespaced_pod(self.namespace,
                                             label_selector=f"{RUN_ID_LABEL}={handle.run_id}").items

    def poll(self, handle: K8sHandle) -> Poll:
        """Two calls: GET the job, LIST its pods. Done at the job's terminal condition, a pod state that
        decides the run, or its deletion by someone else."""
        job = self._get(handle)
        handle.pods = self._pods(handle)
        if deleted_outside(job, handle):
            return self._done(handle, None, DELETED, ended=ENDED_BY_DELETION)
        problem = pod_problem(handle.pods)
        if condition := terminal_condition(job or {}):
            return self._finished(handle, condition, problem)
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

    def _finished(self, handle: K8sHandle, condition: dict[str, str], problem: tuple[str, str] | None
                  ) -> Poll:
        """The operator's verdict, a pod state more specific than its Failed (OOMKilled, Evicted) first."""
        state, detail, ended = condition["type"], condition_text(condition), ended_by(condition)
        if problem and problem[0] != "Unschedulable":
            state, detail = problem
        elif ended == ENDED_BY_DEADLINE:
            state = "DeadlineExceeded"
        return self._done(handle, None if state == "Succeeded" else state, detail, condition, ended)

    def _done(self, handle: K8sHandle, state: str | None, detail: str,
              condition: dict[str, str] | None = None, ended: str | None = None) -> Poll:
        pods = handle.pods
        return Poll(DONE, outcome=Outcome(returncodes=exit_codes(pods), scheduler_state=state, detail=detail,
                                          executions=pod_executions(pods, state or "Succeeded"),
                                          condition=condition, ended_by=ended,
                                          never_ran=not any(ran(p) for p in pods)))

    def logs(self, handle: K8sHandle, run_dir: Path) -> None:
        """Save every pod's log into the run dir (before cleanup deletes the job, and the logs with it). A pod
        that never ran has none (the API answers 204, which the client returns as None): its file is empty;
        a log that cannot be read says why in its file. Neither fails the run: its pods' states and the
        job's conditions decide it."""
        for pod in handle.pods or self._pods(handle):
            for container in pod.spec.containers:
                path = rundir.log_path(run_dir, f"{pod.metadata.name}-{container.name}")
                rundir.atomic_write_text(path, self._log(pod.metadata.name, container.name))

    def _log(self, pod: str, container: str) -> str:
        try:
            text = self.core.read_namespaced_pod_log(pod, self.namespace, container=container)
        except ApiError as e:  # the container is waiting to start, the node is gone ...
            return f"fsdpbench: could not read the log of {pod}/{container}: {e}\n"
        return text.decode(errors="replace") if isinstance(text, bytes) else text or ""

    def cleanup(self, handle: K8sHandle) -> None:
        """Delete with foreground propagation (pods first); what has not gone yet, `remains` says."""
        from kubernetes.client import V1DeleteOptions
        handle.deleted_at = handle.deleted_at or time.monotonic()
        try:
            self.custom.delete_namespaced_custom_object(
                handle.api["group"], handle.api["version"], self.namespace, handle.api["plural"], handle.name,
                body=V1DeleteOptions(propagation_policy="Foreground"))
        except ApiError as e:
            if e.status != 404:
                raise

    def remains(self, handle: K8sHandle) -> Remains | None:
        """None once the job is gone (one GET); after DELETE_WAIT_S, what holds it and the command that
        removes it."""
        job = self._get(handle)
        if job is None:
            return None
        waited = time.monotonic() - (handle.deleted_at or time.monotonic())
        if waited < DELETE_WAIT_S:
            return Remains(f"job {handle.name} is being deleted")
        return Remains(self._left_behind(handle, job, waited), final=True)

    def _left_behind(self, handle: K8sHandle, job: dict[str, Any], waited: float) -> str:
        """What keeps a deleted job, and the kubectl command that ends it: never deleted (the delete call
        failed), pods that do not go (their node is gone), else its finalizers (no garbage collector)."""
        meta, ns = job.get("metadata") or {}, self.namespace
        kind = f"{handle.api['plural']}.{handle.api['group']}"
        pods = self._pods(handle)
        if not meta.get("deletionTimestamp"):
            why, argv = "it was never deleted", ["kubectl", "delete", kind, handle.name, "-n", ns]
        elif pods:
            names = ", ".join(f"{p.metadata.name} on {node_of(p)}" for p in pods[:3])
            names += " ..." * (len(pods) > 3)
            why = f"waiting for {len(pods)} pod(s) to go ({names})"
            argv = ["kubectl", "delete", "pods", "-n", ns, "-l", f"{RUN_ID_LABEL}={handle.run_id}", "--force",
                    "--grace-period=0"]
        else:
            why = f"held by its finalizers {meta.get('finalizers') or []} (is the garbage collector running?)"
            argv = ["kubectl", "patch", kind, handle.name, "-n", ns, "--type=merge", "-p",
                    '{"metadata":{"finalizers":null}}']
        return (f"job {handle.name} is still there {waited:.0f} s after its deletion, {why}; remove it with: "
                f"{shlex.join(argv)}")
