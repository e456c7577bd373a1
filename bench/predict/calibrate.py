"""The performance model calibrated on the study's own runs: its constants refitted to the runs that
finished ok on this cluster, with the published constants as the prior.

Why: bench/predict/perf.py's constants were fitted to other people's clusters. The study measures the
truth on its first, cheap runs; refitted to them, the model predicts the expensive runs of the same
cluster from that cluster's own behaviour (a staged study: `axes.nodes=[1,2]` first, then `--dry-run` of
the whole sweep on the same results dir).

The fit is a maximum a posteriori one in log space: each run's residual is log(predicted / measured) with
a noise of SIGMA, and each constant's log departure from the published value is held by a prior of width
PRIOR_WIDTH, so one run moves a constant only as far as its evidence goes and a constant the runs cannot
see (contention on one-rank runs) stays where it was published. Where a run recorded its step's split
(its profiler trace: RunSummary.trace_split), the parts that tell the constants apart are residuals too
(FITTED_PARTS, at the noise SIGMA_PART): the compute's, which the step alone cannot tell from a CPU
rank's host work (`cpu_host_s`), and that host work, fitted only where some run measured it; on a CPU
its exposed collectives, which calibrate a gloo ring step's latency in training (`cpu_step_s`).
Levenberg-Marquardt on at most ten constants: deterministic, about a second for a smoke study's 16 traced
CPU runs on 2 cores. The inverse curvature at the optimum gives each later prediction an interval
(`Fit.spread`): parameter uncertainty plus the runs' own scatter.

The fit is kept with the study (calibration.json in the sweep dir: bench/predict/calibration_file.py) and
used for every later prediction of that cluster.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from bench.core.hardware import GpuSpec, compute_dtype
from bench.core.models import ModelArch
from bench.core.schema import RunSpec, RunSummary
from bench.predict.comm import EXPOSED_PARTS, Network
from bench.predict.cpu import CPU, CpuFacts, capacity, cpu_efficiency
from bench.predict.devices import LocalMachine, device_model
from bench.predict.gpu import gpu_efficiency
from bench.predict.perf import (
    CALIBRATION,
    Calibration,
    Prediction,
    Predictor,
    Stack,
    predict,
)
from bench.predict.split import PARTS, comparable

SIGMA = 0.05  # log scatter of one run's tokens/s about the model: repeats of a run differ by a few percent
# log scatter of one part of a traced step about the model: a trace holds one or two profiled steps, and on
# 2 shared cores one rank's compute and waiting trade places from step to step
# (benchmarks/evidence/README.md, "CPU smoke studies")
SIGMA_PART = 0.25
# per device, a trace's parts the fit reads: on a CPU its collectives too (Calibration.cpu_step_s)
FITTED_PARTS = {"gpu": ("compute",), "cpu": ("compute", "other", "waiting", *EXPOSED_PARTS)}
PRIOR_WIDTH = {"efficiency": 0.3, "elementwise_bytes": 0.7, "contention": 0.7, "compile_traffic": 0.3,
               "cpu_capacity": 1.0, "cpu_host_s": 1.0, "cpu_step_s": 1.0}  # log: how far a study moves each
FRACTIONS = ("contention", "compile_traffic")  # constants held at most 1
Z90 = 1.645  # a ~90% interval, two-sided
STEP = 1e-4  # finite-difference step in log space


@dataclass(frozen=True)
class Observation:
    """One finished run as the fit sees it: where it ran and what it measured."""

    run_id: str
    spec: RunSpec
    gpu: GpuSpec
    network: Network
    arch: ModelArch
    tokens_per_s_per_gpu: float
    stack: Stack | None = None  # another training stack than this harness's (a published row; perf.Stack)
    parts: Mapping[str, float] | None = None  # its traced split in the model's parts (split.comparable)
    cpu: CpuFacts | None = None  # a CPU run's CPU: its study's, as the runs recorded it (cpu.recorded)

    def prediction(self, cal: Calibration) -> Prediction:
        local = LocalMachine(self.cpu) if self.cpu is not None else None
        return predict(self.spec, self.gpu, self.network, self.arch, cal, self.stack, local)

    def predicted(self, cal: Calibration) -> float:
        return self.prediction(cal).tokens_per_s_per_gpu

    def fitted_parts(self) -> list[tuple[str, float]]:
        """The measured parts the fit reads (FITTED_PARTS; a part the trace saw none of is no evidence)."""
        device = "cpu" if self.gpu.family == CPU.family else "gpu"
        return [(k, self.parts[k]) for k in FITTED_PARTS[device] if self.parts and self.parts.get(k, 0) > 0]


def _width(name: str) -> float:
    return PRIOR_WIDTH[name.split(":")[0]]


def parameters(observations: list[Observation]) -> tuple[str, ...]:
    """The constants these runs can inform: the matmul efficiency of each device family and compute dtype
    they ran, the elementwise traffic, contention where ranks communicate, compile's share where a run
    compiled, and the CPU capacity of a local CPU study."""
    names = sorted({f"efficiency:{o.gpu.family}:{compute_dtype(o.spec.precision)}" for o in observations})
    names.append("elementwise_bytes")
    if any(o.spec.world_size > 1 for o in observations):
        names.append("contention")
    if any(o.spec.compile and o.stack is None for o in observations):
        names.append("compile_traffic")
    if any(o.gpu.family == CPU.family for o in observations):
        names.append("cpu_capacity")
    if any(o.gpu.family == CPU.family and dict(o.fitted_parts()).get("other") for o in observations):
        names.append("cpu_host_s")
    if any(o.gpu.family == CPU.family and set(dict(o.fitted_parts())) & set(EXPOSED_PARTS)
           for o in observations):
        names.append("cpu_step_s")
    return tuple(names)


def _prior_value(name: str, prior: Calibration, cpu: CpuFacts | None) -> float:
    """A constant's value before the study moves it; a CPU's efficiency and capacity at the CPU its runs
    ran on (`cpu`)."""
    if name.startswith("efficiency:"):
        _, family, dtype = name.split(":")
        if family == CPU.family:
            return cpu_efficiency(prior, dtype, _known(cpu))
        return gpu_efficiency(prior, family, dtype)
    if name == "cpu_capacity":
        return capacity(prior, _known(cpu))
    return float(getattr(prior, name))


def _known(cpu: CpuFacts | None) -> CpuFacts:
    if cpu is None:
        raise ValueError("a CPU constant's prior needs the CPU's facts (cpu.CpuFacts)")
    return cpu


def apply(prior: Calibration, names: tuple[str, ...], theta: Iterable[float], source: str,
          cpu: CpuFacts | None = None) -> Calibration:
    """The prior with each named constant multiplied by exp(theta); fractions held at most 1; `cpu`: the CPU
    a CPU study's runs ran on (its efficiency's and capacity's priors read it)."""
    efficiency, fields = dict(prior.matmul_efficiency), {}
    for name, t in zip(names, theta):
        value = _prior_value(name, prior, cpu) * math.exp(t)
        if name.startswith("efficiency:"):
            efficiency[name.split(":", 1)[1]] = min(value, 1.0)
        else:
            fields[name] = min(value, 1.0) if name in FRACTIONS else value
    return replace(prior, matmul_efficiency=efficiency, source=source, **fields)


@dataclass(frozen=True)
class Fit:
    calibration: Calibration
    prior: Calibration
    names: tuple[str, ...]
    theta: tuple[float, ...]
    covariance: tuple[tuple[float, ...], ...]
    residual: float  # root mean square of log(predicted / measured) over the runs, after the fit
    runs: tuple[str, ...]
    nodes: tuple[int, ...]  # the node counts the runs were at
    cpu: CpuFacts | None = None  # the CPU a CPU study's runs ran on (its priors read it); None: no CPU run

    def spread(self, tokens: Callable[[Calibration], float]) -> float:
        """Half-width, in log units, of a ~90% interval for a prediction `tokens(calibration)`: the
        constants' uncertainty through the prediction's sensitivity to each, plus the runs' own scatter."""
        base = math.log(tokens(self.calibration))
        grad = []
        for j in range(len(self.names)):
            theta = [t + (STEP if i == j else 0.0) for i, t in enumerate(self.theta)]
            grad.append((math.log(tokens(apply(self.prior, self.names, theta, "", self.cpu))) - base) / STEP)
        var = sum(grad[i] * self.covariance[i][j] * grad[j]
                  for i in range(len(grad)) for j in range(len(grad)))
        return Z90 * math.sqrt(max(var, 0.0) + max(self.residual, SIGMA) ** 2)

    @property
    def line(self) -> str:
        low, high = min(self.nodes), max(self.nodes)
        at = f"{low}" if low == high else f"{low}-{high}"
        return (f"calibrated on {len(self.runs)} runs at {at} node{'s' if high > 1 else ''} of this study "
                f"(residual {self.residual:.0%})")


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting (a is small and positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[pivot] = m[pivot], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _residuals(observations: list[Observation], prior: Calibration, names: tuple[str, ...],
               theta: list[float]) -> list[float]:
    """Each run's log(predicted / measured) with the constants at theta, then its traced parts' (weighed
    by SIGMA / SIGMA_PART: the cost divides every residual by SIGMA)."""
    cal = apply(prior, names, theta, "", study_cpu(observations))
    out = []
    for o in observations:
        pred = o.prediction(cal)
        out.append(math.log(pred.tokens_per_s_per_gpu / o.tokens_per_s_per_gpu))
        floor = 1e-6 * pred.step_time_s  # a part the model has none of (no turns): a large residual, finite
        out += [SIGMA / SIGMA_PART * math.log(max(pred.parts[k], floor) / measured)
                for k, measured in o.fitted_parts() if pred.parts[k] > 0 or k not in EXPOSED_PARTS]
    return out


def _step_residual(observations: list[Observation], cal: Calibration) -> float:
    """Root mean square of the runs' log(predicted / measured) tokens/s."""
    runs = [math.log(o.predicted(cal) / o.tokens_per_s_per_gpu) for o in observations]
    return math.sqrt(sum(r * r for r in runs) / len(runs))


def _normal(observations: list[Observation], prior: Calibration, names: tuple[str, ...],
            theta: list[float], runs: list[float],
            scatter: float = SIGMA) -> tuple[list[list[float]], list[float]]:
    """The Gauss-Newton system of the weighted residuals, runs (at `scatter`) and prior together:
    J^T W J and J^T W r, the run columns by finite differences."""
    k = len(names)
    columns = []
    for j in range(k):
        moved = [t + (STEP if i == j else 0.0) for i, t in enumerate(theta)]
        columns.append([(r2 - r1) / STEP
                        for r1, r2 in zip(runs, _residuals(observations, prior, names, moved))])
    w_run, w_prior = 1 / scatter ** 2, [1 / _width(n) ** 2 for n in names]
    h = [[w_run * sum(a * b for a, b in zip(columns[i], columns[j])) + (w_prior[i] if i == j else 0.0)
          for j in range(k)] for i in range(k)]
    g = [w_run * sum(a * r for a, r in zip(columns[i], runs)) + w_prior[i] * theta[i] for i in range(k)]
    return h, g


def _cost(runs: list[float], theta: list[float], names: tuple[str, ...]) -> float:
    return (sum(r * r for r in runs) / SIGMA ** 2
            + sum((t / _width(n)) ** 2 for t, n in zip(theta, names)))


def fit(observations: list[Observation], prior: Calibration = CALIBRATION) -> Fit | None:
    """The constants that best explain these runs, held by the prior; None without runs."""
    if not observations:
        return None
    names = parameters(observations)
    cpu = study_cpu(observations)
    theta, damping = [0.0] * len(names), 1e-3
    runs = _residuals(observations, prior, names, theta)
    cost = _cost(runs, theta, names)
    for _ in range(100):
        h, g = _normal(observations, prior, names, theta, runs)
        step = _solve([[v * (1 + damping) if i == j else v for j, v in enumerate(row)]
                       for i, row in enumerate(h)],
                      [-x for x in g])
        trial = [t + s for t, s in zip(theta, step)]
        trial_runs = _residuals(observations, prior, names, trial)
        trial_cost = _cost(trial_runs, trial, names)
        if trial_cost < cost:
            theta, runs, cost, damping = trial, trial_runs, trial_cost, max(damping / 10, 1e-9)
            if max(map(abs, step)) < 1e-7:
                break
        else:
            damping *= 10
            if damping > 1e9:
                break
    residual = _step_residual(observations, apply(prior, names, theta, "", cpu))
    # the constants are as sure as the runs agree: at their actual scatter where it exceeds SIGMA
    h, _ = _normal(observations, prior, names, theta, runs, max(residual, SIGMA))
    covariance = [_solve(h, [1.0 if i == j else 0.0 for i in range(len(names))]) for j in range(len(names))]
    source = f"this study's {len(observations)} runs"
    return Fit(apply(prior, names, theta, source, cpu), prior, names, tuple(theta),
               tuple(tuple(row) for row in covariance), residual, tuple(o.run_id for o in observations),
               tuple(sorted({o.spec.nodes for o in observations})), cpu)


def study_cpu(observations: list[Observation]) -> CpuFacts | None:
    """The CPU a study's CPU runs ran on (Observation.cpu: one per study, as its Predictor gives them);
    None where none ran on a CPU."""
    return next((o.cpu for o in observations if o.cpu is not None), None)


def observations(predictor: Predictor, summaries: Iterable[RunSummary]) -> list[Observation]:
    """The study's training runs that ended ok on this cluster, on the device the predictor predicts for
    (a local run that went to the CPU is not evidence about the GPU; one that did runs at the predictor's
    CPU), of what the model describes (not DeviceModel.unmodeled), sorted by run id (the fit is the same
    whatever order the run dirs are read in)."""
    out = []
    for s in summaries:
        spec = s.spec
        if (s.status != "ok" or spec is None or spec.kind != "train" or not s.tokens_per_s_per_gpu
                or spec.micro_batch < 1 or spec.cluster != predictor.cluster.name):
            continue
        where = predictor.setting(spec)
        if where is None or (s.device_name == "cpu") != (where[0].family == CPU.family):
            continue
        gpu, network = where
        cpu = predictor.local.cpu if gpu.family == CPU.family else None
        if device_model(gpu, CALIBRATION, predictor.local).unmodeled(spec):
            continue
        try:
            arch = spec.arch
        except (KeyError, ValueError):
            continue
        out.append(Observation(s.run_id, spec, gpu, network, arch, float(s.tokens_per_s_per_gpu),
                               parts=traced_parts(s), cpu=cpu))
    return sorted(out, key=lambda o: o.run_id)


def traced_parts(summary: RunSummary) -> dict[str, float] | None:
    """A run's traced split in the model's parts, each part's share of the profiled step times the measured
    step (the trace's steps run slower under the profiler); None without one."""
    split, step = summary.trace_split, summary.step_time_s
    if not isinstance(split, Mapping) or not step:
        return None
    total = sum(float(split.get(k, 0.0)) for k in PARTS)
    if total <= 0:
        return None
    return comparable({k: float(split.get(k, 0.0)) * step / total for k in PARTS})


def extrapolation(observations: list[Observation], prior: Calibration = CALIBRATION) -> list[dict[str, Any]]:
    """Every run above the smallest node count, predicted from the smallest node count's runs alone (held
    to the linear scaling of its configuration there), beside what it measured: how far a staged study's
    extrapolation would have missed."""
    if not observations:
        return []
    smallest = min(o.spec.nodes for o in observations)
    base = fit([o for o in observations if o.spec.nodes == smallest], prior)
    rows = []
    for o in observations:
        if base is None or o.spec.nodes == smallest:
            continue
        predicted = o.predicted(base.calibration)
        at_base = replace(o, spec=o.spec.at_nodes(smallest)).predicted(base.calibration)
        predicted = min(predicted, at_base)
        rows.append({"run_id": o.run_id, "label": o.spec.label, "model": o.spec.model, "nodes": o.spec.nodes,
                     "base_nodes": smallest, "base_runs": len(base.runs), "predicted": predicted,
                     "measured": o.tokens_per_s_per_gpu, "error": o.tokens_per_s_per_gpu / predicted - 1})
    return rows
