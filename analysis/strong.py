"""Scaling in the units a team sizing a training run decides in: per configuration and node count, the
time per optimizer step, days and dollars to train a token budget, the fastest and cheapest node count,
and at one global batch the knee past which another node buys little. The definitions are
bench/predict/budget.py's, which the plan prints before anything launches: this is the same answer, with
measured figures in place of predicted ones as runs finish.

At a fixed global batch (strong scaling) every node count trains the same tokens per optimizer step, so
scaling efficiency at n nodes is (step time at base / step time at n) x base / n: the weak-scaling
definition on tokens/s, read on the time a team pays for. Where a node count has no ok run, its figures are
the prediction (its summary's where it ran, else the plan's: plan.csv), marked with their source. Where the
global batch grows with the node count (weak scaling), each node count's days are at the batch it trains,
labelled so, and there is no knee. Where a node count's runs measured their GPUs' energy per token, the
budget's GPU energy in kWh and its cost at the cluster's energy price (bench/predict/budget.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.render import number
from analysis.scaling import CONFIG, configuration_label, node_count
from bench.core import rundir
from bench.predict.budget import DEFAULT_KNEE_SHARE, Answer, Point, Row, answer, step_up

# a row's columns (strong_rows; analysis/sections.py names them on the page)
ROW = ("model", "configuration", "scaling", "nodes", "tokens_per_step", "micro_batch", "grad_accum",
       "step_time_s", "pred_step_time_s", "source", "efficiency", "next_share", "next_step", "days_to_train",
       "usd_to_train", "price_per_hour", "energy_j_per_token", "energy_price", "kwh_to_train",
       "energy_usd_to_train", "answer", "straggler", "configuration_id")
# what a node count's figure needs, of the aggregated results and of the plan
FIGURES = [*CONFIG, "nodes", "global_batch", "micro_batch", "grad_accum", "step_time_s", "pred_step_time_s",
           "pred_source", "status", "straggler", "energy_j_per_token"]


def study_settings(sweeps: list[Path]) -> dict[str, float]:
    """The `study` section of the first sweep's resolved config that has one (bench/core/config.py
    StudyConfig: train_tokens, knee_share), its numbers by key: what the report's budget defaults to."""
    for sweep in sweeps:
        try:
            study = (yaml.safe_load((sweep / rundir.SWEEP_CONFIG).read_text()) or {}).get("study")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(study, dict):
            return {k: float(v) for k, v in study.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {}


def _key(frame: pd.DataFrame) -> pd.Series:
    """A configuration and node count as one string, numbers compared as numbers (32 == 32.0)."""
    def cell(v: object) -> str:
        number = isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))
        return repr(float(v)) if number else str(v)
    return frame[CONFIG + ["nodes"]].apply(lambda r: "|".join(cell(v) for v in r), axis=1)


def figures(agg: pd.DataFrame, plan: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per configuration and node count the runs' figures, and the plan's for node counts not run yet."""
    runs = agg.reindex(columns=FIGURES)
    if plan is None or plan.empty:
        return runs
    planned = plan.reindex(columns=FIGURES).drop_duplicates(CONFIG + ["nodes"])
    if not runs.empty:
        planned = planned[~_key(planned).isin(set(_key(runs)))]
    return pd.concat([runs, planned], ignore_index=True) if not runs.empty else planned.reset_index(drop=True)


def _source(row: pd.Series) -> str:
    """"measured", "predicted (published constants)", "predicted (this study's 3 runs); ran: timeout", or
    why a node count has no figure ("infeasible")."""
    if pd.notna(row["step_time_s"]):
        return "measured"
    if pd.isna(row["pred_step_time_s"]) or row["status"] == "infeasible":
        return str(row["status"])
    source = f"predicted ({row['pred_source']})" if pd.notna(row["pred_source"]) else "predicted"
    return source + ("" if row["status"] in ("planned", "ok") else f"; ran: {row['status']}")


def _tokens_per_step(frame: pd.DataFrame) -> pd.Series:
    """The global batch in tokens; weak scaling: a micro batch per rank."""
    batch = pd.to_numeric(frame["global_batch"], errors="coerce").fillna(0)
    weak = pd.to_numeric(frame["micro_batch"], errors="coerce") * frame["nodes"] * frame["gpus_per_node"]
    return batch.where(batch > 0, weak) * frame["seq_len"]


def _points(group: pd.DataFrame) -> list[Point]:
    energy = group["energy_j_per_token"] if "energy_j_per_token" in group else pd.Series(None, group.index)
    return [Point(int(r["nodes"]), float(r["tokens_per_step"]),
                  None if pd.isna(r["step_time_s"]) else float(r["step_time_s"]), str(r["source"]),
                  j_per_token=None if pd.isna(j) else float(j))
            for (_, r), j in zip(group.iterrows(), energy)]


def strong_rows(agg: pd.DataFrame, prices: dict[str, float | None], train_tokens: float,
                knee_share: float = DEFAULT_KNEE_SHARE, plan: pd.DataFrame | None = None,
                energy_prices: dict[str, float | None] | None = None) -> pd.DataFrame:
    """One row per configuration and node count (see the module docstring); `scaling` says strong or
    weak, `answer` marks the fastest, the cheapest and the knee; energy_prices: USD per kWh by cluster."""
    found = figures(agg, plan)
    rows, configs = [], []
    for index, (_, group) in enumerate(found.groupby(CONFIG, dropna=False, sort=True)):
        configs.append(group[CONFIG].iloc[0])
        group = group.sort_values("nodes").drop_duplicates("nodes")
        measured = group["step_time_s"].notna()
        predicted = group["pred_step_time_s"].where(group["status"] != "infeasible")  # never a figure
        group = group.assign(step_time_s=group["step_time_s"].where(measured, predicted).astype(float),
                             pred_step_time_s=predicted,
                             tokens_per_step=_tokens_per_step(group), source=group.apply(_source, axis=1))
        price = prices.get(group["cluster"].iloc[0])
        energy_price = (energy_prices or {}).get(group["cluster"].iloc[0])
        ans = answer(_points(group), train_tokens, price, knee_share, energy_price)
        marks = {id(r): [] for r in ans.rows}
        for what, row in (("fastest", ans.fastest), ("cheapest", ans.cheapest), ("knee", ans.knee)):
            if row is not None:
                marks[id(row)].append(what + (" (beyond)" if what == "knee" and ans.knee_beyond else ""))
        rows.append(pd.DataFrame({
            "model": group["model"].values,
            "configuration": group.apply(configuration_label, axis=1).values,
            "scaling": "strong" if ans.strong and (group["global_batch"] > 0).all() else "weak",
            "nodes": group["nodes"].values, "tokens_per_step": group["tokens_per_step"].values,
            "micro_batch": group["micro_batch"].values, "grad_accum": group["grad_accum"].values,
            "step_time_s": group["step_time_s"].values, "pred_step_time_s": group["pred_step_time_s"].values,
            "source": group["source"].values, "efficiency": [r.efficiency for r in ans.rows],
            "next_share": [r.next_share for r in ans.rows], "next_step": [step_up(r) for r in ans.rows],
            "days_to_train": [r.days for r in ans.rows],
            "usd_to_train": [r.usd for r in ans.rows], "price_per_hour": price,
            "energy_j_per_token": group["energy_j_per_token"].values, "energy_price": energy_price,
            "kwh_to_train": [r.kwh for r in ans.rows],
            "energy_usd_to_train": [r.energy_usd for r in ans.rows],
            "answer": [", ".join(marks[id(r)]) for r in ans.rows], "straggler": group["straggler"].values,
            "configuration_id": index}))
    if not rows:
        return pd.DataFrame(columns=list(ROW))
    out = _told_apart(pd.concat(rows, ignore_index=True), configs)
    return out.astype({c: float for c in ("efficiency", "next_share", "days_to_train", "usd_to_train",
                                          "kwh_to_train", "energy_usd_to_train")})


def _told_apart(out: pd.DataFrame, configs: list[pd.Series]) -> pd.DataFrame:
    """Where configurations share a model and a label (two clusters, sweeps or EFA counts), each label
    names what differs: "FULL_SHARD bf16_mixed (cluster p4de.24xlarge)"."""
    labels = out["configuration"].copy()
    for _, same in out.groupby(["model", "configuration"], sort=False):
        ids = sorted(set(same["configuration_id"]))
        if len(ids) < 2:
            continue
        differ = [k for k in CONFIG if len({str(configs[i][k]) for i in ids}) > 1]
        for i in ids:
            rows = same.index[same["configuration_id"] == i]
            labels[rows] = labels[rows] + " (" + ", ".join(f"{k} {configs[i][k]}" for k in differ) + ")"
    return out.assign(configuration=labels)


def _answer(group: pd.DataFrame, train_tokens: float, knee_share: float) -> Answer:
    price = group["price_per_hour"].iloc[0]
    energy = group["energy_price"].iloc[0] if "energy_price" in group else None
    return answer(_points(group), train_tokens, None if pd.isna(price) else float(price), knee_share,
                  None if energy is None or pd.isna(energy) else float(energy))


def knee_sentences(rows: pd.DataFrame, train_tokens: float, knee_share: float) -> list[str]:
    """Per strong-scaling configuration: the node count to rent at this global batch, in days and dollars,
    and why; the fastest and the cheapest where they differ from it."""
    out = []
    strong = rows[rows["scaling"] == "strong"]
    # one answer per configuration: two sweeps, clusters or EFA counts may share a model and a label
    for (model, label, _), group in strong.groupby(["model", "configuration", "configuration_id"],
                                                   sort=False):
        ans = _answer(group.reset_index(drop=True), train_tokens, knee_share)
        at = ans.knee or ans.fastest
        if at is None:  # no node count with a figure
            continue
        text = f"{model}, {label}: {_cost(at, train_tokens)}"
        if ans.knee is None:
            text += "; one node count with a figure: no knee to judge"
        elif ans.knee_beyond:
            text += (f"; every step up to {node_count(at.point.nodes)} buys at least {knee_share:.0%} of the "
                     "time linear scaling would save: the knee lies beyond the planned node counts")
        elif (at.next_share or 0) < 0:
            text += (f"; the next node count is slower at this global batch "
                     f"({_cost(ans.knee_next, train_tokens)})")  # type: ignore[arg-type]
        else:
            after = ans.knee_next
            assert after is not None
            text += (f"; past {node_count(at.point.nodes)} another node buys less than {knee_share:.0%} of "
                     f"the time linear scaling would save ({node_count(after.point.nodes)} buy "
                     f"{at.next_share:.0%}: {_cost(after, train_tokens)})")
        for what, row in (("fastest", ans.fastest), ("cheapest", ans.cheapest)):
            if row is not None and row is not at:
                text += f"; {what}: {_cost(row, train_tokens)}"
        out.append(text)
    return out


def _cost(row: Row, train_tokens: float) -> str:
    """"8 nodes train 1e+12 tokens in 12.3 days, $290,000, predicted (published constants)"."""
    usd = f", ${row.usd:,.0f}" if row.usd is not None else ""
    if row.kwh is not None:  # measured on the GPUs (NVML): their board energy alone
        usd += f", {row.kwh:,.0f} GPU kWh"
        usd += f" (${row.energy_usd:,.0f})" if row.energy_usd is not None else ""
    mark = "" if row.point.source == "measured" else f", {row.point.source}"
    verb = "trains" if row.point.nodes == 1 else "train"
    days = number(row.days)
    return f"{node_count(row.point.nodes)} {verb} {train_tokens:.3g} tokens in {days} days{usd}{mark}"
