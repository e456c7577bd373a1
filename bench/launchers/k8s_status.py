"""What a Kubeflow job's conditions and its pods' statuses say about its run (bench/launchers/kubernetes.py
polls them): the operator's final condition and who ended the job, the first pod state that decides the run
(OOMKilled, evicted, its node lost, an image that never pulls, unschedulable), the workers' exit codes and
each execution of a worker container, restarts included. The pods are the `kubernetes` client's V1Pod
objects, read as they are."""
from __future__ import annotations

from typing import Any

from bench.launchers.base import ENDED_BY_DEADLINE, ENDED_BY_OPERATOR

# A container waiting for one of these does not get over it on its own: the run ends after grace_s
STUCK_WAITING = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError"}


def terminal_condition(job: dict[str, Any]) -> dict[str, str] | None:
    """The job's true Succeeded or Failed condition, as the operator wrote it: type, reason, message."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return {key: str(cond.get(key) or "") for key in ("type", "reason", "message")}
    return None


def ended_by(condition: dict[str, str]) -> str:
    """Who ended a job with this condition: its own deadline (activeDeadlineSeconds: the training
    operator's message says "deadline", Kubernetes' own reason is DeadlineExceeded), else its operator."""
    deadline = "deadline" in f"{condition['reason']} {condition['message']}".lower()
    return ENDED_BY_DEADLINE if deadline else ENDED_BY_OPERATOR


# Pod disruption conditions (kubernetes.io/docs/concepts/workloads/pods/disruptions/, "Pod disruption
# conditions"): the reasons of a DisruptionTarget condition that mean the pod's node went away
NODE_LOST_REASONS = ("DeletionByTaintManager", "DeletionByPodGC")
ENDED_BY_NODE = ("Evicted", "NodeLost")  # a pod's end that its node decided


def node_of(pod: Any) -> str:
    return getattr(pod.spec, "node_name", None) or "?"


def pod_problem(pods: list[Any]) -> tuple[str, str] | None:
    """The first pod state that decides the run: OOMKilled, Evicted or its node lost (each naming the node),
    stuck image pulls, Unschedulable."""
    return next((problem for pod in pods if (problem := _problem(pod))), None)


def _problem(pod: Any) -> tuple[str, str] | None:
    status, name = pod.status, pod.metadata.name
    if status.reason == "Evicted":
        return "Evicted", f"pod {name} on node {node_of(pod)} evicted: {status.message or ''}".strip()
    for cond in status.conditions or []:
        if cond.type == "DisruptionTarget" and cond.status == "True":
            state = "NodeLost" if cond.reason in NODE_LOST_REASONS else "Evicted"
            return state, (f"pod {name} on node {node_of(pod)} disrupted ({cond.reason}): "
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


def ran(pod: Any) -> bool:
    """Whether any container of the pod ever started (running, or ended: now or before a restart)."""
    for cs in pod.status.container_statuses or []:
        if (cs.state and (cs.state.running or cs.state.terminated)) or cs.restart_count or (
                cs.last_state and cs.last_state.terminated):
            return True
    return False


def exit_codes(pods: list[Any]) -> list[int | None]:
    codes = []
    for pod in pods:
        for cs in pod.status.container_statuses or []:
            term = cs.state.terminated if cs.state else None
            codes.append(term.exit_code if term else None)
    return codes


def _restart(pod: Any, terminated: Any) -> dict[str, Any]:
    """One earlier run of a pod's worker container: its node, and what ended it where Kubernetes kept it."""
    node = node_of(pod)
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
    final_run: dict[str, Any] = {"state": final, "nodes": ",".join(sorted({node_of(p) for p in pods}))}
    lost = {node_of(p): problem[1] for p in pods if (problem := _problem(p)) and problem[0] in ENDED_BY_NODE}
    if lost:
        final_run["failed_nodes"] = lost
    return [*earlier, final_run]
