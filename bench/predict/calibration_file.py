"""A study's calibration kept with it (calibration.json in the sweep dir, written only here, through
bench.core.rundir), and the study's predictor: its probes and that calibration, refitted
(bench/predict/calibrate.py) when runs finished since the file was written. A file from another cluster,
another model set, an older prior or a corrupt one is refused with one line, and the published constants
are used."""
from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.core.config import ClusterConfig
from bench.core.schema import RunSummary
from bench.launchers.base import Placement
from bench.predict.calibrate import Fit, apply, extrapolation, fit, observations
from bench.predict.cpu import CpuFacts, recorded, this_cpu
from bench.predict.devices import LocalMachine
from bench.predict.network import probes_of
from bench.predict.perf import CALIBRATION, Predictor

FORMAT = 1


class Refused(ValueError):
    """A calibration file that must not be used; the message says which and why, in one line."""


def cluster_key(cluster: ClusterConfig) -> dict[str, Any]:
    """What a calibration belongs to: the cluster as the sweep names it."""
    return {"name": cluster.name, "instance_type": cluster.instance_type, "gpu": cluster.gpu}


def to_json(fit_: Fit, cluster: ClusterConfig, summaries: list[RunSummary],
            extra: list[dict[str, Any]]) -> dict[str, Any]:
    used = [s for s in summaries if s.run_id in set(fit_.runs)]
    return {"format": FORMAT, "cluster": cluster_key(cluster), "models": sorted({s.spec.model for s in used}),
            "constants": asdict(fit_.calibration), "prior": asdict(fit_.prior),
            "parameters": list(fit_.names),
            "theta": list(fit_.theta), "covariance": [list(r) for r in fit_.covariance],
            "cpu": fit_.cpu.to_json() if fit_.cpu else None,
            "residual": fit_.residual, "runs": list(fit_.runs), "nodes": list(fit_.nodes),
            "torch_versions": sorted({s.torch_version for s in used if s.torch_version}),
            "nccl_versions": sorted({s.extra["nccl_version"] for s in summaries
                                     if s.extra.get("nccl_version")}),
            "devices": sorted({s.device_name for s in used if s.device_name}),
            "fitted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "extrapolation": extra}


def from_json(path: Path, cluster: ClusterConfig, models: Iterable[str], cpu: CpuFacts | None = None) -> Fit:
    """The fit a study's file holds, or Refused naming the file and why; at the CPU it names (the one its
    CPU runs were fitted at), else at `cpu` (a file written before it named one)."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise Refused(f"{path}: not a calibration file of format {FORMAT}")
        if data["cluster"] != cluster_key(cluster):
            raise Refused(f"{path}: fitted on cluster {data['cluster'].get('name')!r} "
                          f"({data['cluster'].get('instance_type')}, gpu {data['cluster'].get('gpu')}), "
                          f"not this sweep's {cluster.name!r}")
        if not set(data["models"]) & set(models):
            raise Refused(f"{path}: fitted on models {', '.join(data['models'])}, none of which this sweep "
                          "trains")
        # the published constants (a file before the CPU's facts were kept named its recorded cores here)
        prior = replace(CALIBRATION, cpu_capacity=data["prior"].get("cpu_capacity"))
        if data["prior"] != asdict(prior):
            raise Refused(f"{path}: fitted against other published constants (an older fsdpbench)")
        names, theta = tuple(data["parameters"]), tuple(float(t) for t in data["theta"])
        cov = tuple(tuple(float(v) for v in row) for row in data["covariance"])
        if len(theta) != len(names) or len(cov) != len(names) or any(len(r) != len(names) for r in cov):
            raise Refused(f"{path}: parameters, theta and covariance disagree in size")
        if any(not math.isfinite(t) or abs(t) > 20 for t in theta):
            raise Refused(f"{path}: a constant out of range")
        runs = tuple(data["runs"])
        source = f"this study's {len(runs)} runs"
        fitted_at = CpuFacts.from_json(data["cpu"]) if data.get("cpu") else None if "cpu" in data else cpu
        return Fit(apply(prior, names, theta, source, fitted_at), prior, names, theta, cov,
                   float(data["residual"]), runs, tuple(int(n) for n in data["nodes"]), fitted_at)
    except Refused:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise Refused(f"{path}: unreadable ({type(e).__name__}: {e})") from None


def study_predictor(cluster: ClusterConfig, placement: Placement, models: Iterable[str],
                    sweep_dir: Path, write: bool = True,
                    here: CpuFacts | None = None) -> tuple[Predictor, str | None]:
    """The sweep's predictor for the runs of `models` on its cluster, as its launcher places them: the
    study's probes, and its calibration (refitted, and written unless `write` is off (the report reads a
    study, it does not change it), when runs finished since the file was written); with a one-line note:
    what it is calibrated on, or why the file was refused (then the published constants; the file is left
    as it is). Its runs on CPU cores at the CPU they recorded (cpu.recorded), each fact none recorded this
    machine's (`here`, read where not given)."""
    from bench.core import rundir
    summaries = rundir.read_summaries(sweep_dir)  # once: the probes and the runs both come from them
    probes = probes_of(summaries)
    cpu = recorded(summaries, here or this_cpu())
    local = LocalMachine(cpu)
    published = Predictor(cluster, placement, probes, local=local)
    path = sweep_dir / rundir.CALIBRATION_JSON
    stored = None
    if path.exists():
        try:
            stored = from_json(path, cluster, models, cpu)
        except Refused as e:
            return published, (f"calibration: refusing {e}; predicting with the published constants (delete "
                               "the file to refit on this study's runs)")
    seen = observations(published, summaries)
    if not seen:
        return published, None
    current = stored if stored and stored.runs == tuple(o.run_id for o in seen) else None
    if current is None:
        current = fit(seen)
        assert current is not None
        if write:
            rundir.atomic_write_text(path, json.dumps(to_json(current, cluster, summaries,
                                                              extrapolation(seen)), indent=1))
    return Predictor(cluster, placement, probes, current, local), f"predictions {current.line}: {path.name}"
