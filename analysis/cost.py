"""Cost in the report: per run, per sweep, per million tokens, and the time and money to train N tokens.

Prices are on-demand USD per instance-hour from each sweep's resolved cluster config (sweep.yaml), so a
report prices a sweep as it was planned; `--price` overrides them (one figure, or CLUSTER=USD). A run
costs its measured wall time (start-up included) on all its nodes; failed runs cost money too and are
counted in the sweep totals. Cost per million tokens and time to train use the steady-state tokens/s.
Energy: a configuration's GPU joules per token (the median of its ok runs', measured by NVML over the timed
steps) gives the kWh to train, priced at the sweep's `cluster.energy_price` (USD per kWh).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.scaling import CONFIG
from bench.core import rundir
from bench.predict.budget import days_at, energy_usd, kwh_to_train, usd_to_train

KEYS = CONFIG + ["nodes"]

SWEEP_COLUMNS = ["sweep", "cluster", "price_per_hour", "runs", "instance_hours", "gpu_hours", "usd"]


def _cluster_figures(sweeps: list[Path], key: str) -> dict[str, float | None]:
    """Cluster name -> the number its `cluster.<key>` holds in the sweeps' resolved configs (a later sweep's
    over an earlier one's); None where no sweep sets one. A foreign or unreadable file gives nothing."""
    figures: dict[str, float | None] = {}
    for sweep in sweeps:
        try:
            config = yaml.safe_load((sweep / rundir.SWEEP_CONFIG).read_text())
        except (OSError, yaml.YAMLError):
            continue
        cluster = config.get("cluster") if isinstance(config, dict) else None
        if not isinstance(cluster, dict) or not cluster.get("name"):
            continue
        name, value = str(cluster["name"]), cluster.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        figures[name] = float(value) if ok else figures.get(name)
    return figures


def sweep_prices(sweeps: list[Path]) -> dict[str, float | None]:
    """Cluster name -> price per instance-hour, from the sweeps' resolved configs."""
    return _cluster_figures(sweeps, "price_per_hour")


def sweep_energy_prices(sweeps: list[Path]) -> dict[str, float | None]:
    """Cluster name -> energy price in USD per kWh (cluster.energy_price), from the sweeps' resolved configs;
    None where a sweep sets none."""
    return _cluster_figures(sweeps, "energy_price")


def with_energy(agg: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The aggregated table with each configuration and node count's GPU joules per token (the median of
    its ok training runs'; NaN where none measured it, a CPU study's every row)."""
    if "energy_j_per_token" not in frame or agg.empty:
        return agg.assign(energy_j_per_token=np.nan)
    ok = frame[(frame["kind"] == "train") & (frame["status"] == "ok")].assign(
        energy_j_per_token=lambda f: pd.to_numeric(f["energy_j_per_token"], errors="coerce"))
    energy = ok.groupby(KEYS, dropna=False)["energy_j_per_token"].median().reset_index()
    return agg.drop(columns="energy_j_per_token", errors="ignore").merge(energy, on=KEYS, how="left")


def energy_notes(frame: pd.DataFrame, energy_prices: dict[str, float | None]) -> list[str]:
    """Why a study has no energy figure (its runs say: not measured on a CPU), or no energy cost."""
    train = frame[(frame["kind"] == "train") & (frame["status"] == "ok")]
    if train.empty or "energy_source" not in train:
        return []
    measured = pd.to_numeric(train["energy_j_per_token"], errors="coerce").notna()
    notes = []
    if not measured.all():
        why = train.loc[~measured, "energy_source"].dropna().value_counts()
        reasons = "; ".join(f"{n} run(s): {text}" for text, n in why.items()) or "no reason recorded"
        notes.append(f"energy per token not measured for {int((~measured).sum())} of {len(train)} ok "
                     f"training run(s) ({reasons})")
    unpriced = sorted({str(c) for c in train.loc[measured, "cluster"] if energy_prices.get(c) is None})
    if unpriced:
        notes.append(f"no energy price for cluster(s) {', '.join(unpriced)}: GPU kWh shown, their cost left "
                     "empty (set cluster.energy_price=USD per kWh)")
    return notes


def parse_price_overrides(values: list[str], clusters: list[str]) -> dict[str, float]:
    """`--price 98.32` (every cluster) or `--price p5.48xlarge=98.32`; ValueError on anything else."""
    out: dict[str, float] = {}
    for value in values:
        name, _, usd = value.rpartition("=")
        price = float(usd)
        if price < 0:
            raise ValueError(f"--price {value}: a price cannot be negative")
        out.update({name: price} if name else {c: price for c in clusters})
    return out


def _price(frame: pd.DataFrame, prices: dict[str, float | None]) -> pd.Series:
    return frame["cluster"].map(lambda c: prices.get(c)).astype(float)


def run_costs(frame: pd.DataFrame, prices: dict[str, float | None]) -> pd.DataFrame:
    """Every run's instance-hours and dollars (NaN where its wall time or price is unknown)."""
    out = frame[["run_id", "kind", "status", "wall_s", *KEYS]].copy()
    out["price_per_hour"] = _price(out, prices)
    out["instance_hours"] = out["wall_s"].astype(float) * out["nodes"] / 3600
    out["gpu_hours"] = out["instance_hours"] * out["gpus_per_node"]
    out["usd"] = out["instance_hours"] * out["price_per_hour"]
    return out


def sweep_costs(runs: pd.DataFrame) -> pd.DataFrame:
    """Totals per sweep over all its runs, failed ones included (they were paid for)."""
    if runs.empty:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    return runs.groupby(["sweep", "cluster"], dropna=False).agg(
        price_per_hour=("price_per_hour", "first"), runs=("run_id", "count"),
        instance_hours=("instance_hours", "sum"), gpu_hours=("gpu_hours", "sum"),
        usd=("usd", lambda s: s.sum() if s.notna().all() else np.nan)).reset_index()[SWEEP_COLUMNS]


def config_costs(agg: pd.DataFrame, runs: pd.DataFrame, prices: dict[str, float | None],
                 train_tokens: float, energy_prices: dict[str, float | None] | None = None) -> pd.DataFrame:
    """Per configuration and node count: dollars per run and per million tokens, time and cost to train,
    and where the GPUs' energy was measured (agg's energy_j_per_token: with_energy) its kWh and cost."""
    out = agg[[*KEYS, "tokens_per_s"]].copy()
    out["energy_j_per_token"] = agg["energy_j_per_token"].values if "energy_j_per_token" in agg else np.nan
    out["price_per_hour"] = _price(out, prices)
    train = runs[runs["kind"] == "train"]
    median_usd = train.groupby(KEYS, dropna=False)["usd"].median().rename("usd_per_run").reset_index()
    out = out.merge(median_usd, on=KEYS, how="left")
    hourly = out["price_per_hour"] * out["nodes"]
    out["usd_per_million_tokens"] = hourly / 3600 / out["tokens_per_s"] * 1e6
    out["days_to_train"] = days_at(train_tokens, out["tokens_per_s"])
    out["usd_to_train"] = usd_to_train(out["days_to_train"], out["nodes"], out["price_per_hour"])
    out["energy_price"] = out["cluster"].map(lambda c: (energy_prices or {}).get(c)).astype(float)
    out["kwh_to_train"] = kwh_to_train(train_tokens, out["energy_j_per_token"].astype(float))
    out["energy_usd_to_train"] = [energy_usd(None if pd.isna(k) else k, None if pd.isna(p) else p)
                                  for k, p in zip(out["kwh_to_train"], out["energy_price"])]
    out["energy_usd_to_train"] = out["energy_usd_to_train"].astype(float)
    return out
