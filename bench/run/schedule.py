"""Which runs to start now, and how long a plan holds the cluster: one rule for the runner and the estimate.

The rule: runs are kept in flight while their nodes fit a node budget. All-reduce probes run first, while the
cluster is still empty, and alone (traffic of other jobs on the same fabric would distort their bandwidth).
Training runs follow largest first (node-seconds, then nodes): the longest-processing-time order, which
keeps big runs from being left to the end where nothing can fill the nodes beside them. Runs later in
that order fill the nodes a waiting run cannot use. A run larger than the budget still runs, alone.
A budget of None means one run at a time.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from bench.launchers.base import Placement
from bench.predict.cost import estimated_seconds
from bench.study.plan import PlannedRun


@dataclass(frozen=True)
class Job:
    key: str
    nodes: int
    probe: bool = False
    seconds: float | None = None  # estimated duration; None where unknown (CPU clusters)


def job_of(planned: PlannedRun, placement: Placement) -> Job:
    """A planned run as the schedule orders it: its nodes and its predicted duration where it runs."""
    spec = planned.spec
    return Job(spec.run_id, spec.nodes, spec.kind == "nccl", estimated_seconds(planned, placement))


def order(jobs: Sequence[Job]) -> list[Job]:
    """Submission order: probes first, then training runs by node-seconds (or nodes) descending."""
    return sorted(jobs, key=lambda j: (not j.probe, -(j.nodes * (j.seconds or 1.0)), -j.nodes))


def can_start(job: Job, in_flight: Sequence[Job], budget: int | None, probes_alone: bool) -> bool:
    if not in_flight:
        return True
    if budget is None or (probes_alone and (job.probe or any(j.probe for j in in_flight))):
        return False
    return sum(j.nodes for j in in_flight) + job.nodes <= budget


def pick(waiting: Sequence[Job], in_flight: Sequence[Job], budget: int | None,
         probes_alone: bool) -> list[Job]:
    """The waiting jobs (already in submission order) to start now, first fit."""
    started: list[Job] = []
    for job in waiting:
        if can_start(job, [*in_flight, *started], budget, probes_alone):
            started.append(job)
    return started


def makespan(jobs: Sequence[Job], budget: int | None, probes_alone: bool = True) -> float:
    """Time from the first start to the last end when the runner follows this rule and every job takes its
    `seconds` (jobs with no estimate count as 0)."""
    waiting, running, now = order(jobs), [], 0.0  # running: heap of (end time, tie, job)
    while waiting or running:
        for job in pick(waiting, [j for _, _, j in running], budget, probes_alone):
            waiting.remove(job)
            heapq.heappush(running, (now + (job.seconds or 0.0), id(job), job))
        now, _, _ = heapq.heappop(running)
        while running and running[0][0] <= now:
            heapq.heappop(running)
    return now


def lower_bound(jobs: Sequence[Job], budget: int) -> float:
    """No schedule on `budget` nodes is shorter than this: the node-seconds spread evenly, or the longest
    job."""
    return max(sum(j.nodes * (j.seconds or 0.0) for j in jobs) / budget,
               max((j.seconds or 0.0 for j in jobs), default=0.0))


def makespan_line(cluster: str, placement: Placement, plan: list[PlannedRun], probes_alone: bool) -> str:
    """Estimated makespan of the plan on `cluster` and what the cluster is held for, beside what the runs
    use."""
    jobs = [job_of(p, placement) for p in plan if p.feasible]
    budget = placement.node_budget
    where = (f"{budget} node{'' if budget == 1 else 's'} in flight" if budget is not None
             else "one run at a time")
    if not jobs or any(j.seconds is None for j in jobs):
        return (f"schedule: {where}; no run-time estimate for {cluster} (no prediction without a "
                "named GPU: set cluster.gpu)")
    span = makespan(jobs, budget, probes_alone)
    held = (budget or max(j.nodes for j in jobs)) * span / 3600
    used = sum(j.nodes * (j.seconds or 0) for j in jobs) / 3600
    one_by_one = sum(j.seconds or 0 for j in jobs) / 3600
    return (f"schedule: {where}, estimated makespan {span / 3600:.2f} h "
            f"(one run at a time: {one_by_one:.2f} h); cluster held {held:,.1f} node-hours "
            f"for {used:,.1f} node-hours of runs ({used / held:.0%} busy)")
