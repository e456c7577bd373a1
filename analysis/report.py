"""`python -m analysis.report PATH [--out DIR]`: tables and charts from a results root or one sweep dir.

Writes report.md, report.html (tables and charts together), one CSV per table and PNG+SVG charts to
DIR (default PATH/report). Missing or broken input gives one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import matplotlib
import pandas as pd

from analysis import plots, system
from analysis.comm import achieved, achieved_sentences, comm_model
from analysis.cost import (
    config_costs,
    energy_notes,
    parse_price_overrides,
    run_costs,
    sweep_costs,
    sweep_energy_prices,
    sweep_prices,
    with_energy,
)
from analysis.definitions import DEFINITIONS
from analysis.load import Loaded, NoResults, load
from analysis.nodes import preflight_table, straggler_notes
from analysis.parity import departures, loss_parity
from analysis.predicted import (
    extrapolation_sentence,
    extrapolation_table,
    largest_miss,
    memory_notes,
    memory_table,
    throughput_table,
)
from analysis.render import markdown, page_html
from analysis.scaling import (
    CONFIG,
    ablation,
    aggregate,
    configuration_label,
    headline,
    missing_baselines,
    nccl_sizes,
    nccl_summary,
    probe_sentences,
    restart_notes,
    status_table,
)
from analysis.split import COLUMNS as SPLIT_COLUMNS, charted, lost_sentences, split_table
from analysis.strong import COLUMNS as STRONG_COLUMNS, knee_sentences, strong_rows, sweep_study
from bench.core.hardware import compute_dtype, gpu_spec
from bench.core.schema import ADDED_DEFAULTS, COLLECTIVES
from bench.predict.budget import DEFAULT_KNEE_SHARE, DEFAULT_TRAIN_TOKENS, check_knee_share

# What each MFU was divided by, beside it: the GPU's dense peak for the run's compute dtype (no 2:4 sparsity)
MFU_PEAK = "MFU of (dense peak TFLOPS/GPU)"
SCALING_COLUMNS = {
    "sweep": "sweep", "model": "model", "sharding": "sharding", "precision": "precision",
    "activation_checkpointing": "AC", "wrap_policy": "wrap", "compile": "compile", "offload": "offload",
    "batch": "batch", "micro_batch": "micro batch", "seq_len": "seq len", "gpus_per_node": "GPUs/node",
    "nodes": "nodes", "status": "status", "compile_s": "compile time (s)",
    "ok_runs": "ok runs", "tokens_per_s": "tokens/s", "tokens_per_s_min": "tokens/s min",
    "tokens_per_s_max": "tokens/s max", "samples_per_s": "samples/s", "tflops_per_gpu": "TFLOPS/GPU",
    "mfu": "MFU", "mfu_peak": MFU_PEAK, "hfu": "HFU", "step_time_s": "step time (s)",
    "step_time_s_std": "step time std (s)",
    "mem_peak_alloc_gib": "peak alloc (GiB/GPU)", "mem_peak_reserved_gib": "peak reserved (GiB/GPU)",
    "nvml_mem_used_gib": "NVML used (GiB/GPU)", "mem_rss_gib": "host RSS (GiB/proc)",
    "pred_mem_gib": "predicted (GiB/GPU)", "scaling_efficiency": "scaling efficiency",
    "base_nodes": "base nodes",
}
# What a reader compares; the full-width table stays in scaling.csv.
SCALING_SHORT = {"model": "model", "sharding": "sharding", "precision": "precision",
                 "activation_checkpointing": "AC", "compile": "compile", "offload": "offload",
                 "batch": "batch", "gpus_per_node": "GPUs/node", "nodes": "nodes",
                 "tokens_per_s_per_gpu": "tokens/s/GPU", "mfu": "MFU", "mfu_peak": MFU_PEAK,
                 "mem_peak_alloc_gib": "peak alloc (GiB/GPU)",
                 "mem_rss_gib": "host RSS (GiB/proc)", "scaling_efficiency": "scaling efficiency",
                 "straggler": "straggler", "status": "status"}
HEADLINE_COLUMNS = {"model": "model", "configuration": "configuration", "nodes": "nodes",
                    "tokens_per_s_per_gpu": "tokens/s/GPU", "tflops_per_gpu": "TFLOPS/GPU", "mfu": "MFU",
                    "mfu_peak": MFU_PEAK, "mem_peak_alloc_gib": "peak alloc (GiB/GPU)",
                    "scaling_efficiency": "scaling efficiency",
                    "straggler": "straggler", "status": "status"}
# The EFA table: each collective's bus bandwidth side by side (all-reduce's columns keep their names)
EFA_COLUMNS = {"nodes": "nodes", "gpus_per_node": "GPUs/node", "efa_per_node": "EFA adapters",
               "transport": "transport (NCCL)", "nics": "NICs found", "busbw_avg_gbs": "avg busbw (GB/s)",
               "busbw_max_gbs": "max busbw (GB/s)",
               "busbw_avg_gbs_all_gather": "all-gather avg busbw (GB/s)",
               "busbw_max_gbs_all_gather": "all-gather max busbw (GB/s)",
               "busbw_avg_gbs_reduce_scatter": "reduce-scatter avg busbw (GB/s)",
               "busbw_max_gbs_reduce_scatter": "reduce-scatter max busbw (GB/s)", "ok_runs": "ok runs"}
ABLATION_COLUMNS = {"factor": "factor", "baseline": "baseline", "optimised": "optimised", "model": "model",
                    "nodes": "nodes", "held_fixed": "held fixed",
                    "baseline_tokens_per_s": "baseline tokens/s",
                    "optimised_tokens_per_s": "optimised tokens/s",
                    "gain_pct": "gain (%)", "baseline_mem_gib": "baseline mem (GiB/GPU)",
                    "optimised_mem_gib": "optimised mem (GiB/GPU)"}
NCCL_COLUMNS = {"sweep": "sweep", "cluster": "cluster", "collective": "collective", "nodes": "nodes",
                "gpus_per_node": "GPUs/node",
                "efa_per_node": "EFA/node", "runs": "runs", "ok_runs": "ok runs", "transport": "transport",
                "busbw_avg_gbs": "avg busbw (GB/s)", "busbw_max_gbs": "max busbw (GB/s)",
                "busbw_max_gbs_min": "max busbw min (GB/s)", "busbw_max_gbs_max": "max busbw max (GB/s)",
                "algbw_max_gbs": "max algbw (GB/s)"}
# What the page shows of it (at most 8 columns; nccl.csv keeps every one)
NCCL_SHORT = {"collective": "collective", "nodes": "nodes", "gpus_per_node": "GPUs/node",
              "efa_per_node": "EFA/node",
              "transport": "transport", "ok_runs": "ok runs", "busbw_avg_gbs": "avg busbw (GB/s)",
              "busbw_max_gbs": "max busbw (GB/s)"}
PARITY_COLUMNS = {"model": "model", "nodes": "nodes", "precision": "precision", "reference": "reference run",
                  "run": "run", "steps_compared": "steps compared",
                  "max_rel_deviation": "max relative deviation", "tolerance": "tolerance",
                  "verdict": "verdict"}
COMM_COLUMNS = {"sweep": "sweep", "model": "model", "sharding": "sharding", "precision": "precision",
                "activation_checkpointing": "AC", "nodes": "nodes", "comm_gb_per_gpu": "comm (GB/GPU/step)",
                "busbw_gbs": "busbw used (GB/s)", "busbw_all_gather_gbs": "all-gather busbw (GB/s)",
                "busbw_reduce_scatter_gbs": "reduce-scatter busbw (GB/s)",
                "busbw_all_reduce_gbs": "all-reduce busbw (GB/s)", "fed_by": "probes used",
                "comm_s": "modelled comm (s)",
                "step_time_s": "step time (s)", "comm_fraction": "comm / step",
                "lost_s": "step time lost vs base (s)", "comm_growth_s": "comm growth vs base (s)",
                "verdict": "verdict"}
ACHIEVED_COLUMNS = {"model": "model", "sharding": "sharding", "nodes": "nodes", "efa_per_node": "EFA/node",
                    "kind": "collective", "ranks": "group ranks", "message_bytes": "bytes per call",
                    "achieved_busbw_gbs": "busbw (GB/s)",
                    "probe_busbw_gbs": "probe busbw (GB/s)", "share": "of the probe", "probe": "probe",
                    "probe_placement": "probe over (nodes x GPUs)", "run_id": "run"}
COMM_SHORT = {"model": "model", "sharding": "sharding", "nodes": "nodes",
              "fed_by": "probes used", "comm_s": "modelled comm (s)",
              "step_time_s": "step time (s)", "comm_fraction": "comm / step",
              "verdict": "verdict"}  # comm_model.csv keeps every column
MEMORY_COLUMNS = {"model": "model", "configuration": "configuration", "placement": "nodes x GPUs",
                  "pred_mem_gib": "predicted (GiB/GPU)",
                  "mem_peak_alloc_gib": "measured peak alloc (GiB/GPU)",
                  "mem_error": "error", "reserved_ratio": "reserved / allocated",
                  "outside_allocator_gib": "NVML - reserved (GiB)"}
PREDICTED_COLUMNS = {"model": "model", "configuration": "configuration", "placement": "nodes x GPUs",
                     "pred_tokens_per_s_per_gpu": "predicted tokens/s/GPU",
                     "tokens_per_s_per_gpu": "measured tokens/s/GPU", "error": "error",
                     "pred_scaling_efficiency": "predicted efficiency (of the base, predicted with)",
                     "scaling_efficiency": "measured efficiency"}
EXTRAPOLATION_COLUMNS = {"sweep": "sweep", "label": "run", "base_nodes": "calibrated at nodes",
                         "nodes": "nodes", "predicted": "predicted tokens/s/GPU",
                         "measured": "measured tokens/s/GPU", "error": "error"}
TRAIN_TOKENS = DEFAULT_TRAIN_TOKENS
DEFINITIONS_ADDED = """\
- **MFU's denominator** is named beside every MFU ("989.4 dense bf16 (H100-SXM)"): the datasheet's dense
  peak, never the 2:4-sparse figure twice as large.
- **GPU energy**: every GPU's joules over the timed steps, from NVML's energy counter (millijoules since the
  driver loaded) read as the first timed step begins and after the last one's sync, else its power samples
  integrated (the run's energy_source says which), over the tokens the run trained in them; the board's
  energy only (hosts, network and cooling are not in it). kWh to train = tokens x J/token / 3.6e6; its cost
  at cluster.energy_price (USD per kWh). A CPU run: not measured.
- **System**: each node's facts as its worker read them at start (bench/core/system.py: GPU, driver, CUDA,
  NCCL, libfabric, aws-ofi-nccl, RDMA devices, topology, instance type, image, versions, git); a study whose
  nodes are not one system says so first, because its efficiency then mixes machines.
"""
WEAK_COLUMNS = {**STRONG_COLUMNS, "efficiency": "scaling efficiency"}  # no next share: no knee
del WEAK_COLUMNS["next_step"], WEAK_COLUMNS["grad_accum"]
COST_COLUMNS = {"sweep": "sweep", "model": "model", "sharding": "sharding", "precision": "precision",
                "activation_checkpointing": "AC", "nodes": "nodes",
                "price_per_hour": "price (USD/instance-h)", "tokens_per_s": "tokens/s",
                "usd_per_run": "USD per run", "usd_per_million_tokens": "USD per 1M tokens",
                "days_to_train": "days to train", "usd_to_train": "USD to train",
                "energy_j_per_token": "GPU J/token", "energy_price": "energy price (USD/kWh)",
                "kwh_to_train": "GPU kWh to train", "energy_usd_to_train": "energy USD to train"}
SWEEP_COST_COLUMNS = {"sweep": "sweep", "cluster": "cluster", "price_per_hour": "price (USD/instance-h)",
                      "runs": "runs", "instance_hours": "instance-hours", "gpu_hours": "GPU-hours",
                      "usd": "USD"}
FIGURES = {
    "throughput_vs_nodes": ("Throughput vs nodes", plots.throughput_vs_nodes, "agg"),
    "efficiency_vs_nodes": ("Scaling efficiency vs nodes", plots.efficiency_vs_nodes, "agg"),
    "tflops_per_config": ("TFLOPS per GPU", plots.tflops_per_config, "agg"),
    "memory_vs_nodes": ("Memory per GPU vs nodes", plots.memory_vs_nodes, "agg"),
    "busbw_vs_size": ("All-reduce bus bandwidth vs message size", plots.busbw_vs_size, "sizes"),
    "estimate_vs_measured": ("Memory: predicted vs measured", plots.estimate_vs_measured, "agg"),
    "step_split": ("Where the step went, from each run's profiler trace", plots.split_chart, "split"),
    "step_split_all": ("Where the step went, every configuration", plots.split_chart, "split_all"),
}


def _present(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    keep = [c for c in columns if c in frame.columns and (frame[c].notna().any() or c in ("status",))
            and not (c in ADDED_DEFAULTS and (frame[c] == ADDED_DEFAULTS[c]).all())]  # never varied
    return frame[keep].rename(columns=columns)


def _with_base(shown: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """The predicted efficiency as the page reads it, with what it came from: "47% of 2,145 (this study's 1
    runs)", the base node count's tokens/s/GPU and the constants of the same prediction."""
    cells = [None if pd.isna(eff) else f"{eff:.0%}" + ("" if pd.isna(base) else f" of {base:,.0f}")
             + ("" if pd.isna(source) else f" ({source})")
             for eff, base, source in zip(predicted["pred_scaling_efficiency"],
                                          predicted["pred_base_tokens_per_s_per_gpu"],
                                          predicted["pred_source"])]
    return shown.assign(pred_scaling_efficiency=cells)


def _percent(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """Ratios as a reader takes them on the page ("+35%", "98%"); the CSVs keep the numbers."""
    out = frame.copy()
    for c in (c for c in columns if c in frame):
        signed = c.endswith("error")
        out[c] = [None if pd.isna(v) else (f"{v:+.0%}" if signed else f"{v:.0%}") for v in frame[c]]
    return out


def _sizes_by_column(sizes: pd.DataFrame) -> pd.DataFrame:
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


def study_kinds(frame: pd.DataFrame) -> str:
    """Per sweep, weak scaling (a micro batch per GPU, the global batch growing with the nodes) or strong
    (one global batch at every node count), or both where a sweep holds both kinds of run."""
    train = frame[frame["kind"] == "train"]
    kinds = []
    for sweep, runs in train.groupby("sweep"):
        batches = sorted({int(b) for b in runs["global_batch"].fillna(0)})
        named = [f"strong at global batch {b}" if b else "weak" for b in batches]
        kinds.append(f"{sweep} {' and '.join(named)}")
    return "; ".join(kinds) or "no training runs"


def with_mfu_peak(agg: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """Each configuration and node count's MFU denominator as the page names it beside the figure: the
    peak its ok runs divided by (peak_tflops_per_gpu), "989.4 dense bf16 (H100-SXM)"; None on a CPU."""
    keys = [*CONFIG, "nodes"]
    ok = (frame["kind"] == "train") & (frame["status"] == "ok")
    runs = frame[ok & frame["peak_tflops_per_gpu"].notna()]
    if runs.empty or agg.empty:
        return agg.assign(mfu_peak=None)
    labels = runs.assign(mfu_peak=[peak_label(p, d, q) for p, d, q in zip(
        runs["peak_tflops_per_gpu"], runs["device_name"], runs["precision"])])
    peaks = labels.groupby(keys, dropna=False)["mfu_peak"].agg(lambda s: ", ".join(sorted(set(s))))
    peaks = peaks.reset_index()
    return agg.drop(columns="mfu_peak", errors="ignore").merge(peaks, on=keys, how="left")


def _best_peak(best: pd.DataFrame, agg: pd.DataFrame) -> pd.DataFrame:
    """The headline rows with their MFU's denominator (headline() keeps a few columns of agg)."""
    if best.empty or "mfu_peak" not in agg:
        return best
    peaks = agg.assign(configuration=agg.apply(configuration_label, axis=1) if len(agg) else None)
    peaks = peaks[["model", "configuration", "nodes", "mfu_peak"]].drop_duplicates(
        ["model", "configuration", "nodes"])
    return best.merge(peaks, on=["model", "configuration", "nodes"], how="left")


def peak_label(peak: float, device: object, precision: str) -> str:
    """"989.4 dense bf16 (H100-SXM)": the TFLOPS an MFU was divided by, its dtype and the GPU's table row."""
    spec = gpu_spec(str(device)) if isinstance(device, str) else None
    return f"{float(peak):g} dense {compute_dtype(precision)}" + (f" ({spec.name})" if spec else "")


def mfu_sentence(frame: pd.DataFrame) -> list[str]:
    """On the first screen, beside the MFU it quotes: what every MFU of the study was divided by."""
    runs = frame[(frame["kind"] == "train") & (frame["status"] == "ok") & frame["mfu"].notna()
                 & frame["peak_tflops_per_gpu"].notna()]
    if runs.empty:
        return []
    peaks = sorted({peak_label(p, d, q) for p, d, q in zip(runs["peak_tflops_per_gpu"], runs["device_name"],
                                                            runs["precision"])})
    return [f"MFU is model TFLOPS/GPU over the GPU's dense peak (no 2:4 sparsity; bench/core/hardware.py): "
            f"{'; '.join(p.replace(' dense', ' TFLOPS') for p in peaks)}"]


def system_tables(frame: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], list[str], list[str], pd.DataFrame]:
    """Per study, its table of distinct systems and of the environment its runs saw; the first screen's
    lines for studies that span systems; the section's notes; every node's facts (system.csv)."""
    studies = system.studies(frame)
    tables: dict[str, pd.DataFrame] = {}
    first, notes = [], []
    for sweep, study in studies.items():
        if study.nodes:
            tables[f"system_{sweep}"] = system.system_table(study)
            tables[f"system_env_{sweep}"] = system.env_table(study)
        first += [line for line in [system.spans(sweep, study)] if line]
        notes += system.system_notes(sweep, study)
    return tables, first, notes, system.node_table(studies)


def provenance(frame: pd.DataFrame) -> list[str]:
    def values(column: str) -> str:
        found = sorted({str(v) for v in frame[column].dropna().unique()}) if column in frame else []
        return ", ".join(found[:8]) + (" ..." if len(found) > 8 else "") if found else "unknown"
    return [f"sweeps: {values('sweep')}", f"scaling: {study_kinds(frame)}", f"clusters: {values('cluster')}",
            f"devices: {values('device_name')}",
            f"torch: {values('torch_version')}", f"git revision: {values('git_rev')}",
            f"hosts: {values('host')}", f"node counts: {values('nodes')}",
            f"runs: {len(frame)} "
            f"({', '.join(f'{k} {v}' for k, v in frame['status'].value_counts().items())})",
            f"generated: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}"]


def build(loaded: Loaded, out: Path, prices: dict[str, float] | None = None,
          train_tokens: float | None = None, knee_share: float | None = None) -> Path:
    """Write every table, chart and the two report pages; returns the Markdown path.

    prices override the sweeps' own price_per_hour by cluster name; train_tokens the study's
    study.train_tokens (default TRAIN_TOKENS); knee_share its study.knee_share.
    """
    out.mkdir(parents=True, exist_ok=True)
    frame = loaded.frame
    agg = with_mfu_peak(with_energy(aggregate(frame), frame), frame)
    energy_prices = sweep_energy_prices(loaded.sweeps)
    parity = loss_parity(frame)
    price_table = {**sweep_prices(loaded.sweeps), **(prices or {})}
    runs_cost = run_costs(frame, price_table)
    study = sweep_study(loaded.sweeps)
    train_tokens = train_tokens or study.get("train_tokens") or TRAIN_TOKENS
    knee_share = knee_share or study.get("knee_share", DEFAULT_KNEE_SHARE)
    answers = strong_rows(agg, price_table, train_tokens, knee_share, loaded.plan, energy_prices)
    strong, weak = answers[answers["scaling"] == "strong"], answers[answers["scaling"] == "weak"]
    sentences, best = headline(agg)
    best = _best_peak(best, agg)
    systems, spanning, system_notes, nodes = system_tables(frame)
    sentences = spanning + knee_sentences(answers, train_tokens, knee_share) + sentences + mfu_sentence(frame)
    probes = nccl_summary(frame)
    sentences = sentences or probe_sentences(probes)  # a probe-only study: what each EFA count gave
    split = split_table(frame)
    sentences = sentences + (lost_sentences(split) if not split.empty else [])
    answered = [t[["model", "configuration"]] for t in (best, strong) if not t.empty]
    named = pd.concat(answered) if answered else pd.DataFrame(columns=["model", "configuration"])
    shown = charted(split, named)  # the chart: the configurations the answer names, where there are many
    rest = split if len(shown) < len(split) else pd.DataFrame()
    one_rank = probes[probes["nodes"] * probes["gpus_per_node"] == 1] if not probes.empty else probes
    tables = {"headline": _present(_percent(best, "scaling_efficiency"), HEADLINE_COLUMNS),
              "efa": _present(efa_table(probes.drop(one_rank.index)), EFA_COLUMNS),
              "scaling": _present(agg, SCALING_COLUMNS),
              "scaling_short": _present(_percent(agg, "scaling_efficiency"), SCALING_SHORT),
              "ablation": _present(ablation(agg), ABLATION_COLUMNS),
              "nccl": _present(probes, NCCL_COLUMNS), "nccl_short": _present(probes, NCCL_SHORT),
              "status": status_table(frame),
              "loss_parity": parity.rename(columns=PARITY_COLUMNS),
              "cost_sweeps": _present(sweep_costs(runs_cost), SWEEP_COST_COLUMNS),
              "cost": _present(config_costs(agg, runs_cost, price_table, train_tokens, energy_prices),
                               COST_COLUMNS).rename(columns=_budget_names(train_tokens))}
    budget = _budget_names(train_tokens)
    if not strong.empty:  # the CSV keeps the numbers, the page the percentages
        tables["strong"] = _present(strong, STRONG_COLUMNS).rename(columns=budget)
        tables["strong_short"] = _present(_percent(strong, "efficiency"),
                                          STRONG_COLUMNS).rename(columns=budget)
    if not weak.empty:
        tables["weak"] = _present(weak, WEAK_COLUMNS).rename(columns=budget)
        tables["weak_short"] = _present(_percent(weak, "efficiency"), WEAK_COLUMNS).rename(columns=budget)
    runs_cost.to_csv(out / "cost_runs.csv", index=False)
    sizes = nccl_sizes(frame)
    if not sizes.empty:
        tables["nccl_sizes"] = _sizes_by_column(sizes)
        most = sizes[sizes["nodes"] == sizes["nodes"].max()]
        if most["collective"].nunique() > 1:  # the collectives side by side at the most adapters
            most = most[most["efa_per_node"] == most["efa_per_node"].max()]
        tables["nccl_sizes_short"] = _sizes_by_column(most).iloc[:, :8]  # the page: size + at most 7 columns
    preflight, preflight_notes = preflight_table(loaded.sweeps)
    if not preflight.empty:
        tables["preflight"] = preflight
    memory, predicted = memory_table(agg), throughput_table(agg)  # every column in memory.csv, predicted.csv
    extrapolated, unreadable = extrapolation_table(loaded.sweeps)
    if not extrapolated.empty:
        tables["extrapolation"] = _present(_percent(extrapolated, "error"), EXTRAPOLATION_COLUMNS)
    if not memory.empty:
        tables["memory"] = memory
        tables["memory_short"] = _present(_percent(memory, "mem_error"), MEMORY_COLUMNS)
    if not predicted.empty:
        tables["predicted"] = predicted
        tables["predicted_short"] = _present(_with_base(_percent(predicted, "error", "scaling_efficiency"),
                                                        predicted), PREDICTED_COLUMNS)
    comm = comm_model(agg, sizes) if not sizes.empty else pd.DataFrame()
    if not comm.empty:
        tables["comm_model"] = _present(comm, COMM_COLUMNS)
        tables["comm_model_short"] = _present(comm, COMM_SHORT)
    got = achieved(frame, sizes) if not sizes.empty else pd.DataFrame()
    if not got.empty:
        tables["network_achieved"] = _present(_percent(got, "share"), ACHIEVED_COLUMNS)
    if not split.empty:
        tables["step_split"] = _present(_percent(split, "exposed_comm_error"), SPLIT_COLUMNS)
    tables.update(systems)
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    if not nodes.empty:
        nodes.to_csv(out / "system.csv", index=False)
    charts = {}
    for name, (title, make, source) in FIGURES.items():
        fig = make({"agg": agg, "sizes": sizes, "split": shown, "split_all": rest}[source])
        if fig is not None:
            fig.savefig(out / f"{name}.png", dpi=110)
            fig.set_layout_engine("none")  # keep the layout the PNG computed: the SVG need not redo it
            with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: searchable, selectable
                fig.savefig(out / f"{name}.svg", dpi=110)
            charts[name] = title
    cpu = frame["device_name"].fillna("").eq("cpu").any()
    notes = (loaded.notes + missing_baselines(agg) + departures(parity) + memory_notes(memory)
             + largest_miss(predicted, cpu) + extrapolation_sentence(extrapolated) + restart_notes(frame)
             + straggler_notes(frame) + preflight_notes + unreadable + achieved_sentences(got)
             + energy_notes(frame, energy_prices))
    if not one_rank.empty:
        notes.append(f"{len(one_rank)} one-rank all-reduce probe(s) measured no network (bus bandwidth is 0 "
                     "by definition on one rank): left out of the EFA table, kept in nccl.csv")
    unpriced = sorted(c for c in frame["cluster"].dropna().unique() if price_table.get(c) is None)
    if unpriced:
        notes.append(f"no price for cluster(s) {', '.join(map(str, unpriced))}: costs are left empty "
                     "(set cluster.price_per_hour in the sweep, or pass --price USD to the report)")
    sections = _sections(frame, tables, charts, notes, sentences, system_notes)
    md = out / "report.md"
    md.write_text(markdown(sections))
    (out / "report.html").write_text(page_html(sections, out))
    return md


def _budget_names(train_tokens: float) -> dict[str, str]:
    """The budget's columns as the page titles them, with the token budget they are for."""
    return {name: f"{name} {train_tokens:.3g} tokens" for name in (
        "days to train", "USD to train", "GPU kWh to train", "energy USD to train")}


def _sections(frame: pd.DataFrame, tables: dict[str, pd.DataFrame], charts: dict[str, str],
              notes: list[str], sentences: list[str], system_notes: list[str] | None = None,
              ) -> list[tuple[str, object]]:
    """The answer first (sentence, its configuration per node count, the throughput chart, the EFA table),
    then the details, then how the numbers are defined and where they come from."""
    ok = int((frame["status"] == "ok").sum())
    sections: list[tuple[str, object]] = []
    if sentences:
        sections.append(("The answer" if len(frame) else "The answer, predicted: nothing has run yet (the "
                         "plan's prediction, plan.csv)", sentences))
    if "strong" in tables:
        sections.append(("Strong scaling: one global batch at every node count, days and dollars to train "
                         "(predicted where a node count has no ok run: each row's source says from what; the "
                         "knee is where the next node count buys less than the study's knee_share of a "
                         "linear gain)", tables["strong_short"]))
    if not tables["headline"].empty:
        sections.append(("Best configuration at each node count", tables["headline"]))
    if "weak" in tables:
        sections.append(("Weak scaling: days and dollars to train at the global batch each node count trains "
                         "(micro batch x ranks; predicted where a node count has no ok run). No knee: the "
                         "batch grows with the node count, so a step up changes what a step trains, and a "
                         "larger batch may need more tokens to reach the same loss", tables["weak_short"]))
    if "throughput_vs_nodes" in charts:
        sections.append((charts["throughput_vs_nodes"], ("chart", "throughput_vs_nodes")))
    if "step_split" in tables:
        sections.append(("Where the step went (seconds per step from each run's profiler trace, scaled to "
                         "its measured step; waiting read from the ranks' arrival times where a collective's "
                         "group shares a host clock, else by the duration rule, whose reading is beside it: "
                         "the duration rule column says where the two are apart by more than 2% of the step "
                         "or the durations contradict its premise; the model's exposed communication beside "
                         "the measured)", tables["step_split"]))
    if "step_split" in charts:
        sections.append((charts["step_split"], ("chart", "step_split")))
    if "step_split_all" in charts:  # many configurations: the chart above draws those the answer names
        sections.append((charts["step_split_all"], "The chart above draws the configurations the answer "
                         "names; every configuration's: [step_split_all.png](step_split_all.png) (its "
                         "figures in step_split.csv)\n"))
    if not tables["efa"].empty:
        sections.append(("Collective bandwidth by EFA adapters: all-reduce, all-gather, reduce-scatter",
                         tables["efa"]))
    if notes:
        sections.append(("Notes", notes))
    if ok == 0 and len(frame):
        sections.append(("No successful runs", ["every run failed or was pruned: see the run status table"]))
    sections.append(("Scaling (per configuration and node count; every column in scaling.csv)",
                     tables["scaling_short"]))
    if "predicted" in tables:
        sections.append(("Throughput: predicted before launch vs measured (each row's predicted figures are "
                         "the one prediction its run launched with, its efficiency against the base node "
                         "count's tokens/s/GPU in that prediction; MFU, bound and step times in "
                         "predicted.csv)", tables["predicted_short"]))
    if "extrapolation" in tables:
        sections.append(("Extrapolation: each run above the smallest node count, predicted from the smallest "
                         "node count's runs alone (the study's calibration, bench/predict/calibrate.py), vs "
                         "measured", tables["extrapolation"]))
    if "memory" in tables:
        sections.append(("Memory per GPU: predicted before launch vs measured (every column in memory.csv)",
                         tables["memory_short"]))
    if not tables["ablation"].empty:
        sections.append(("Ablation (throughput gain of each optimisation over its baseline, the rest held "
                         "fixed)", tables["ablation"]))
    if not tables["nccl"].empty:
        sections.append(("NCCL collectives by node count and EFA count (every column in nccl.csv)",
                         tables["nccl_short"]))
    if "nccl_sizes" in tables:
        sections.append(("NCCL bus bandwidth per message size, most nodes probed (every node count and "
                         "collective in nccl_sizes.csv)", tables["nccl_sizes_short"]))
    if "network_achieved" in tables:
        sections.append(("What each run got of the network: its collectives' bus bandwidth against the probe "
                         "at the nearest size", tables["network_achieved"]))
    if "comm_model" in tables:
        sections.append(("Communication model (FSDP bus bytes per step at the probed bandwidth; every column "
                         "in comm_model.csv)", tables["comm_model_short"]))
    if not tables["loss_parity"].empty:
        sections.append(("Loss parity across strategies (same model, data and seed: same loss curve)",
                         tables["loss_parity"]))
    sections.append(("Cost per sweep (all runs, failed ones included; per-run figures in cost_runs.csv)",
                     tables["cost_sweeps"]))
    sections.append(("Cost per configuration (steady-state tokens/s, on-demand price)", tables["cost"]))
    if "preflight" in tables:
        sections.append(("Preflight: each node alone and in pairs before the study (preflight.json)",
                         tables["preflight"]))
    for name in (n for n in tables if n.startswith("system_") and not n.startswith("system_env_")):
        sweep = name.removeprefix("system_")
        sections.append((f"System: {sweep} (a row per distinct system its nodes ran; every fact of every "
                         "node in system.csv)", tables[name]))
        sections.append((f"Environment {sweep}'s runs saw (NCCL_*, FI_*, TORCH_*, CUDA_*, OMP_*, ...; "
                         "variables named like secrets masked)", tables[f"system_env_{sweep}"]))
    if system_notes:
        sections.append(("System notes", system_notes))
    sections.append((f"Run status ({ok} ok of {len(frame)}; not ok below)", tables["status"]))
    for name, title in charts.items():
        if name not in ("throughput_vs_nodes", "step_split", "step_split_all"):
            sections.append((title, ("chart", name)))
    sections += [("Definitions", DEFINITIONS + DEFINITIONS_ADDED), ("Provenance", provenance(frame))]
    return sections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__)
    parser.add_argument("path", type=Path, help="results root (results/) or one sweep dir")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default PATH/report)")
    parser.add_argument("--price", action="append", default=[], metavar="[CLUSTER=]USD",
                        help="price per instance-hour, overriding the sweeps' (repeatable)")
    parser.add_argument("--train-tokens", type=float, default=None,
                        help="token budget for the time/cost-to-train columns (default: the study's "
                             f"study.train_tokens, else {TRAIN_TOKENS:.0e})")
    parser.add_argument("--knee-share", type=float, default=None,
                        help="the knee: where the next node count buys less than this share of a linear "
                             "gain, in (0, 1] (default: the study's study.knee_share, else "
                             f"{DEFAULT_KNEE_SHARE:g})")
    args = parser.parse_args(argv)
    try:
        if args.train_tokens is not None and not 0 < args.train_tokens < float("inf"):
            raise ValueError(f"--train-tokens must be a positive number of tokens, got {args.train_tokens:g}")
        if args.knee_share is not None:
            check_knee_share(args.knee_share)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        loaded = load(args.path)
        planned = loaded.plan["cluster"] if "cluster" in loaded.plan else pd.Series(dtype=str)
        clusters = sorted(set(map(str, pd.concat([loaded.frame["cluster"], planned]).dropna().unique())))
        prices = parse_price_overrides(args.price, clusters)
    except NoResults as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: bad --price: {e}", file=sys.stderr)
        return 2
    md = build(loaded, args.out or args.path / "report", prices, args.train_tokens, args.knee_share)
    print(f"report: {md} and {md.with_suffix('.html')} ({len(loaded.frame)} runs from "
          f"{len(loaded.sweeps)} sweep(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
