"""Kubernetes launcher: manifests against the real CRD schemas, control flow against a fake API client.

No API server runs here, so the boundary is faked: the fake stores what the real client would send,
validates each created object with the CRD schema (as the API server would) and returns real
kubernetes.client model objects for pods. Pod logs carry real worker records and real nccl-tests output.
"""
from __future__ import annotations

import copy
import json
import re
import threading
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
from bench.launchers import placement_of
from bench.launchers.k8s_manifests import RUN_ID_LABEL, manifest
from bench.launchers.k8s_schema import CRD_NAMES, load_crds, validate
from bench.launchers.kubernetes import KubernetesLauncher
from bench.run.runner import execute
from bench.run.watch import watch
from bench.study.plan import expand
from bench.sweep import compose, study_from

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdpbench:1.0"


def cfg_for(sweep: str, *overrides: str):
    raw, _ = compose([f"+sweep={sweep}", "launcher=kubernetes", f"cluster.kubernetes.image={IMAGE}",
                      "launcher.poll_s=0.01", "launcher.grace_s=0.05", *overrides])
    return from_dict(raw)


@pytest.mark.parametrize("sweep", ["p5_scaling", "p4de_scaling", "ablation", "efa_probe", "p5_options"])
def test_every_manifest_the_sweeps_produce_validates(shared_data, sweep: str) -> None:
    cfg = cfg_for(sweep, "cluster.kubernetes.hf_token_secret=hf-token",
                  "cluster.kubernetes.image_pull_secret=ecr", "cluster.kubernetes.service_account=trainer")
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
    obj = _train_manifest(**{"cluster.kubernetes.hf_token_secret": "hf-token"})
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
         last_state=None, node=None) -> V1Pod:
    status = V1ContainerStatus(name="pytorch", image=IMAGE, image_id="", ready=phase == "Running",
                               restart_count=restarts, last_state=last_state,
                               state=state or V1ContainerState(running=V1ContainerStateRunning()))
    return V1Pod(metadata=V1ObjectMeta(name=name, labels={RUN_ID_LABEL: run_id}),
                 spec=V1PodSpec(containers=[V1Container(name="pytorch")], node_name=node),
                 status=V1PodStatus(phase=phase, reason=reason, container_statuses=[status],
                                    conditions=conditions))


def _terminated(code: int, reason: str = "Completed") -> V1ContainerState:
    return V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=code, reason=reason))


class FakeKube:
    """CustomObjectsApi + CoreV1Api + VersionApi, as far as the launcher uses them."""

    def __init__(self, scenario: str, shared_data: Path, finish_after: int = 2) -> None:
        self.scenario, self.shared_data, self.finish_after = scenario, shared_data, finish_after
        self.jobs: dict[str, dict] = {}
        self.deleted: list[tuple[str, str]] = []
        self.polls = 0
        self.dry_runs = 0
        self.missing_crds: set[str] = set()

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, dry_run=None):
        errors = validate(body, load_crds(self.shared_data / "k8s"))
        if errors:
            raise ApiException(status=422, reason="; ".join(errors))
        self.dry_runs += dry_run == "All"
        if dry_run != "All":
            self.jobs[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def read_custom_resource_definition(self, name, _preload_content=True):
        """apiextensions.k8s.io/v1, raw (the launcher reads the JSON itself): the operators' real CRDs."""
        kind = {v: k for k, v in CRD_NAMES.items()}[name]
        if kind in self.missing_crds:
            raise ApiException(status=404, reason="NotFound")
        crd = load_crds(self.shared_data / "k8s")[kind]  # parsed once per session: 1.5 s of YAML each
        return SimpleNamespace(data=json.dumps(crd).encode())

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.jobs:
            raise ApiException(status=404, reason="NotFound")
        self.polls += 1
        job = self.jobs[name]
        finished = self.polls > self.finish_after
        conditions = [{"type": "Running", "status": "True"}]
        if finished and self.scenario in ("ok", "nccl", "rendezvous", "oomkilled", "restarted"):
            ok = self.scenario in ("ok", "nccl", "restarted")
            conditions.append({"type": "Succeeded" if ok else "Failed", "status": "True",
                               "reason": "JobSucceeded" if ok else "JobFailed", "message": "job finished"})
        if finished and self.scenario == "nodelost":  # the training operator's words (restartPolicy Never)
            conditions.append({"type": "Failed", "status": "True", "reason": "PyTorchJobFailed",
                               "message": f"PyTorchJob {name} is failed because 1 Worker replica(s) failed."})
        if finished and self.scenario == "deadline":
            conditions.append({"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                               "message": "Job was active longer than specified deadline"})
        job["status"] = {"conditions": conditions}
        return job

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None):
        self.deleted.append((name, body.propagation_policy))
        self.jobs.pop(name, None)

    def list_namespaced_pod(self, namespace, label_selector):
        run_id = label_selector.split("=", 1)[1]
        if not self.jobs:
            return V1PodList(items=[])
        finished = self.polls > self.finish_after
        s = self.scenario
        if s == "imagepull":
            state = V1ContainerState(waiting=V1ContainerStateWaiting(reason="ImagePullBackOff",
                                                                     message="Back-off pulling image"))
            return V1PodList(items=[_pod("w-0", run_id, phase="Pending", state=state)])
        if s == "unschedulable":
            cond = V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                                  message="0/4 nodes are available: 4 Insufficient vpc.amazonaws.com/efa.")
            return V1PodList(items=[_pod("w-0", run_id, phase="Pending", conditions=[cond])])
        if s == "evicted" and finished:
            evicted = _pod("w-0", run_id, phase="Failed", reason="Evicted", state=_terminated(137),
                           node="ip-c")
            return V1PodList(items=[evicted])
        if s == "nodelost" and finished:  # ip-b stopped answering: the taint manager deletes its pod
            lost = V1PodCondition(type="DisruptionTarget", status="True", reason="DeletionByTaintManager",
                                  message="Taint manager: deleting due to NoExecute taint key "
                                          "node.kubernetes.io/unreachable")
            return V1PodList(items=[_pod("w-0", run_id, node="ip-a"),
                                    _pod("w-1", run_id, node="ip-b", conditions=[lost])])
        if s == "oomkilled" and finished:
            return V1PodList(items=[_pod("w-0", run_id, phase="Failed", state=_terminated(137, "OOMKilled"))])
        if finished and s == "restarted":  # w-1's worker ran twice: its first run ended with an error
            first = V1ContainerState(terminated=V1ContainerStateTerminated(
                exit_code=1, reason="Error", started_at="2026-11-22T16:00:00Z",
                finished_at="2026-11-22T16:03:00Z"))
            return V1PodList(items=[_pod("w-0", run_id, phase="Succeeded", state=_terminated(0), node="ip-a"),
                                    _pod("w-1", run_id, phase="Succeeded", state=_terminated(0), node="ip-b",
                                         restarts=1, last_state=first)])
        if finished and s in ("ok", "nccl"):
            return V1PodList(items=[_pod(f"w-{i}", run_id, phase="Succeeded", state=_terminated(0))
                                    for i in range(2)])
        if finished and s == "rendezvous":
            return V1PodList(items=[_pod("w-0", run_id, phase="Failed", state=_terminated(1, "Error"))])
        return V1PodList(items=[_pod("w-0", run_id)])

    def read_namespaced_pod_log(self, name, namespace, container):
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
        if self.scenario == "rendezvous":
            return ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: "
                    "rendezvous 'fsdpbench' timed out\n")
        return ""

    def get_code(self, _request_timeout=None):
        return {"git_version": "v1.30.0"}


def run_one(tmp_path: Path, shared_data: Path, scenario: str, sweep: str = "p5_scaling", *overrides: str):
    cfg = cfg_for(sweep, *overrides)
    fake = FakeKube(scenario, shared_data)
    launcher = KubernetesLauncher(cfg, custom=fake, core=fake, version=fake)
    plan = [p for p in expand(cfg) if p.feasible][:1]
    sweep_dir = tmp_path / cfg.sweep_name
    execute(study_from(cfg, placement_of(cfg)), plan, launcher, sweep_dir)
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
    execute(study_from(cfg, placement_of(cfg)), [p for p in expand(cfg) if p.feasible][:1],
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
    launcher.cleanup(launcher.attach({"name": name, "kind": "PyTorchJob"}, tmp_path / "attempt-1"))
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
    execute(study_from(cfg, placement_of(cfg)), plan, launcher, sweep_dir)
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
    study = study_from(cfg, placement_of(cfg))
    steps = _run(_Sweep(study, launcher, sweep_dir, stop, Progress(1, False), plan), plan[0])
    next(steps)  # submitted and watched once; then the sweep "dies": its generator is simply dropped
    created = list(fake.jobs)
    assert len(created) == 1
    fake.finish_after = 0  # the job finishes while no sweep watches it
    execute(study_from(cfg, placement_of(cfg)), plan, launcher, sweep_dir)
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
    import time
    time.sleep(0.15)
    second = launcher.submit(sub, tmp_path)
    assert first.name != second.name and first.name.startswith(f"fsdpbench-train-{spec.run_id}-")


def test_missing_kubeconfig_is_one_clear_error(tmp_path, monkeypatch, capsys) -> None:
    from bench.sweep import main
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["+sweep=p5_scaling", "launcher=kubernetes", f"cluster.kubernetes.image={IMAGE}",
                 f"results_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no Kubernetes configuration") and err.count("\n") == 1


def test_unreachable_cluster_is_one_clear_error(tmp_path, monkeypatch) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "x"}}]}))
    cfg = cfg_for("p5_scaling", f"launcher.kubeconfig={kubeconfig}")
    with pytest.raises(ConfigError, match="Kubernetes API not reachable"):
        KubernetesLauncher(cfg).preflight()


def test_missing_image_is_a_config_error() -> None:
    raw, _ = compose(["+sweep=p5_scaling", "launcher=kubernetes"])
    with pytest.raises(ConfigError, match="cluster.kubernetes.image"):
        KubernetesLauncher(from_dict(raw)).preflight()



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

    def connect(self) -> None:
        self._custom = self._core = self._version = self._ext = fake
    monkeypatch.setattr(KubernetesLauncher, "_connect", connect)
    argv = ["+sweep=p5_scaling", "launcher=kubernetes", f"cluster.kubernetes.image={IMAGE}",
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
