"""What bounds each collective, predicted: per configuration and node count of a study's plan on a GPU
cluster, each part of the step's collectives with NCCL's predicted algorithm and protocol for one block's
message, what bounds it (latency, in-node bandwidth, network bandwidth) and the step's exposed seconds of its
seconds, by the study's own model (its probes and its calibration: analysis/winback.py study_model), the
same lines the plan prints on --dry-run (bench/study/answer.py bounds_table). A CPU study's collectives are
gloo's: no row."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.scaling import configuration_label, spec_of
from analysis.winback import study_model
from bench.predict.perf import Predictor

COLUMNS = ("model", "configuration", "nodes", "part", "algorithm", "protocol", "bound", "exposed_s",
           "total_s")


def _rows(plan: pd.DataFrame, predictor: Predictor) -> list[dict]:
    out = []
    for _, row in plan.iterrows():
        spec = spec_of(row)
        pred = predictor.predict(spec) if spec is not None else None
        for b in pred.bounds if pred is not None else ():
            out.append({"model": row["model"], "configuration": configuration_label(row), "nodes": spec.nodes,
                        "part": b.part.removeprefix("exposed_"), "algorithm": b.algorithm,
                        "protocol": b.protocol, "bound": b.bound, "exposed_s": b.exposed_s,
                        "total_s": b.total_s})
    return out


def bounds_table(plan: pd.DataFrame, sweeps: list[Path]) -> pd.DataFrame:
    """The rows of every sweep's feasible planned training runs, each predicted by its sweep's model."""
    rows = []
    for sweep in sweeps:
        mine = plan[(plan["sweep"] == sweep.name) & (plan["status"] == "planned")] if len(plan) else plan
        model = study_model(sweep) if len(mine) else None
        if model is not None:
            rows += _rows(mine.drop_duplicates("run_id"), model[0])
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    order = ["model", "configuration", "part", "nodes"]
    return frame.sort_values(order, kind="stable").reset_index(drop=True)
