"""Kubernetes launcher: manifests against the real CRD schemas, control flow against a fake API client.

No API server runs here, so the boundary is faked: the fake stores what the real client would send,
validates each created object with the CRD schema (as the API server would) and returns real
kubernetes.client model objects for pods. Pod logs carry real worker records and real nccl-tests output.
"""
from __future__ import annotations

import copy
import functools
import json
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import yaml
from kubernetes.client import (
    V1Container,
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Node,
    V1NodeCondition,
    V1NodeList,
    V1NodeSpec,
    V1NodeStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodList,
    V1PodSpec,
    V1PodStatus,
)
from kubernetes.client.exceptions import ApiException

from bench.core.config import ConfigError
from bench.core.load_config import from_dict
from bench.core.records import format_record
from bench.launchers import launcher_sections, placement_of
from bench.launchers.k8s_manifests import RUN_ID_LABEL, manifest
from bench.launchers.k8s_schema import CRD_NAMES, load_crds, validate
from bench.launchers.kubernetes import KubernetesLauncher
from bench.run.runner import execute
from bench.run.watch import watch
from bench.study.plan import expand
from bench.sweep import compose, run_options

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdpbench:1.0"


def cfg_for(sweep: str, *overrides: str):
    """The sweep's typed configuration on Kubernetes: a copy of the one composed once per set of overrides
    (Hydra's composition is most of a short test's time)."""
    return copy.deepcopy(_composed(sweep, overrides))


@functools.cache
def _composed(sweep: str, overrides: tuple[str, ...]):
    raw, _ = compose([f"+sweep={sweep}", "launcher=kubernetes", f"launcher.kubernetes.image={IMAGE}",
                      "launcher.poll_s=0.01", "launcher.grace_s=0.05", *overrides])
    return from_dict(raw, launcher_sections())


@pytest.mark.parametrize("sweep", ["p5_scaling", "p4de_scaling", "ablation", "efa_probe", "p5_options"])
def test_every_manifest_the_sweeps_produce_validates(shared_data, sweep: str) -> None:
    cfg = cfg_for(sweep, "launcher.kubernetes.hf_token_secret=hf-token",
                  "launcher.kubernetes.image_pull_secret=ecr", "launcher.kubernetes.service_account=trainer")
    plan = expand(cfg)
    for planned in plan:
        obj = manifest(cfg, planned.spec)
        assert validate(obj, load_crds(shared_data / "k8s")) == [], planned.spec.label
    assert len(plan) > 0


def _envsubst(text: str) -> str:
    values = {"NUM_NODES": "2", "GPU_PER_NODE": "8", "EFA_PER_NODE": "32", "IMAGE_URI": IMAGE,
              "INSTANCE_TYPE": "p5.48xlarge", "FI_PROVIDER": "efa", "HF_TOKEN": "hf_dummy",
              "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/lib"}
    text = re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), text)
    return text.replace("<account>.dkr.ecr.<region>.amazonaws.com/<image>:<tag>", IMAGE)


@pytest.mark.parametrize("name", ["reference_pytorchjob_llama3_1_8b-fsdp.yaml",
                                  "reference_mpijob_nccl-tests.yaml"])
def test_reference_manifests_validate(shared_data, name: str) -> None:
    obj = yaml.safe_load(_envsubst((shared_data / "k8s" / name).read_text()))
    assert validate(obj, load_crds(shared_data / "k8s")) == []


def _train_manifest(**overrides: str) -> dict[str, Any]:
    cfg = cfg_for("p5_scaling", *[f"{k}={v}" for k, v in overrides.items()])
    return manifest(cfg, next(p.spec for p in expand(cfg) if p.spec.kind == "train" and p.spec.nodes == 2))


@pytest.mark.parametrize("path,value,message", [
    (("spec", "pytorchReplicaSpecs", "Worker", "replicas"), "two", "is not of type 'integer'"),
    (("spec", "runPolicy", "activeDeadlineSeconds"), "1h", "is not of type 'integer'"),
    (("spec", "elasticPolicy", "rdzvBackends"), "c10d", "Additional properties are not allowed"),
])
def test_a_wrong_manifest_is_rejected(shared_data, path, value, message: str) -> None:
    obj = _train_manifest()
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert any(message in e for e in validate(obj, load_crds(shared_data / "k8s")))


def test_webhook_rules(shared_data) -> None:
    obj = _train_manifest()
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    obj["spec"]["pytorchReplicaSpecs"]["Chief"] = copy.deepcopy(obj["spec"]["pytorchReplicaSpecs"]["Worker"])
    errors = validate(obj, load_crds(shared_data / "k8s"))
    assert any("no container named 'pytorch'" in e for e in errors)
    assert any("'Chief' is not Master or Worker" in e for e in errors)


def test_pytorchjob_content() -> None:
    obj = _train_manifest(**{"launcher.kubernetes.hf_token_secret": "hf-token"})
    worker = obj["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    assert worker["replicas"] == 2 and obj["spec"]["nprocPerNode"] == "8"
    # torch's 60 s store / 600 s join timeouts raised for workers that start apart
    # (launcher.rendezvous_timeout_s)
    assert obj["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 2,
                                            "maxRestarts": 0,
                                            "rdzvConf": [{"key": "join_timeout", "value": "1800"},
                                                         {"key": "read_timeout", "value": "1800"}]}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN",
                               "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert env["NCCL_NET"]["value"] == "AWS Libfabric"
    assert env["NCCL_SOCKET_IFNAME"]["value"] == "^lo,docker,veth"  # the cluster file's pin
    # the flight recorder as AWS's reference sets it; no shared run dir in a pod: torch's default dump path
    assert {k: env[k]["value"] for k in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                                         "TORCH_NCCL_ASYNC_ERROR_HANDLING")} == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env
    assert obj["metadata"]["labels"][RUN_ID_LABEL] == worker["template"]["metadata"]["labels"][RUN_ID_LABEL]
    assert container["command"][:3] == ["python", "-m", "torch.distributed.run"]
    # The job's own deadline is the backstop for a dead harness: queue timeout (6 h) + run timeout (2 h).
    assert obj["spec"]["runPolicy"]["activeDeadlineSeconds"] == 6 * 3600 + 7200


def test_zero_efa_requests_no_adapters() -> None:
    cfg = cfg_for("efa_probe")
    spec = next(p.spec for p in expand(cfg) if p.spec.efa_per_node == 0 and p.spec.nodes == 2)
    obj = manifest(cfg, spec)
    worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 8}
    command = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert "NCCL_NET=Socket" in command and command[command.index("-np") + 1] == "16"


# ---------------------------------------------------------------- control flow against a fake API


def _pod(name: str, run_id: str, *, phase="Running", state=None, reason=None, conditions=None, restarts=0,
         last_state=None, node=None, started=True) -> V1Pod:
    """A pod as the API lists it; `started=False`: never scheduled, so no container has a status yet."""
    status = V1ContainerStatus(name="pytorch", image=IMAGE, image_id="", ready=phase == "Running",
                               restart_count=restarts, last_state=last_state,
                               state=state or V1ContainerState(running=V1ContainerStateRunning()))
    return V1Pod(metadata=V1ObjectMeta(name=name, labels={RUN_ID_LABEL: run_id}),
                 spec=V1PodSpec(containers=[V1Container(name="pytorch")], node_name=node),
                 status=V1PodStatus(phase=phase, reason=reason, conditions=conditions,
                                    container_statuses=[status] if started else None))


def _terminated(code: int, reason: str = "Completed") -> V1ContainerState:
    return V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=code, reason=reason))


def _waiting(reason: str, message: str | None = None) -> V1ContainerState:
    return V1ContainerState(waiting=V1ContainerStateWaiting(reason=reason, message=message))


def api_error(status: int, reason: str, message: str) -> ApiException:
    """An error answer as the client raises it: ApiException built from the HTTP response, whose body is the
    API server's Status object (kubernetes/client/exceptions.py: body = http_resp.data.decode())."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason.replace(" ", ""), "code": status}
    response = SimpleNamespace(status=status, reason=reason, data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json", "Audit-Id": "5f0c"})
    return ApiException(http_resp=response)


def _node(name: str, instance: str = "p5.48xlarge", ready: str = "True", cordoned: bool = False) -> V1Node:
    return V1Node(metadata=V1ObjectMeta(name=name, labels={"node.kubernetes.io/instance-type": instance,
                                                           "kubernetes.io/hostname": name}),
                  spec=V1NodeSpec(unschedulable=cordoned or None),
                  status=V1NodeStatus(conditions=[V1NodeCondition(type="Ready", status=ready)]))


UNSCHEDULABLE = V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                               message="0/4 nodes are available: 4 Insufficient vpc.amazonaws.com/efa.")


class FakeKube:
    """CustomObjectsApi + CoreV1Api + VersionApi, as far as the launcher uses them, answering as a real
    kube-apiserver (v1.36, with the Kubeflow operators' part played by hand) did:

    - errors are ApiExceptions built from the HTTP response, its body the server's Status object (api_error);
    - a created object gets a uid; deleting a missing one is 404; a Foreground deletion leaves the job with
      a deletionTimestamp and the foregroundDeletion finalizer until the garbage collector has removed its
      pods (one more GET here), or never where it does not (`collects`);
    - a pod that was never scheduled has no container statuses, and its log is HTTP 204, which the client
      returns as None; a container waiting to start answers its log with 400;
    - `nodes`: the Node objects the cluster lists (none: node groups scaled to zero, a wrong label; None:
      the user may not list them).
    """

    def __init__(self, scenario: str, shared_data: Path, finish_after: int = 2) -> None:
        self.scenario, self.shared_data, self.finish_after = scenario, shared_data, finish_after
        self.jobs: dict[str, dict] = {}
        self.created: list[str] = []
        self.deleted: list[tuple[str, str]] = []
        self.polls = 0
        self.dry_runs = 0
        self.missing_crds: set[str] = set()
        self.nodes: list[Any] = []
        self.version_error: ApiException | None = None

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, dry_run=None):
        errors = validate(body, load_crds(self.shared_data / "k8s"))
        if errors:
            raise api_error(422, "Unprocessable Entity", "; ".join(errors))
        self.dry_runs += dry_run == "All"
        body = copy.deepcopy(body)
        body["metadata"]["uid"] = f"uid-{len(self.created)}"
        if dry_run != "All":
            self.jobs[body["metadata"]["name"]] = body
            self.created.append(body["metadata"]["name"])
        return body

    def read_custom_resource_definition(self, name, _preload_content=True):
        """apiextensions.k8s.io/v1, raw (the launcher reads the JSON itself): the operators' real CRDs."""
        kind = {v: k for k, v in CRD_NAMES.items()}[name]
        if kind in self.missing_crds:
            raise api_error(404, "Not Found",
                            f'customresourcedefinitions.apiextensions.k8s.io "{name}" not found')
        crd = load_crds(self.shared_data / "k8s")[kind]  # parsed once per session: 1.5 s of YAML each
        return SimpleNamespace(data=json.dumps(crd).encode())

    def collects(self, name: str) -> bool:
        """Whether the garbage collector finishes a Foreground deletion of this job."""
        return True

    def _missing(self, plural: str, name: str) -> ApiException:
        return api_error(404, "Not Found", f'{plural}.kubeflow.org "{name}" not found')

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.jobs:
            raise self._missing(plural, name)
        self.polls += 1
        job = self.jobs[name]
        meta = job["metadata"]
        if meta.get("deletionTimestamp") and self.collects(name):
            if not meta.get("gc_pending"):
                del self.jobs[name]  # the garbage collector removed its pods, then the job
                raise self._missing(plural, name)
            meta["gc_pending"] = False  # its pods are going: it is still there this once
        job["status"] = {"conditions": [{"type": "Running", "status": "True"}, *self._verdict(job)]}
        return job

    def _verdict(self, job: dict) -> list[dict]:
        """The operator's terminal condition once the job has finished, in the training operator's words."""
        if self.polls <= self.finish_after:
            return []
        s, kind, name = self.scenario, job["kind"], job["metadata"]["name"]
        if s in ("ok", "nccl", "restarted", "no-records"):
            return [{"type": "Succeeded", "status": "True", "reason": f"{kind}Succeeded",
                     "message": f"{kind} {name} is successfully completed."}]
        if s in ("rendezvous", "oomkilled", "nodelost", "failed"):  # restartPolicy Never: a replica fails it
            return [{"type": "Failed", "status": "True", "reason": f"{kind}Failed",
                     "message": f"{kind} {name} is failed because 1 Worker replica(s) failed."}]
        if s == "deadline":
            return [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                     "message": "Job was active longer than specified deadline"}]
        if s == "deleted":  # someone else deleted it (kubectl delete: background propagation): gone
            del self.jobs[name]
            raise self._missing(job["kind"].lower() + "s", name)
        if s == "deleting" and "deletionTimestamp" not in job["metadata"]:  # someone else deleted it with
            job["metadata"]["deletionTimestamp"] = "2026-11-22T16:05:00Z"  # foreground propagation: its pods
            job["metadata"]["gc_pending"] = True  # go first
        return []

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None):
        self.deleted.append((name, body.propagation_policy))
        if name not in self.jobs:
            raise self._missing(plural, name)
        meta = self.jobs[name]["metadata"]
        meta.setdefault("deletionTimestamp", "2026-11-22T16:06:00Z")
        meta["finalizers"] = ["foregroundDeletion"]
        meta["gc_pending"] = True  # the first GET after this still finds it
        return {"kind": "Status", "status": "Success"}

    def list_node(self, label_selector=None, _request_timeout=None):
        if self.nodes is None:  # a user whose rights end at its namespace
            raise api_error(403, "Forbidden", 'nodes is forbidden: User "alice" cannot list resource "nodes" '
                                              'in API group "" at the cluster scope')
        key, _, value = (label_selector or "").partition("=")
        return V1NodeList(items=[n for n in self.nodes if not key or n.metadata.labels.get(key) == value])

    def list_namespaced_pod(self, namespace, label_selector):
        run_id = label_selector.split("=", 1)[1]
        if not self.jobs:
            return V1PodList(items=[])
        return V1PodList(items=self._pods(run_id, self.polls > self.finish_after))

    def _pods(self, run_id: str, finished: bool) -> list[V1Pod]:
        s = self.scenario
        if s == "imagepull":
            return [_pod("w-0", run_id, phase="Pending", state=_waiting("ImagePullBackOff",
                                                                       "Back-off pulling image"))]
        if s == "unschedulable":
            return [_pod("w-0", run_id, phase="Pending", conditions=[UNSCHEDULABLE], started=False)]
        if s == "one-unschedulable":  # w-0 placed and running, w-1 never scheduled (listed first)
            return [_pod("w-1", run_id, phase="Pending", conditions=[UNSCHEDULABLE], started=False),
                    _pod("w-0", run_id, node="ip-a")]
        if s == "evicted" and finished:
            return [_pod("w-0", run_id, phase="Failed", reason="Evicted", state=_terminated(137),
                         node="ip-c")]
        if s == "nodelost" and finished:  # ip-b stopped answering: the taint manager deletes its pod
            lost = V1PodCondition(type="DisruptionTarget", status="True", reason="DeletionByTaintManager",
                                  message="Taint manager: deleting due to NoExecute taint key "
                                          "node.kubernetes.io/unreachable")
            return [_pod("w-0", run_id, node="ip-a"), _pod("w-1", run_id, node="ip-b", conditions=[lost])]
        if s == "oomkilled" and finished:
            return [_pod("w-0", run_id, phase="Failed", state=_terminated(137, "OOMKilled"))]
        if finished and s == "restarted":  # w-1's worker ran twice: its first run ended with an error
            first = V1ContainerState(terminated=V1ContainerStateTerminated(
                exit_code=1, reason="Error", started_at="2026-11-22T16:00:00Z",
                finished_at="2026-11-22T16:03:00Z"))
            return [_pod("w-0", run_id, phase="Succeeded", state=_terminated(0), node="ip-a"),
                    _pod("w-1", run_id, phase="Succeeded", state=_terminated(0), node="ip-b", restarts=1,
                         last_state=first)]
        if finished and s in ("ok", "nccl", "no-records"):
            return [_pod(f"w-{i}", run_id, phase="Succeeded", state=_terminated(0)) for i in range(2)]
        if finished and s == "rendezvous":
            return [_pod("w-0", run_id, phase="Failed", state=_terminated(1, "Error"))]
        if finished and s == "failed":  # w-0 failed; w-1's container never started (still creating)
            return [_pod("w-0", run_id, phase="Failed", state=_terminated(1, "Error"), node="ip-a"),
                    _pod("w-1", run_id, phase="Pending", state=_waiting("ContainerCreating"), node="ip-b")]
        return [_pod("w-0", run_id)]

    def read_namespaced_pod_log(self, name, namespace, container):
        """The pod's log as the API answers: None (204) for a pod never scheduled, 400 for a container that
        waits to start, else its text."""
        pods = self._pods("", self.polls > self.finish_after)
        pod = next((p for p in pods if p.metadata.name == name), None)
        statuses = pod.status.container_statuses if pod else None
        if pod is not None and not statuses:
            return None
        if statuses and statuses[0].state.waiting:
            raise api_error(400, "Bad Request", f'container "{container}" in pod "{name}" is waiting to '
                                                f"start: {statuses[0].state.waiting.reason}")
        return self._log_text(name)

    def _log_text(self, name: str) -> str:
        stamp = "2026-11-22T16:00:00.000000000Z "
        if self.scenario == "ok" and name == "w-0":
            return "\n".join(stamp + format_record(kind, **payload) for kind, payload in [
                ("meta", {"rank": 0, "world_size": 16, "torch": "2.11.0",
                          "device_name": "NVIDIA H100 80GB HBM3"}),
                ("step", {"rank": 0, "step": 0, "time_s": 2.0, "loss": 10.4}),
                ("summary", {"rank": 0, "status": "ok", "tokens_per_s": 48000.0, "tflops_per_gpu": 420.0,
                             "mfu": 0.4245, "device_name": "NVIDIA H100 80GB HBM3"})]) + "\n"
        if self.scenario == "nccl" and name == "w-0":
            return (self.shared_data / "nccl-tests" / "sample_01.txt").read_text()
        if self.scenario == "one-unschedulable" and name == "w-0":
            return "Server listening on 0.0.0.0 port 22.\n"
        if self.scenario == "rendezvous":
            return ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: "
                    "rendezvous 'fsdpbench' timed out\n")
        return ""

    def get_code(self, _request_timeout=None):
        if self.version_error is not None:
            raise self.version_error
        return {"major": "1", "minor": "36", "gitVersion": "v1.36.0"}


def run_one(tmp_path: Path, shared_data: Path, scenario: str, sweep: str = "p5_scaling", *overrides: str):
    cfg = cfg_for(sweep, *overrides)
    fake = FakeKube(scenario, shared_data)
    launcher = KubernetesLauncher(cfg, custom=fake, core=fake, version=fake)
    plan = [p for p in expand(cfg) if p.feasible][:1]
    sweep_dir = tmp_path / cfg.sweep_name
    execute(run_options(cfg, placement_of(cfg)), plan, launcher, sweep_dir)
    frame = pd.read_csv(tmp_path / cfg.sweep_name / "results.csv")
    assert not fake.jobs, "the job was left behind"
    assert fake.deleted and all(p == "Foreground" for _, p in fake.deleted)
    return frame.iloc[0], fake


def test_success_records_come_from_pod_logs(tmp_path, shared_data) -> None:
    row, fake = run_one(tmp_path, shared_data, "ok")
    assert row.status == "ok" and row.tokens_per_s == 48000.0 and row.mfu == 0.4245
    assert row.device_name == "NVIDIA H100 80GB HBM3"
    logs = list((tmp_path / "p5_scaling" / "runs").glob("*/attempt-1/logs/w-0-pytorch.log"))
    assert logs and "@@fsdpbench@@" in logs[0].read_text()


def test_a_restarted_pod_is_on_the_record(tmp_path, shared_data) -> None:
    """A worker container that ran twice (a restart policy other than the harness's Never): the summary and
    the ledger carry its first run, on which node and why it ended."""
    from bench.core import rundir
    row, _ = run_one(tmp_path, shared_data, "restarted")
    assert row.restarts == 1
    d = next((tmp_path / "p5_scaling" / "runs").glob("*"))
    first, final = rundir.read_ledger(d)[-1]["executions"]
    assert first["state"] == "pod restart (Error)" and first["failed_nodes"] == {"ip-b": "w-1: Error"}
    assert first["start"].startswith("2026-11-22 16:00") and final["nodes"] == "ip-a,ip-b"


def test_mpijob_probe_parses_nccl_tests_from_the_launcher_log(tmp_path, shared_data) -> None:
    row, _ = run_one(tmp_path, shared_data, "nccl", "efa_probe", "nccl.efa_per_node=[1]", "axes.nodes=[2]",
                     "repeats=1")
    assert row.kind == "nccl" and row.status == "ok"
    assert row.nccl_busbw_avg_gbs == 1.15327 and row.nccl_transport == "AWS Libfabric"


@pytest.mark.parametrize("scenario,status,words", [
    ("oomkilled", "oom", "OOMKilled"),
    ("imagepull", "launch_error", "ImagePullBackOff"),
    ("unschedulable", "launch_error", "Insufficient vpc.amazonaws.com/efa"),  # after queue_timeout_s
    ("evicted", "failed", "on node ip-c evicted"),
    ("rendezvous", "rendezvous_error", "RendezvousTimeoutError"),
    ("deadline", "timeout", "deadline"),
])
def test_failure_classes(tmp_path, shared_data, scenario: str, status: str, words: str) -> None:
    row, _ = run_one(tmp_path, shared_data, scenario, "p5_scaling", "launcher.queue_timeout_s=0.3")
    assert row.status == status
    assert words in row.error


def test_harness_timeout_deletes_the_job(tmp_path, shared_data) -> None:
    from bench.core import rundir
    row, fake = run_one(tmp_path, shared_data, "running-forever", "p5_scaling", "launcher.timeout_s=0.2")
    assert row.status == "timeout" and len(fake.deleted) == 1
    assert row.error.startswith("no result within the run's time limit")
    assert "killed by the harness" in row.error
    [execution] = rundir.read_ledger(next((tmp_path / "p5_scaling" / "runs").glob("*")))[-1]["executions"]
    assert execution["state"] == "timed out by the harness" and execution["start"] <= execution["end"]


def test_a_pod_whose_node_is_lost_ends_the_run_naming_the_node(tmp_path, shared_data) -> None:
    """A node that stops answering: Kubernetes' taint manager deletes its pods (pod condition
    DisruptionTarget, DeletionByTaintManager). Our PyTorchJobs never restart a worker (restartPolicy Never,
    backoffLimit 0: a restarted worker would mix two executions in one record), so the training operator fails
    the job (PyTorchJobFailed, "... is failed because 1 Worker replica(s) failed.", its controller's words)
    and the run ends failed, the node named, its one execution on the record; `--rerun-failed` starts it
    again."""
    from bench.core import rundir
    row, fake = run_one(tmp_path, shared_data, "nodelost")
    assert row.status == "failed" and row.restarts == 0 and len(fake.deleted) == 1
    assert row.error.startswith("pod w-1 on node ip-b disrupted (DeletionByTaintManager)")
    [execution] = rundir.read_ledger(next((tmp_path / "p5_scaling" / "runs").glob("*")))[-1]["executions"]
    assert execution["state"] == "NodeLost" and list(execution["failed_nodes"]) == ["ip-b"]


def test_pending_pods_do_not_count_against_the_run_timeout(tmp_path, shared_data) -> None:
    """Unschedulable for longer than timeout_s but within queue_timeout_s, then it runs and succeeds."""
    class BusyCluster(FakeKube):
        def list_namespaced_pod(self, namespace, label_selector):
            if self.polls <= 30:
                if self.jobs:
                    busy = FakeKube("unschedulable", self.shared_data)
                    return busy.list_namespaced_pod(namespace, label_selector)
                return super().list_namespaced_pod(namespace, label_selector)
            return super().list_namespaced_pod(namespace, label_selector)
    cfg = cfg_for("p5_scaling", "launcher.timeout_s=0.2", "launcher.queue_timeout_s=60")
    fake = BusyCluster("ok", shared_data, finish_after=33)
    execute(run_options(cfg, placement_of(cfg)), [p for p in expand(cfg) if p.feasible][:1],
            KubernetesLauncher(cfg, custom=fake, core=fake, version=fake), tmp_path / "s")
    row = pd.read_csv(tmp_path / "s" / "results.csv").iloc[0]
    assert row.status == "ok" and row.queue_s > 0.2 and row.wall_s < row.queue_s


def test_cancellation_deletes_what_it_created(tmp_path, shared_data) -> None:
    cfg = cfg_for("p5_scaling")
    fake = FakeKube("running-forever", shared_data)
    launcher = KubernetesLauncher(cfg, custom=fake, core=fake, version=fake)
    spec = next(p.spec for p in expand(cfg) if p.feasible)
    stop = threading.Event()
    stop.set()
    with pytest.raises(StopIteration) as done:
        next(watch(cfg.launcher, launcher, launcher.submit(launcher.render(spec, tmp_path), tmp_path), stop))
    assert done.value.value.cancelled and fake.jobs, "watching never deletes: cleanup does"
    name = next(iter(fake.jobs))
    handle = launcher.attach({"name": name, "kind": "PyTorchJob"}, tmp_path / "attempt-1")
    launcher.cleanup(handle)
    assert fake.jobs[name]["metadata"]["deletionTimestamp"], "a Foreground deletion: its pods go first"
    while launcher.remains(handle) is not None:
        pass
    assert not fake.jobs and fake.deleted[0][0] == name


class BrokenWhileRunning(FakeKube):
    """The API server fails with a 500 once the job runs (not a 404): the run fails, the job is deleted."""

    def list_namespaced_pod(self, namespace, label_selector):
        if self.polls > 1:
            raise ApiException(status=500, reason="Internal Server Error")
        return super().list_namespaced_pod(namespace, label_selector)


def test_an_api_error_fails_the_run_deletes_the_job_and_the_sweep_goes_on(tmp_path, shared_data) -> None:
    cfg = cfg_for("p5_scaling")
    fake = BrokenWhileRunning("running-forever", shared_data)
    launcher = KubernetesLauncher(cfg, custom=fake, core=fake, version=fake)
    plan = [p for p in expand(cfg) if p.feasible][:2]
    sweep_dir = tmp_path / cfg.sweep_name
    execute(run_options(cfg, placement_of(cfg)), plan, launcher, sweep_dir)
    frame = pd.read_csv(tmp_path / cfg.sweep_name / "results.csv")
    # both runs were tried: the first did not abort the sweep
    assert list(frame.status) == ["failed", "failed"]
    assert all("Internal Server Error" in e and "launcher kubernetes" in e for e in frame.error)
    assert len(fake.deleted) == 2 and not fake.jobs


def test_a_job_left_by_a_dead_sweep_is_reattached_not_created_again(tmp_path, shared_data) -> None:
    cfg = cfg_for("p5_scaling")
    fake = FakeKube("ok", shared_data, finish_after=10**9)  # runs until told otherwise
    launcher = KubernetesLauncher(cfg, custom=fake, core=fake, version=fake)
    plan = [p for p in expand(cfg) if p.feasible][:1]
    sweep_dir = tmp_path / cfg.sweep_name
    stop = threading.Event()
    from bench.run.progress import Progress
    from bench.run.runner import _run, _Sweep
    options = run_options(cfg, placement_of(cfg))
    steps = _run(_Sweep(options, launcher, sweep_dir, stop, Progress(1, False), plan), plan[0])
    next(steps)  # submitted and watched once; then the sweep "dies": its generator is simply dropped
    created = list(fake.jobs)
    assert len(created) == 1
    fake.finish_after = 0  # the job finishes while no sweep watches it
    execute(run_options(cfg, placement_of(cfg)), plan, launcher, sweep_dir)
    row = pd.read_csv(sweep_dir / "results.csv").iloc[0]
    assert row.status == "ok" and row.attempt == 1 and row.tokens_per_s == 48000.0
    assert [name for name, _ in fake.deleted] == created and not fake.jobs
    ledger = json.loads(next(sweep_dir.glob("runs/*/ledger.json")).read_text())["attempts"]
    assert len(ledger) == 1 and ledger[0]["job"]["name"] == created[0] and "reattached_at" in ledger[0]


def test_each_attempt_has_its_own_job_name(tmp_path, shared_data) -> None:
    cfg = cfg_for("p5_scaling")
    fake = FakeKube("ok", shared_data)
    launcher = KubernetesLauncher(cfg, custom=fake, core=fake, version=fake)
    spec = next(p.spec for p in expand(cfg) if p.feasible)
    sub = launcher.render(spec, tmp_path)
    first = launcher.submit(sub, tmp_path)
    time.sleep(0.15)
    second = launcher.submit(sub, tmp_path)
    assert first.name != second.name and first.name.startswith(f"fsdpbench-train-{spec.run_id}-")


def test_missing_kubeconfig_is_one_clear_error(tmp_path, monkeypatch, capsys) -> None:
    from bench.sweep import main
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["+sweep=p5_scaling", "launcher=kubernetes", f"launcher.kubernetes.image={IMAGE}",
                 f"results_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no Kubernetes configuration") and err.count("\n") == 1
    assert f"no kubeconfig at {tmp_path / 'nope'} ($KUBECONFIG)" in err, err  # the path tried


def test_unreachable_cluster_is_one_clear_error(tmp_path, monkeypatch) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "x"}}]}))
    cfg = cfg_for("p5_scaling", f"launcher.kubernetes.kubeconfig={kubeconfig}")
    with pytest.raises(ConfigError) as refused:
        KubernetesLauncher(cfg).preflight()
    # the cause, which urllib3 puts at the end of a line longer than any shown, is the message
    assert str(refused.value) == ("the Kubernetes API at https://127.0.0.1:1 is not reachable: "
                                  "Connection refused")


def test_missing_image_is_a_config_error() -> None:
    raw, _ = compose(["+sweep=p5_scaling", "launcher=kubernetes"])
    with pytest.raises(ConfigError, match="launcher.kubernetes.image"):
        KubernetesLauncher(from_dict(raw, launcher_sections())).preflight()



def test_mpijob_workers_run_sshd_and_the_launcher_waits_for_them() -> None:
    """The MPI operator's contract: workers serve ssh (the image sets sshd up), the launcher is created once
    every worker is Ready (sshd listening), finished workers are removed, PATH/LD_LIBRARY_PATH reach the
    ranks started over ssh."""
    cfg = cfg_for("efa_probe")
    spec = next(p.spec for p in expand(cfg) if p.spec.nodes == 2 and p.spec.efa_per_node == 32)
    obj = manifest(cfg, spec)
    worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["/usr/sbin/sshd", "-De"]
    assert worker["readinessProbe"]["tcpSocket"]["port"] == 22
    assert obj["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert obj["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    command = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    passed = [command[i + 1] for i, a in enumerate(command) if a == "-x"]
    assert passed[:2] == ["PATH", "LD_LIBRARY_PATH"] and "FI_PROVIDER=efa" in passed
    assert worker["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32


def test_preflight_reads_the_crds_the_cluster_serves(shared_data) -> None:
    """Manifests are validated against the CRDs read through apiextensions.k8s.io/v1, not local files: a
    cluster without the MPI operator, or one whose MPIJob CRD serves another version, is refused at render
    (before anything is created), naming what to install."""
    cfg = cfg_for("efa_probe")
    fake = FakeKube("ok", shared_data)
    launcher = KubernetesLauncher(cfg, custom=fake, core=fake, version=fake, extensions=fake)
    launcher.preflight()
    assert sorted(launcher.crds) == ["MPIJob", "PyTorchJob"]
    assert launcher.crds["MPIJob"]["spec"]["versions"][0]["name"] == "v2beta1"
    spec = next(p.spec for p in expand(cfg) if p.spec.nodes == 2)
    launcher.render(spec, Path("/r"))  # valid against the served schema

    fake.missing_crds = {"MPIJob"}
    launcher.preflight()
    with pytest.raises(ConfigError,
                       match=r"no MPIJob CRD \(mpijobs.kubeflow.org\): install the MPI operator"):
        launcher.render(spec, Path("/r"))

    fake.missing_crds = set()
    launcher.preflight()
    launcher.crds["MPIJob"] = copy.deepcopy(launcher.crds["MPIJob"])
    launcher.crds["MPIJob"]["spec"]["versions"][0]["name"] = "v1"  # an old operator
    with pytest.raises(ConfigError, match="serves no version 'v2beta1'"):
        launcher.render(spec, Path("/r"))


def test_a_manifest_the_server_refuses_is_one_line_before_anything_is_created(tmp_path, shared_data,
                                                                               monkeypatch, capsys) -> None:
    """Server-side dry run of every run before the first create: an admission webhook's refusal (here a
    policy that forbids the namespace) stops the sweep with the server's message; nothing was created."""
    from bench.sweep import main, render_all

    class Refusing(FakeKube):
        def create_namespaced_custom_object(self, group, version, namespace, plural, body, dry_run=None):
            if dry_run == "All" and plural == "pytorchjobs":
                raise ApiException(status=403, reason="Forbidden")
            return super().create_namespaced_custom_object(group, version, namespace, plural, body, dry_run)

    fake = Refusing("ok", shared_data)
    fake.nodes = [_node("ip-a")]

    def connect(self) -> None:
        self._custom = self._core = self._version = self._ext = fake
    monkeypatch.setattr(KubernetesLauncher, "_connect", connect)
    argv = ["+sweep=p5_scaling", "launcher=kubernetes", f"launcher.kubernetes.image={IMAGE}",
            f"results_root={tmp_path}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "server-side dry run): 403 Forbidden" in err, err
    assert not fake.jobs and not (tmp_path / "p5_scaling").exists()

    fake = FakeKube("ok", shared_data)  # accepted: every run was judged by the server, none created
    cfg = cfg_for("p5_scaling")
    plan = expand(cfg)
    launcher = KubernetesLauncher(cfg)
    launcher.preflight()
    render_all(launcher, plan, tmp_path, admit=True)
    # every run, the analytic estimate's infeasible ones too: measured before launch, they may fit
    assert fake.dry_runs == len(plan) > sum(p.feasible for p in plan) > 0 and not fake.jobs


def test_torchrun_reads_the_rendezvous_timeouts_the_operator_passes(monkeypatch, tmp_path: Path) -> None:
    """The training operator turns elasticPolicy.rdzvConf into PET_RDZV_CONF ("k=v,k=v"); torchrun's own
    argument parsing, run on the manifest's command, must see the raised timeouts (its defaults: 60 s to
    reach the store on worker-0, 600 s for every node to join)."""
    from torch.distributed.run import config_from_args, parse_args
    obj = _train_manifest()
    conf = obj["spec"]["elasticPolicy"]["rdzvConf"]
    monkeypatch.setenv("PET_RDZV_CONF", ",".join(f"{c['key']}={c['value']}" for c in conf))
    command = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    # the arguments after `python -m torch.distributed.run`
    args = parse_args([f"--log-dir={tmp_path}", *command[3:], "--rdzv-endpoint=worker-0:29400"])  # not /tmp
    rdzv = config_from_args(args)[0].rdzv_configs
    assert rdzv["join_timeout"] == "1800" and rdzv["read_timeout"] == "1800"


# ---------------------------------------------------------------- as a real API server answers (issue 78)


def _one_probe(sweep: str) -> list[str]:
    """One 2-node all-reduce probe of efa_probe; nothing for a training sweep."""
    return ["nccl.efa_per_node=[1]", "axes.nodes=[2]", "repeats=1"] if sweep == "efa_probe" else []


def _extra(tmp_path: Path, sweep: str = "p5_scaling") -> dict[str, Any]:
    """The extra of the sweep's one run summary."""
    from bench.core import rundir
    [summary] = rundir.read_summaries(tmp_path / sweep)
    return summary.extra


def _line(capfd, start: str) -> str:
    """The progress line of the run that ended `start` (it goes to the stdout the sweep was started with),
    without the sweep's status after it."""
    return next(ln for ln in capfd.readouterr().out.splitlines() if ln.startswith(start)).split("  | ")[0]


@pytest.mark.parametrize("sweep", ["p5_scaling", "efa_probe"])
def test_a_pod_that_never_ran_is_judged_by_its_state_and_every_other_log_is_kept(tmp_path, shared_data, sweep,
                                                                                   capfd) -> None:
    """A pod the scheduler never placed has no log: the API answers 204 and the client returns None. The
    run is the scheduler's launch_error past the queue timeout, its reason and queue time kept, and the log
    of the pod that did run is saved beside the empty one."""
    row, _ = run_one(tmp_path, shared_data, "one-unschedulable", sweep, "launcher.queue_timeout_s=0.3",
                     *_one_probe(sweep))
    assert row.status == "launch_error", row.error
    assert row.error == ("gave up after 0 s in the queue (launcher.queue_timeout_s): pod w-1 unschedulable: "
                         "0/4 nodes are available: 4 Insufficient vpc.amazonaws.com/efa.")
    assert row.queue_s >= 0.3 and pd.isna(row.wall_s)
    logs = next((tmp_path / sweep / "runs").glob("*/attempt-1/logs"))
    assert (logs / "w-0-pytorch.log").read_text() == "Server listening on 0.0.0.0 port 22.\n"
    assert (logs / "w-1-pytorch.log").read_text() == ""
    line = _line(capfd, "[1/1] launch_error")
    assert " (never ran, 0." in line and "s in the queue): gave up after" in line, line  # not (0.0s)
    assert line.endswith("Insufficient vpc.amazonaws.com/efa."), line  # sshd's banner is no error


@pytest.mark.parametrize("sweep,kind", [("p5_scaling", "PyTorchJob"), ("efa_probe", "MPIJob")])
def test_the_operators_verdict_is_the_runs_error(tmp_path, shared_data, sweep: str, kind: str, capfd) -> None:
    """The operator fails the job (its reason and message), w-0 failed with an empty log and w-1's container
    never started, so the API answers its log with 400 and a Status body: the run's error is the operator's
    words, the log's error one line in its file, no raw JSON anywhere."""
    row, fake = run_one(tmp_path, shared_data, "failed", sweep, *_one_probe(sweep))
    name = fake.created[0]
    verdict = f"{kind}Failed: {kind} {name} is failed because 1 Worker replica(s) failed."
    assert row.status == "failed" and row.error == verdict
    message = verdict.split(": ", 1)[1]
    assert _extra(tmp_path, sweep)["job_end"] == {"type": "Failed", "reason": f"{kind}Failed",
                                                  "message": message, "ended_by": "operator"}
    assert _line(capfd, "[1/1] failed").endswith(f": {verdict}")
    unread = next((tmp_path / sweep / "runs").glob("*/attempt-1/logs/w-1-pytorch.log")).read_text()
    assert unread == ('fsdpbench: could not read the log of w-1/pytorch: 400 Bad Request: container '
                      '"pytorch" in pod "w-1" is waiting to start: ContainerCreating\n')


def test_a_job_its_deadline_ended_is_a_timeout_that_says_who_ended_it(tmp_path, shared_data) -> None:
    row, _ = run_one(tmp_path, shared_data, "deadline")
    message = "Job was active longer than specified deadline"
    assert row.status == "timeout" and row.error == f"DeadlineExceeded: {message}"
    assert _extra(tmp_path)["job_end"] == {"type": "Failed", "reason": "DeadlineExceeded", "message": message,
                                           "ended_by": "deadline"}


@pytest.mark.parametrize("scenario", ["deleted", "deleting"])
def test_a_job_deleted_outside_the_sweep_is_cancelled_saying_so(tmp_path, shared_data, scenario,
                                                                 capfd) -> None:
    """Someone deletes the job while it runs: gone at once (kubectl's background propagation: 404), or
    going (foreground: a deletionTimestamp while its pods go). The run is cancelled, which a rerun starts
    again, with who ended it kept."""
    row, _ = run_one(tmp_path, shared_data, scenario, "p5_scaling", "launcher.timeout_s=3")
    assert row.status == "cancelled" and row.error == "the job was deleted outside the sweep"
    assert _extra(tmp_path)["job_end"] == {"ended_by": "deleted outside the sweep"}
    assert _line(capfd, "[1/1] cancelled").endswith(": the job was deleted outside the sweep")


@pytest.mark.parametrize("sweep", ["p5_scaling", "efa_probe"])
def test_a_job_that_succeeded_without_records_says_so(tmp_path, shared_data, sweep: str) -> None:
    """The operator marks the job Succeeded, its pods' logs are empty: no figure can come from it."""
    row, _ = run_one(tmp_path, shared_data, "no-records", sweep, *_one_probe(sweep))
    assert row.status == "failed"
    assert row.error == ("the job succeeded but its pods left no records (logs: 2 in attempt-1/logs, all "
                         "empty)")
    assert _extra(tmp_path, sweep)["job_end"]["type"] == "Succeeded"


def test_a_run_that_never_ran_shows_its_time_in_the_queue(tmp_path, shared_data, capfd) -> None:
    """An image that cannot be pulled ends the run after grace_s without any container having started: its
    time was all queue, and its line says so instead of a run time of 0.0 s."""
    row, _ = run_one(tmp_path, shared_data, "imagepull")
    assert row.status == "launch_error" and pd.isna(row.wall_s) and row.queue_s >= 0.05
    line = _line(capfd, "[1/1] launch_error")
    assert "(0.0s)" not in line and line.endswith(
        f"(never ran, {row.queue_s:.1f}s in the queue): pod w-0: ImagePullBackOff: Back-off pulling image")


class StuckDeletion(FakeKube):
    """Two runs in flight. The first finishes at once, and its Foreground deletion never completes (no
    garbage collector: its pods stay); the second runs for RUN_S, and each GET of it is timed."""

    RUN_S = 2.0

    def __init__(self, shared_data: Path) -> None:
        super().__init__("ok", shared_data)
        self.gets: dict[str, list[float]] = {}

    def collects(self, name: str) -> bool:
        return name != self.created[0]

    def _verdict(self, job: dict) -> list[dict]:
        name = job["metadata"]["name"]
        self.gets.setdefault(name, []).append(time.monotonic())
        return super()._verdict(job) if self._finished(job) else []

    def _finished(self, job: dict) -> bool:
        gets = self.gets.get(job["metadata"]["name"], [])
        first = job["metadata"]["name"] == self.created[0]
        return len(gets) > 2 if first else bool(gets) and gets[-1] - gets[0] > self.RUN_S

    def list_namespaced_pod(self, namespace, label_selector):
        run_id = label_selector.split("=", 1)[1]
        job = next((j for j in self.jobs.values() if j["metadata"]["labels"][RUN_ID_LABEL] == run_id), None)
        return V1PodList(items=self._pods(run_id, self._finished(job)) if job else [])


def test_a_deletion_that_does_not_finish_holds_up_no_other_run(tmp_path, shared_data, monkeypatch,
                                                                capfd) -> None:
    """The first run's job is still there after its deletion's wait: meanwhile the second run is watched as
    often as ever (no poll of it waits on the deletion), and the first run's line, summary and ledger say the
    job is still there with the command that removes it."""
    from bench.core import rundir
    from bench.launchers import kubernetes
    monkeypatch.setattr(kubernetes, "DELETE_WAIT_S", 1.0)
    cfg = cfg_for("p5_scaling")
    fake = StuckDeletion(shared_data)
    plan = [p for p in expand(cfg) if p.feasible][:2]
    execute(run_options(cfg, placement_of(cfg)), plan, KubernetesLauncher(cfg, custom=fake, core=fake),
            tmp_path / "s")
    stuck, running = fake.created
    gaps = [b - a for a, b in zip(fake.gets[running], fake.gets[running][1:])]
    assert max(gaps) < kubernetes.DELETE_WAIT_S / 2, max(gaps)
    assert list(fake.jobs) == [stuck]  # left behind, and said so
    run_id = fake.jobs[stuck]["metadata"]["labels"][RUN_ID_LABEL]
    command = (f"kubectl delete pods -n default -l fsdpbench.io/run-id={run_id} --force --grace-period=0")
    summary = next(s for s in rundir.read_summaries(tmp_path / "s") if s.run_id == run_id)
    left = summary.extra["left_behind"]
    assert left.startswith(f"job {stuck} is still there 1 s after its deletion, waiting for 2 pod(s) to go")
    assert left.endswith(f"; remove it with: {command}")
    assert rundir.read_ledger(Path(summary.run_dir))[-1]["left_behind"] == left
    assert any(ln.split("  | ")[0].endswith(left) for ln in capfd.readouterr().out.splitlines())


def _use(monkeypatch, fake: FakeKube) -> None:
    """The sweep's own launcher, connected to the fake instead of a kubeconfig's cluster."""
    def connect(self) -> None:
        self._custom = self._core = self._version = self._ext = fake
    monkeypatch.setattr(KubernetesLauncher, "_connect", connect)


def _refused_sweep(tmp_path, shared_data, monkeypatch, capsys, nodes) -> tuple[FakeKube, str]:
    """p5_scaling on Kubernetes where the API lists `nodes` (None: listing them is forbidden): the sweep
    must exit 2; the API and what it printed."""
    from bench.sweep import main
    fake = FakeKube("ok", shared_data)
    fake.nodes = nodes
    _use(monkeypatch, fake)
    assert main(["+sweep=p5_scaling", "launcher=kubernetes", f"launcher.kubernetes.image={IMAGE}",
                 f"results_root={tmp_path}"]) == 2
    return fake, capsys.readouterr().err


@pytest.mark.parametrize("nodes,seen", [
    ([], "the cluster lists none"),  # node groups scaled to zero
    ([_node("ip-a", "p4d.24xlarge"), _node("ip-b", cordoned=True)], "1 not Ready: ip-b (cordoned)"),
])
def test_a_cluster_without_a_ready_node_is_one_line_before_anything_is_written(tmp_path, shared_data,
                                                                               monkeypatch, capsys, nodes,
                                                                               seen) -> None:
    fake, err = _refused_sweep(tmp_path, shared_data, monkeypatch, capsys, nodes)
    assert err.count("\n") == 1 and err.startswith(
        f"error: preflight: no Ready node matches node.kubernetes.io/instance-type=p5.48xlarge ({seen}); "
        "check cluster.instance_type and launcher.kubernetes.instance_type_label"), err
    assert "scale the node group up" in err and not (tmp_path / "p5_scaling").exists() and not fake.created


def test_nodes_the_user_may_not_list_are_one_line_naming_the_permission(tmp_path, shared_data, monkeypatch,
                                                                        capsys) -> None:
    _, err = _refused_sweep(tmp_path, shared_data, monkeypatch, capsys, None)
    assert err == ("error: preflight: cannot list the nodes (node.kubernetes.io/instance-type=p5.48xlarge): "
                   "403 Forbidden: permission denied by the cluster's RBAC: nodes is forbidden: User "
                   "\"alice\" cannot list resource \"nodes\" in API group \"\" at the cluster scope; name "
                   "them with preflight.nodes=[...], or preflight.mode=off\n")
    assert not (tmp_path / "p5_scaling").exists()


def test_a_refused_node_is_answered_with_the_kubernetes_setting(tmp_path, shared_data, monkeypatch,
                                                                capsys) -> None:
    """Two Ready nodes whose preflight jobs never answer: the study is refused naming the setting that keeps
    its pods off them; the preflight's jobs say what they are and are gone."""
    from bench.sweep import main
    fake = FakeKube("running-forever", shared_data)
    fake.nodes = [_node("ip-a"), _node("ip-b"), _node("ip-c", "p4d.24xlarge")]
    _use(monkeypatch, fake)
    assert main(["+sweep=p5_scaling", "launcher=kubernetes", f"launcher.kubernetes.image={IMAGE}",
                 f"results_root={tmp_path}", "preflight.timeout_s=0.1", "memory.measure=false"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "leave the node out (launcher.kubernetes.exclude_nodes=[ip-a,ip-b])" in err
    assert "slurm" not in err
    assert len(fake.created) == 2 and all(n.startswith("fsdpbench-preflight-node-") for n in fake.created)
    assert not fake.jobs


def test_excluded_nodes_keep_every_pod_off_them(shared_data) -> None:
    """launcher.kubernetes.exclude_nodes: a required node affinity on every pod (a probe's launcher too) by
    node name, valid against the CRDs; the preflight checks the other nodes; a bad name is one line."""
    from bench import preflight
    crds = load_crds(shared_data / "k8s")
    cfg = cfg_for("efa_probe", "launcher.kubernetes.exclude_nodes=[ip-b,ip-d]")
    nodes = preflight.nodes_of(cfg, placement_of(cfg))
    off = {"key": "metadata.name", "operator": "NotIn", "values": ["ip-b", "ip-d"]}
    probe = manifest(cfg, next(p.spec for p in expand(cfg) if p.spec.kind == "nccl"))
    pair = manifest(cfg, preflight.pair_spec(nodes, ("ip-a", "ip-c")))
    train = manifest(cfg_for("p5_scaling", "launcher.kubernetes.exclude_nodes=[ip-b,ip-d]"),
                     next(p.spec for p in expand(cfg_for("p5_scaling")) if p.spec.kind == "train"))
    for job in (probe, pair, train):
        replicas = job["spec"].get("mpiReplicaSpecs") or job["spec"]["pytorchReplicaSpecs"]
        for replica in replicas.values():
            [term] = replica["template"]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            assert term["matchFields"] == [off]
        assert validate(job, crds) == []
    [pair_term] = pair["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert pair_term["matchExpressions"][0]["values"] == ["ip-a", "ip-c"]  # on its pair, and off the others
    assert pair["metadata"]["name"].startswith("fsdpbench-preflight-pair-")
    fake = FakeKube("ok", shared_data)
    fake.nodes = [_node(n) for n in ("ip-a", "ip-b", "ip-c", "ip-d")]
    assert KubernetesLauncher(cfg, custom=fake, core=fake).node_names() == (["ip-a", "ip-c"], {})
    with pytest.raises(ConfigError, match="launcher.kubernetes.exclude_nodes='IP_B' is not a node name"):
        cfg_for("efa_probe", "launcher.kubernetes.exclude_nodes=[IP_B]")


FORBIDDEN = ('pytorchjobs.kubeflow.org is forbidden: User "alice" cannot create resource "pytorchjobs" in '
             'API group "kubeflow.org" in the namespace "default"')


@pytest.mark.parametrize("status,reason,message,says", [
    (401, "Unauthorized", "Unauthorized",
     "401 Unauthorized: the API server refused the credentials (the kubeconfig's token or client certificate "
     "is wrong or has expired)"),
    (403, "Forbidden", 'users "alice" is forbidden: User "alice" cannot get path "/version"',
     "403 Forbidden: permission denied by the cluster's RBAC: users \"alice\" is forbidden"),
])
def test_credentials_and_permissions_are_named_at_preflight(shared_data, status, reason, message,
                                                             says) -> None:
    fake = FakeKube("ok", shared_data)
    fake.version_error = api_error(status, reason, message)
    with pytest.raises(ConfigError) as refused:
        KubernetesLauncher(cfg_for("p5_scaling"), custom=fake, core=fake, version=fake).preflight()
    assert str(refused.value).startswith(f"Kubernetes API: {says}"), str(refused.value)
    assert "{" not in str(refused.value)


def test_a_create_the_cluster_forbids_is_the_runs_one_line_error(tmp_path, shared_data) -> None:
    class Forbidding(FakeKube):
        def create_namespaced_custom_object(self, group, version, namespace, plural, body, dry_run=None):
            raise api_error(403, "Forbidden", FORBIDDEN)

    cfg = cfg_for("p5_scaling")
    fake = Forbidding("ok", shared_data)
    execute(run_options(cfg, placement_of(cfg)), [p for p in expand(cfg) if p.feasible][:1],
            KubernetesLauncher(cfg, custom=fake, core=fake), tmp_path / "s")
    row = pd.read_csv(tmp_path / "s" / "results.csv").iloc[0]
    assert row.status == "launch_error"
    assert row.error == f"ApiError: 403 Forbidden: permission denied by the cluster's RBAC: {FORBIDDEN}"


class RefusedWhileRunning(FakeKube):
    """The API server goes away once the job runs: the client raises urllib3's MaxRetryError, as it does for
    a refused connection (a NewConnectionError caused by ConnectionRefusedError)."""

    def list_namespaced_pod(self, namespace, label_selector):
        if self.polls > 1:
            from urllib3 import HTTPSConnectionPool
            from urllib3.exceptions import MaxRetryError, NewConnectionError
            pool = HTTPSConnectionPool("A1B2C3D4E5F6.gr7.us-west-2.eks.amazonaws.com", 443)
            try:
                try:
                    raise ConnectionRefusedError(111, "Connection refused")
                except ConnectionRefusedError as refused:
                    raise NewConnectionError(pool, f"{pool}: Failed to establish a new connection: {refused}"
                                             ) from refused
            except NewConnectionError as e:
                raise MaxRetryError(pool, f"/api/v1/namespaces/{namespace}/pods", e) from e
        return super().list_namespaced_pod(namespace, label_selector)


def test_a_refused_connection_keeps_its_cause_in_the_runs_line(tmp_path, shared_data, capfd) -> None:
    cfg = cfg_for("p5_scaling")
    fake = RefusedWhileRunning("running-forever", shared_data)
    execute(run_options(cfg, placement_of(cfg)), [p for p in expand(cfg) if p.feasible][:1],
            KubernetesLauncher(cfg, custom=fake, core=fake), tmp_path / "s")
    assert _line(capfd, "[1/1] failed").endswith(
        ": launcher kubernetes: ApiError: the Kubernetes API is not reachable: Connection refused")


# GET /version as kube-apiserver v1.36 answers it (the client's VersionInfo requires every field)
VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.0", "gitCommit": "0" * 40,
           "gitTreeState": "clean", "buildDate": "2026-08-26T00:00:00Z", "goVersion": "go1.25.0",
           "compiler": "gc", "platform": "linux/amd64"}


def _tls_server(tmp_path: Path, version_status: int):
    """An HTTPS stand-in for the API server, its certificate self-signed (kubeconfig: insecure-skip-tls-
    verify): /version answers `version_status`, the CRDs are not installed (404), one Ready p5 node."""
    import http.server
    import shutil
    import ssl
    import subprocess
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate for the stand-in server")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    node = {"metadata": {"name": "ip-a"}, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    answers = {"/version": (version_status, {"kind": "Status", "message": "Unauthorized", "code": 401}
                            if version_status == 401 else VERSION),
               "/api/v1/nodes": (200, {"kind": "NodeList", "apiVersion": "v1", "items": [node]})}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, body = answers.get(self.path.split("?")[0].rstrip("/"),
                                       (404, {"kind": "Status", "message": "not found", "code": 404}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"https://127.0.0.1:{server.server_port}",
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "wrong"}}]}))
    return server, kubeconfig


def test_unverified_tls_is_said_once_not_per_request(tmp_path) -> None:
    """A sweep's process with a real client against an HTTPS server whose certificate it does not check:
    urllib3 warns of each of its five requests (the version, two CRDs, the nodes twice) in two lines; the
    launcher says it once, in one."""
    import subprocess
    import sys
    server, kubeconfig = _tls_server(tmp_path, 200)
    code = ("import sys; from bench.launchers.kubernetes import KubernetesLauncher; "
            "from bench.launchers.test_kubernetes import cfg_for; "
            "launcher = KubernetesLauncher(cfg_for('p5_scaling', "
            "'launcher.kubernetes.kubeconfig=' + sys.argv[1])); "
            "launcher.preflight(); print(launcher.node_names(), launcher.node_names(), launcher.server)")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(kubeconfig)], capture_output=True, text=True,
                              timeout=300)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("(['ip-a'], {}) (['ip-a'], {}) https://127.0.0.1:")
    server_url = proc.stdout.split()[-1]
    assert proc.stderr == (f"warning: TLS verification is off for the Kubernetes API at {server_url} "
                           "(insecure-skip-tls-verify in the kubeconfig): the server's identity is not "
                           "checked\n")


def test_a_wrong_token_is_named_as_the_credentials_by_a_real_client(tmp_path) -> None:
    server, kubeconfig = _tls_server(tmp_path, 401)
    try:
        with pytest.raises(ConfigError) as refused:
            cfg = cfg_for("p5_scaling", f"launcher.kubernetes.kubeconfig={kubeconfig}")
            KubernetesLauncher(cfg).preflight()
    finally:
        server.shutdown()
    assert str(refused.value).endswith(": 401 Unauthorized: the API server refused the credentials (the "
                                       "kubeconfig's token or client certificate is wrong or has expired)")
