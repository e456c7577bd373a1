"""Scaling math on the results table: repeats aggregated, efficiency, ablation gains, NCCL tables.

Scaling efficiency at n nodes = (throughput_n / n) / (throughput_base / base_nodes), base = the smallest
node count with an ok run of the same configuration (docs/report.md, "Where the numbers come from").
Repeats are aggregated by median, with min and max kept as the spread. Only ok runs contribute numbers;
failed runs stay visible in the status table and as a status per configuration, never as zeros.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis.nodes import joined, straggler_cells
from bench.core.schema import COLLECTIVES, RunSpec

# "batch": a weak-scaling run's micro batch ("mb2"), or a strong-scaling run's global batch and accumulation
# mode ("gb1024 sync_each"): at one global batch each node count picks its own micro batch, and the study
# compares them as one configuration (batch_label)
CONFIG = ["sweep", "cluster", "model", "model_config", "gpus_per_node", "sharding", "precision",
          "activation_checkpointing", "wrap_policy", "compile", "offload", "batch", "seq_len",
          "efa_per_node"]
METRICS = {  # column -> how repeats are combined (all by median; spread from min/max)
    "tokens_per_s": "median", "tokens_per_s_per_gpu": "median", "samples_per_s": "median",
    "tflops_per_gpu": "median", "mfu": "median", "hfu": "median", "step_time_s": "median",
    "mem_peak_alloc_gib": "max", "mem_peak_reserved_gib": "max", "nvml_mem_used_gib": "max",
    "mem_rss_gib": "max", "compile_s": "median",
}
PREDICTED = ("pred_mem_gib", "pred_mem_source", "pred_step_time_s", "pred_tokens_per_s_per_gpu", "pred_mfu",
             "pred_scaling_efficiency", "pred_base_tokens_per_s_per_gpu", "pred_bound",
             "pred_source")  # the plan's, one per configuration
ABLATION_FACTORS = [  # (factor, baseline value(s), optimised value): one row per pair that differs in it only
    ("precision", ("fp32",), "bf16_mixed"),
    ("precision", ("bf16_mixed",), "fp8_tensorwise"),
    ("activation_checkpointing", ("none",), "full"),
    ("wrap_policy", ("whole_model",), "transformer_block"),
    ("sharding", ("NO_SHARD", "SHARD_GRAD_OP"), "FULL_SHARD"),
    ("compile", (False,), True),
    ("offload", ("none",), "cpu"),  # a memory trade: the row shows what it costs in tokens/s
]


def train_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return with_batch(frame[frame["kind"] == "train"])


def with_batch(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with CONFIG's "batch" column (a table of before global_batch: every run weak scaling)."""
    if frame.empty:
        return frame.assign(batch=pd.Series(dtype=str), grad_accum=pd.Series(dtype=float))
    global_batch = pd.to_numeric(frame["global_batch"], errors="coerce").fillna(0).astype(int) \
        if "global_batch" in frame else pd.Series(0, index=frame.index)
    micro = pd.to_numeric(frame["micro_batch"], errors="coerce")
    mode = frame["accumulation"] if "accumulation" in frame else "sync_each"
    strong = global_batch > 0
    batch = ("mb" + micro.astype("Int64").astype(str)).where(
        ~strong, "gb" + global_batch.astype(str) + " " + pd.Series(mode, index=frame.index).astype(str))
    accum = (global_batch / (micro * frame["nodes"] * frame["gpus_per_node"])).where(strong, 1.0)
    return frame.assign(batch=batch, global_batch=global_batch, grad_accum=accum)


def aggregate(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration and node count: medians of ok repeats, spread, and run counts."""
    train = train_rows(frame)
    if train.empty:  # a study of probes only: the same columns, no rows
        return pd.DataFrame(columns=[*CONFIG, "nodes", "runs", "ok_runs", "status", *METRICS,
                                     "tokens_per_s_min", "tokens_per_s_max", "step_time_s_std", "straggler",
                                     "base_nodes", "scaling_efficiency", "speedup"])
    keys = CONFIG + ["nodes"]
    ok = train[train["status"] == "ok"]
    out = train.groupby(keys, dropna=False).agg(
        runs=("run_id", "count"), ok_runs=("status", lambda s: int((s == "ok").sum())),
        status=("status", lambda s: "ok" if (s == "ok").all() else ",".join(sorted(set(s)))),
        # what the plan predicted is known for every run, infeasible ones included; the micro batch and
        # accumulation steps a strong-scaling node count ran
        **{c: (c, "first") for c in (*PREDICTED, "micro_batch", "grad_accum", "global_batch")}).reset_index()
    if not ok.empty:
        stats = ok.assign(straggler=straggler_cells(ok)).groupby(keys, dropna=False).agg(
            **{c: (c, how) for c, how in METRICS.items()}, straggler=("straggler", joined),
            tokens_per_s_min=("tokens_per_s", "min"), tokens_per_s_max=("tokens_per_s", "max"),
            step_time_s_std=("step_time_s_std", "median")).reset_index()
        out = out.merge(stats, on=keys, how="left")
    else:
        for c in [*METRICS, "tokens_per_s_min", "tokens_per_s_max", "step_time_s_std", "straggler"]:
            out[c] = np.nan
    return add_efficiency(out).sort_values(keys, ignore_index=True)


def add_efficiency(agg: pd.DataFrame) -> pd.DataFrame:
    """Scaling efficiency and speedup per configuration against its smallest measured node count."""
    agg = agg.copy()
    agg["base_nodes"] = np.nan
    agg["scaling_efficiency"] = np.nan
    agg["speedup"] = np.nan
    for _, idx in agg.groupby(CONFIG, dropna=False).groups.items():
        group = agg.loc[idx]
        measured = group[group["tokens_per_s"].notna()]
        if measured.empty:
            continue
        base = measured.loc[measured["nodes"].idxmin()]
        per_node_base = base["tokens_per_s"] / base["nodes"]
        agg.loc[idx, "base_nodes"] = base["nodes"]
        agg.loc[idx, "scaling_efficiency"] = group["tokens_per_s"] / group["nodes"] / per_node_base
        agg.loc[idx, "speedup"] = group["tokens_per_s"] / base["tokens_per_s"]
    return agg


def missing_baselines(agg: pd.DataFrame) -> list[str]:
    """Configurations whose smallest planned node count has no ok run, in words."""
    notes = []
    for key, group in agg.groupby(CONFIG, dropna=False):
        smallest = group.loc[group["nodes"].idxmin()]
        if pd.isna(smallest["tokens_per_s"]):
            base = group["base_nodes"].dropna()
            where = (f"efficiency is relative to {node_count(base.iloc[0])} instead"
                     if len(base) else "no efficiency can be given")
            notes.append(f"{describe(dict(zip(CONFIG, key)))}: no ok run at "
                         f"{node_count(smallest['nodes'])} ({smallest['status']}); {where}")
    return notes


def describe(config: dict) -> str:
    ac_mode = config["activation_checkpointing"]
    ac = {"none": "no AC", "full": "full AC", "selective": "selective AC"}.get(ac_mode, ac_mode)
    return (f"{config['model']} {config['sharding']} {config['precision']} {ac} "
            f"{config['wrap_policy']}{_options(config)} {config['batch']} s{config['seq_len']}")


def _options(config: dict | pd.Series) -> str:
    """The H100-era options when set: " + compile", " + offload cpu"."""
    return ((" + compile" if config.get("compile") in (True, "True") else "") +
            (f" + offload {config['offload']}" if config.get("offload") not in (None, "none") else ""))


def node_count(nodes: float) -> str:
    """"1 node", "4 nodes": every sentence of the report that names a node count."""
    return f"{int(nodes)} node{'' if nodes == 1 else 's'}"


def spec_of(row: pd.Series) -> RunSpec | None:
    """The run spec a results or plan row holds; None for a row no spec reads (another schema's)."""
    try:
        return RunSpec.from_dict(row.to_dict())
    except (TypeError, ValueError):
        return None


def configuration_label(config: pd.Series) -> str:
    """A configuration as a reader names it: "FULL_SHARD bf16_mixed + full AC"."""
    ac = config["activation_checkpointing"]
    strong = str(config.get("batch", "")).startswith("gb")
    return (f"{config['sharding']} {config['precision']}" + ("" if ac == "none" else f" + {ac} AC") +
            _options(config) + (f", global batch {config['batch'][2:]}" if strong else ""))


def headline(agg: pd.DataFrame) -> tuple[list[str], pd.DataFrame]:
    """The study's answer per model: one sentence a user could paste, and a row per node count of the
    configuration it names (failed node counts included, with their status, never a missing point).

    The named configuration is the one with the most tokens/s at the largest node count any configuration
    of the model ran ok at. Configurations whose largest node count failed are named too.
    """
    sentences: list[str] = []
    rows: list[pd.DataFrame] = []
    if agg.empty:  # a study of probes only
        return sentences, pd.DataFrame()
    agg = agg.assign(tokens_per_s_per_gpu=agg["tokens_per_s"] / (agg["nodes"] * agg["gpus_per_node"]))
    measured = agg[agg["tokens_per_s"].notna()]
    for model, runs in agg.groupby("model", sort=True):
        ok = measured[measured["model"] == model]
        if ok.empty:
            sentences.append(f"{model}: no ok run ({', '.join(sorted(set(runs['status'])))})")
            continue
        top = ok[ok["nodes"] == ok["nodes"].max()]
        best = top.loc[top["tokens_per_s"].idxmax()]
        same = (runs[CONFIG] == best[CONFIG]).all(axis=1)
        series = runs[same].sort_values("nodes")
        good = series[series["tokens_per_s"].notna()]
        first, last = good.iloc[0], good.iloc[-1]
        text = (f"{model}, {configuration_label(best)}: {last['scaling_efficiency']:.0%} scaling efficiency "
                f"from {int(first['nodes'])} to {int(last['nodes'])} nodes, "
                f"{last['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU")
        if pd.notna(last.get("mfu")):
            text += f", MFU {last['mfu']:.2f}"
        failed_above = series[(series["nodes"] > last["nodes"]) & series["tokens_per_s"].isna()]
        for _, f in failed_above.iterrows():
            text += f"; {f['status']} at {node_count(f['nodes'])}"
        sentences.append(text)
        rows.append(series[["model", "nodes", "status", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
                            "mem_peak_alloc_gib", "scaling_efficiency"]].assign(
                                configuration=configuration_label(best)))
        largest = runs["nodes"].max()
        for _, r in runs[(runs["nodes"] == largest) & runs["tokens_per_s"].isna() & ~same].iterrows():
            sentences.append(f"{model}, {configuration_label(r)}: {r['status']} at {node_count(largest)}")
    return sentences, pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


HELD = (("sharding", "{}"), ("precision", "{}"), ("activation_checkpointing", "AC {}"),
        ("wrap_policy", "wrap {}"), ("compile", "compile {}"), ("offload", "offload {}"), ("batch", "{}"),
        ("seq_len", "seq {}"), ("gpus_per_node", "{} GPUs/node"))


def held_fixed(row: pd.Series, factor: str) -> str:
    """What an ablation row holds fixed, every axis but its factor: "FULL_SHARD, AC none, ..., seq 128"."""
    return ", ".join(fmt.format(_plain(row[key])) for key, fmt in HELD if key != factor and key in row)


def _plain(value: object) -> object:
    """A table cell as a reader writes it: 128 for 128.0, on for True."""
    if isinstance(value, (bool, np.bool_)) or value in ("True", "False"):
        return "on" if value in (True, "True") else "off"
    return int(value) if isinstance(value, float) and value.is_integer() else value


def ablation(agg: pd.DataFrame) -> pd.DataFrame:
    """Throughput gain of each optimisation over the run that differs from it in that factor only; each
    row names what it holds fixed, so rows of one factor, model and node count tell apart."""
    rows = []
    keys = CONFIG + ["nodes"]
    measured = agg[agg["tokens_per_s"].notna()]
    index = {tuple(r[k] for k in keys): r for _, r in measured.iterrows()}
    for factor, baselines, optimised in ABLATION_FACTORS:
        pos = keys.index(factor)
        for key, row in index.items():
            if key[pos] != optimised:
                continue
            for baseline in baselines:
                other = index.get(key[:pos] + (baseline,) + key[pos + 1:])
                if other is None:
                    continue
                rows.append({"factor": factor, "baseline": baseline, "optimised": optimised,
                             "model": row["model"], "nodes": row["nodes"],
                             "held_fixed": held_fixed(row, factor),
                             "baseline_tokens_per_s": other["tokens_per_s"],
                             "optimised_tokens_per_s": row["tokens_per_s"],
                             "gain_pct": 100.0 * (row["tokens_per_s"] / other["tokens_per_s"] - 1.0),
                             "baseline_mem_gib": other.get("mem_peak_alloc_gib"),
                             "optimised_mem_gib": row.get("mem_peak_alloc_gib")})
    return pd.DataFrame(rows)


def nccl_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Avg and max bus bandwidth by collective, node count and EFA count (median over ok repeats)."""
    probes = frame[frame["kind"] == "nccl"]
    if probes.empty:
        return pd.DataFrame()
    ok = probes[probes["status"] == "ok"]
    keys = ["sweep", "cluster", "collective", "nodes", "gpus_per_node", "efa_per_node"]
    out = probes.groupby(keys, dropna=False).agg(
        runs=("run_id", "count"), ok_runs=("status", lambda s: int((s == "ok").sum())),
        transport=("nccl_transport", lambda s: ",".join(sorted({str(v) for v in s.dropna()})) or None),
        nics=("extra", _nics)).reset_index()
    if not ok.empty:
        stats = ok.groupby(keys, dropna=False).agg(
            busbw_avg_gbs=("nccl_busbw_avg_gbs", "median"), busbw_max_gbs=("nccl_busbw_max_gbs", "median"),
            busbw_max_gbs_min=("nccl_busbw_max_gbs", "min"), busbw_max_gbs_max=("nccl_busbw_max_gbs", "max"),
            algbw_max_gbs=("nccl_algbw_max_gbs", "median")).reset_index()
        out = out.merge(stats, on=keys, how="left")
    return out


def probe_sentences(probes: pd.DataFrame) -> list[str]:
    """A probe-only study's answer: per node count, what each EFA count gave against TCP (0 EFA), e.g.
    "2 nodes: 4 EFA gave 8.2 GB/s avg bus bandwidth (max 12.1), 8.5x TCP"."""
    if probes.empty or "busbw_avg_gbs" not in probes:
        return []
    ok = probes[probes["busbw_avg_gbs"].notna() & (probes["nodes"] > 1)
                & (probes["collective"] == "all_reduce")]
    sentences = []
    for nodes, rows in ok.groupby("nodes"):
        rows = rows.groupby("efa_per_node", as_index=False)[["busbw_avg_gbs", "busbw_max_gbs"]].median()
        tcp = rows[rows["efa_per_node"] == 0]["busbw_avg_gbs"]
        parts = []
        for r in rows.sort_values("efa_per_node", ascending=False).itertuples():
            text = (f"{int(r.efa_per_node)} EFA gave {r.busbw_avg_gbs:.1f} GB/s avg bus bandwidth "
                    f"(max {r.busbw_max_gbs:.1f})")
            if r.efa_per_node and not tcp.empty and tcp.iloc[0] > 0:
                text += f", {r.busbw_avg_gbs / tcp.iloc[0]:.1f}x TCP"
            parts.append(text)
        sentences.append(f"{node_count(nodes)}: " + "; ".join(parts))
    return sentences


def _nics(extras: pd.Series) -> str | None:
    """The NIC counts NCCL reported ("found N nics"), as found across a group's runs."""
    found = set()
    for extra in extras.dropna():
        nics = (json.loads(extra) if isinstance(extra, str) else {}).get("nics")
        if nics is not None:
            found.add(int(nics))
    return ",".join(map(str, sorted(found))) or None


def nccl_sizes(frame: pd.DataFrame) -> pd.DataFrame:
    """Bus bandwidth per message size (median over repeats and placements) by collective, nodes and EFA
    count."""
    rows = []
    for _, r in frame[(frame["kind"] == "nccl") & (frame["status"] == "ok")].iterrows():
        extra = json.loads(r["extra"]) if isinstance(r.get("extra"), str) else {}
        for s in extra.get("sizes", []):
            rows.append({"collective": r["collective"], "nodes": r["nodes"],
                         "efa_per_node": r["efa_per_node"],
                         "size_bytes": s["size"], "busbw_gbs": s["busbw"], "algbw_gbs": s["algbw"],
                         "time_us": s["time_us"]})
    if not rows:
        return pd.DataFrame(columns=["collective", "nodes", "efa_per_node", "size_bytes", "busbw_gbs",
                                     "algbw_gbs", "time_us"])
    sizes = pd.DataFrame(rows)
    return sizes.groupby(["collective", "nodes", "efa_per_node", "size_bytes"], as_index=False).median()


def status_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Every run that is not ok, with its error line; ok runs are counted in the header."""
    cols = ["sweep", "kind", "model", "nodes", "sharding", "precision", "activation_checkpointing", "status",
            "error", "run_id"]
    bad = frame[frame["status"] != "ok"][cols].copy()
    bad["error"] = bad["error"].fillna("").astype(str).str.slice(0, 200)
    return bad.sort_values(["status", "sweep", "model", "nodes"], ignore_index=True)


def restart_notes(frame: pd.DataFrame) -> list[str]:
    """One sentence per study whose runs started again after they began (a Slurm job requeued after
    NODE_FAIL, a torchrun restart): how many runs, how many restarts, which nodes Slurm held failed, and the
    wall time from each run's first start to its last, which the restarts cost."""
    if "restarts" not in frame.columns:
        return []
    notes = []
    for sweep, runs in frame[pd.to_numeric(frame["restarts"], errors="coerce") > 0].groupby("sweep"):
        nodes: dict[str, str] = {}
        for extra in runs["extra"].dropna():
            for run in json.loads(extra).get("executions", []):
                nodes.update(run.get("failed_nodes") or {})
        lost_s = pd.to_numeric(runs["restart_lost_s"], errors="coerce")
        lost, node_hours = lost_s.sum(), (lost_s * runs["nodes"]).sum() / 3600
        where = "; ".join(f"{node} ({why})" for node, why in sorted(nodes.items())) or "no node named"
        restarts = int(pd.to_numeric(runs["restarts"]).sum())
        notes.append(f"{sweep}: {len(runs)} run(s) restarted {restarts} time(s) after they began (failed "
                     f"nodes: {where}), costing {lost / 60:.1f} min of wall time and {node_hours:.2f} "
                     "node-hours before their last start; each execution is in the run's ledger.json and "
                     "summary")
    return notes


def sizes_by_column(sizes: pd.DataFrame) -> pd.DataFrame:
    """Bus bandwidth per message size, one column per collective, node and EFA count (all-reduce's first,
    unprefixed)."""
    table = sizes.pivot_table(index="size_bytes", columns=["collective", "nodes", "efa_per_node"],
                              values="busbw_gbs")
    table = table[sorted(table.columns, key=lambda c: (COLLECTIVES.index(c[0]), c[1], c[2]))]
    table.columns = [("" if c == "all_reduce" else f"{c.replace('_', '-')} ")
                     + f"busbw (GB/s) {int(n)} nodes {int(e)} EFA" for c, n, e in table.columns]
    return table.reset_index().rename(columns={"size_bytes": "size (B)"})


def efa_table(probes: pd.DataFrame) -> pd.DataFrame:
    """One row per node, GPU and EFA count, the collectives' bus bandwidths side by side (median over ok
    repeats; all-reduce's columns unsuffixed, the others suffixed with their name)."""
    keys = ["nodes", "gpus_per_node", "efa_per_node"]
    if probes.empty:
        return probes
    joined = probes.groupby(keys, dropna=False).agg(
        transport=("transport", lambda s: ",".join(sorted({str(v) for v in s.dropna()})) or None),
        nics=("nics", lambda s: ",".join(sorted({str(v) for v in s.dropna()})) or None),
        ok_runs=("ok_runs", "sum")).reset_index()
    for collective in COLLECTIVES:
        of = probes[probes["collective"] == collective]
        if of.empty or "busbw_avg_gbs" not in of:
            continue
        suffix = "" if collective == "all_reduce" else f"_{collective}"
        part = of.groupby(keys, dropna=False)[["busbw_avg_gbs", "busbw_max_gbs"]].median().reset_index()
        part = part.rename(columns={"busbw_avg_gbs": f"busbw_avg_gbs{suffix}",
                                    "busbw_max_gbs": f"busbw_max_gbs{suffix}"})
        joined = joined.merge(part, on=keys, how="left")
    return joined.sort_values(keys, ignore_index=True)
