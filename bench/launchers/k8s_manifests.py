"""Kubeflow manifests as pure functions: a PyTorchJob (kubeflow.org/v1) per training run, an MPIJob
(kubeflow.org/v2beta1) per nccl-tests probe. Secrets are only ever referenced (secretKeyRef,
imagePullSecrets), never inlined. The worker's stdout carries the metric records (no shared FS).
"""
from __future__ import annotations

import re
from typing import Any

from bench.core.config import ConfigError, SweepConfig
from bench.core.schema import RunSpec
from bench.launchers.base import (
    IMAGE_PYTHON,
    IMAGE_WORKDIR,
    TORCHRUN_MODULE,
    job_env,
    rendezvous_conf,
    worker_args,
    worker_module_argv,
)
from bench.probes.command import perf_argv

GROUP = "kubeflow.org"
HOSTNAME_LABEL = "kubernetes.io/hostname"  # the well-known label of each node's name
PYTORCHJOB = {"group": GROUP, "version": "v1", "plural": "pytorchjobs", "kind": "PyTorchJob"}
MPIJOB = {"group": GROUP, "version": "v2beta1", "plural": "mpijobs", "kind": "MPIJob"}
RUN_ID_LABEL = "fsdpbench.io/run-id"
SWEEP_LABEL = "fsdpbench.io/sweep"
NCCL_TESTS = "/opt/nccl-tests/build/all_reduce_perf"  # where the Dockerfile builds it (also on its PATH)
MPIRUN = "mpirun"
# The MPI operator (v2beta1) starts no program of its own in a worker: the worker must run an ssh server for
# the launcher's mpirun to reach it. The image sets sshd up (Dockerfile); -D stays in the foreground, -e logs
# to stderr (kubectl logs). A worker is Ready once sshd accepts connections, and the launcher is created
# only then (WaitForWorkersReady): no ssh attempt races an image pull on a fresh node.
SSHD_COMMAND = ["/usr/sbin/sshd", "-De"]
SSH_PORT = 22
# Ranks started over ssh get no login environment: pass the launcher's PATH and LD_LIBRARY_PATH so orted,
# libfabric and the aws-ofi-nccl plugin are found on the workers (as AWS's reference MPIJob does).
MPIRUN_PASS_ENV = ("PATH", "LD_LIBRARY_PATH")
# nccl-tests writes no system record: each rank runs this before the binary (sh -c SCRIPT NAME RUN_ID
# BINARY ARGS...), and each node's first one (Open MPI's local rank 0) writes the node's record from the
# project in the image, through mpirun's tagged output into the launcher's log; then it becomes the binary.
# A node where it cannot run says so on stderr and still probes. Arguments only: no config value is in it.
# sh, not bash: bash started over ssh with -c reads ~/.bashrc, which may change PATH under the binary.
SYSTEM_THEN_EXEC = ('run_id=$1; shift; if [ "${OMPI_COMM_WORLD_LOCAL_RANK:-0}" = 0 ]; then '
                    f'(cd {IMAGE_WORKDIR} && {IMAGE_PYTHON} -m trainer.system --run-id "$run_id" '
                    '--source nccl-tests) || echo "fsdpbench: no system record on $(hostname)" >&2; fi; '
                    'exec "$@"')


def deadline_s(cfg: SweepConfig) -> int:
    """The job's own deadline, a backstop for when the harness is gone: Kubernetes counts it from the job's
    start, queue time included, so it allows the queue timeout plus the run timeout (the harness itself
    times the run from when every pod runs)."""
    return int(cfg.launcher.queue_timeout_s + cfg.launcher.timeout_s)


# What a job is, in its name: a study's training run or collective probe, or the preflight's check of one
# node (spec kind "preflight") or all-reduce between a pair of nodes (a probe pinned to its hosts)
JOB_KINDS = {"train": "train", "nccl": "nccl", "preflight": "preflight-node"}
PREFLIGHT_PAIR = "preflight-pair"


def job_name(spec: RunSpec) -> str:
    """Stable DNS-1035 name of a run's job, saying what it is; submit appends an attempt suffix to make it
    unique."""
    kind = PREFLIGHT_PAIR if spec.kind == "nccl" and spec.hosts else JOB_KINDS[spec.kind]
    return f"fsdpbench-{kind}-{spec.run_id}"


def label_value(text: str) -> str:
    """A Kubernetes label value: <= 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return value or "none"


def _labels(cfg: SweepConfig, spec: RunSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "fsdpbench", SWEEP_LABEL: label_value(cfg.sweep_name),
            RUN_ID_LABEL: spec.run_id}


def _env(cfg: SweepConfig, spec: RunSpec) -> list[dict[str, Any]]:
    """The launchers' common environment (no shared run dir in a pod: the flight recorder dumps under /tmp
    and the watchdog's report reaches the pod log)."""
    common = job_env(cfg, spec, None, image=cfg.launcher.kubernetes.image)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(common.items())]
    env.append({"name": "FSDPBENCH_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    if cfg.launcher.kubernetes.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": cfg.launcher.kubernetes.hf_token_secret, "key": "token"}}})
    return env


def _resources(cfg: SweepConfig, spec: RunSpec) -> dict[str, Any]:
    amounts: dict[str, Any] = {}
    if cfg.cluster.gpu:
        amounts["nvidia.com/gpu"] = spec.gpus_per_node
    if spec.efa_per_node > 0:
        amounts["vpc.amazonaws.com/efa"] = spec.efa_per_node
    return {"limits": dict(amounts), "requests": dict(amounts)} if amounts else {}


def _pod_spec(cfg: SweepConfig, spec: RunSpec, container: dict[str, Any], worker: bool) -> dict[str, Any]:
    k = cfg.launcher.kubernetes
    pod: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
    if worker:
        pod["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": k.shm_size}}]
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        if cfg.cluster.instance_type != "local":
            pod["nodeSelector"] = {k.instance_type_label: cfg.cluster.instance_type}
    if term := _node_term(cfg, spec if worker else None):
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}}
    if k.image_pull_secret:
        pod["imagePullSecrets"] = [{"name": k.image_pull_secret}]
    if k.service_account:
        pod["serviceAccountName"] = k.service_account
    return pod


def _node_term(cfg: SweepConfig, spec: RunSpec | None) -> dict[str, Any]:
    """The one node selector term a pod must meet (its requirements all hold): a worker of the preflight on
    its node or pair of nodes (spec.hosts), and every pod off the nodes the study leaves out
    (launcher.kubernetes.exclude_nodes, by node name); empty where neither applies."""
    term: dict[str, Any] = {}
    if spec is not None and spec.hosts:
        term["matchExpressions"] = [{"key": HOSTNAME_LABEL, "operator": "In",
                                     "values": spec.hosts.split(",")}]
    if excluded := cfg.launcher.kubernetes.exclude_nodes:
        term["matchFields"] = [{"key": "metadata.name", "operator": "NotIn", "values": list(excluded)}]
    return term


def _image(cfg: SweepConfig) -> str:
    if not cfg.launcher.kubernetes.image:
        raise ConfigError(f"cluster {cfg.cluster.name}: set launcher.kubernetes.image to your worker image "
                          "(build it from the Dockerfile in this repository)")
    return cfg.launcher.kubernetes.image


def pytorchjob(cfg: SweepConfig, spec: RunSpec, name: str) -> dict[str, Any]:
    """One PyTorchJob: `nodes` Worker replicas, torchrun with c10d rendezvous from the elastic policy.

    No restarts (restartPolicy Never, backoffLimit 0, maxRestarts 0): a restarted worker would mix two
    attempts into one measurement; the sweep's own retry (--rerun-failed) starts a clean attempt. Workers
    that start apart (image pulls on fresh nodes) still meet: the elastic policy's rdzvConf (the operator
    passes it to torchrun as PET_RDZV_CONF) raises torch's 60 s store and 600 s join timeouts.
    """
    command = [IMAGE_PYTHON, "-m", TORCHRUN_MODULE, f"--nnodes={spec.nodes}",
               f"--nproc-per-node={spec.gpus_per_node}", "--rdzv-backend=c10d", "--max-restarts=0",
               *worker_module_argv(spec, None, worker_args(cfg, spec))]
    container = {"name": "pytorch", "image": _image(cfg), "imagePullPolicy": "IfNotPresent",
                 "workingDir": IMAGE_WORKDIR, "command": command,
                 "env": _env(cfg, spec),
                 "resources": _resources(cfg, spec)}
    template = {"metadata": {"labels": _labels(cfg, spec)}, "spec": _pod_spec(cfg, spec, container, True)}
    return {
        "apiVersion": f"{GROUP}/{PYTORCHJOB['version']}", "kind": PYTORCHJOB["kind"],
        "metadata": {"name": name, "namespace": cfg.launcher.kubernetes.namespace,
                     "labels": _labels(cfg, spec)},
        "spec": {
            "nprocPerNode": str(spec.gpus_per_node),
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": spec.nodes, "maxReplicas": spec.nodes,
                              "maxRestarts": 0, "rdzvConf": [{"key": k, "value": v}
                                                             for k, v in rendezvous_conf(cfg).items()]},
            "runPolicy": {"activeDeadlineSeconds": deadline_s(cfg), "backoffLimit": 0,
                          "cleanPodPolicy": "Running"},
            "pytorchReplicaSpecs": {"Worker": {"replicas": spec.nodes, "restartPolicy": "Never",
                                               "template": template}},
        },
    }


def mpijob(cfg: SweepConfig, spec: RunSpec, name: str) -> dict[str, Any]:
    """One MPIJob: an mpirun launcher and `nodes` workers, one rank of the probe's nccl-tests binary per
    GPU."""
    ranks = spec.nodes * spec.gpus_per_node
    env = job_env(cfg, spec, None, image=cfg.launcher.kubernetes.image)
    command = [MPIRUN, "--allow-run-as-root", "--tag-output", "-np", str(ranks),
               "-N", str(spec.gpus_per_node), "--bind-to", "none"]
    for key in MPIRUN_PASS_ENV:
        command += ["-x", key]
    for key in sorted(env):
        command += ["-x", f"{key}={env[key]}"]
    command += ["sh", "-c", SYSTEM_THEN_EXEC, "fsdpbench-system", spec.run_id]
    command += perf_argv(spec, binary=NCCL_TESTS)
    image = _image(cfg)
    launcher = {"name": "mpi-launcher", "image": image, "imagePullPolicy": "IfNotPresent", "command": command}
    worker = {"name": "nccl-worker", "image": image, "imagePullPolicy": "IfNotPresent",
              "command": SSHD_COMMAND,
              "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2},
              "resources": _resources(cfg, spec)}
    labels = _labels(cfg, spec)
    return {
        "apiVersion": f"{GROUP}/{MPIJOB['version']}", "kind": MPIJOB["kind"],
        "metadata": {"name": name, "namespace": cfg.launcher.kubernetes.namespace, "labels": labels},
        "spec": {
            "slotsPerWorker": spec.gpus_per_node,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"activeDeadlineSeconds": deadline_s(cfg), "backoffLimit": 0,
                          "cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"metadata": {"labels": labels},
                                                         "spec": _pod_spec(cfg, spec, launcher, False)}},
                "Worker": {"replicas": spec.nodes, "template": {"metadata": {"labels": labels},
                                                                "spec": _pod_spec(cfg, spec, worker, True)}},
            },
        },
    }


def manifest(cfg: SweepConfig, spec: RunSpec, name: str | None = None) -> dict[str, Any]:
    name = name or job_name(spec)
    # training and the preflight's node jobs under torchrun; collective probes under MPI (nccl-tests)
    return mpijob(cfg, spec, name) if spec.kind == "nccl" else pytorchjob(cfg, spec, name)
