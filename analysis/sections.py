"""The report, declared: SECTIONS, in the order the page reads (the answer first, then where the step went
and the network, then the details, the definitions and where the numbers come from). Each section says
what it builds from the report's inputs (analysis/inputs.py), how its table's columns are named on its CSV
and on the page (analysis/columns.py), the file it writes and what its figures mean (the page's
Definitions). Adding a section is one entry here; analysis/report.py writes and renders them all alike.

A build returns a table (its CSV's rows in the results' column names: a dict of them for a table per
sweep), sentences, a chart, or None where the study has nothing for it. A table is written to its CSV
even when empty (the CSV says no row); the page leaves out what is empty.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure

from analysis import plots, system
from analysis.columns import SHORT_PARTS, Columns, percent
from analysis.comm import achieved_sentences
from analysis.cost import config_costs, energy_notes, sweep_costs
from analysis.first_screen import answer_sentences
from analysis.inputs import ReportInputs
from analysis.nodes import straggler_notes
from analysis.parity import departures
from analysis.predicted import extrapolation_sentence, largest_miss, memory_notes, with_base
from analysis.render import Glossary, number
from analysis.scaling import (
    ablation,
    configuration_label,
    efa_table,
    headline,
    missing_baselines,
    probe_sentences,
    restart_notes,
    sizes_by_column,
    status_table,
)
from analysis.step_split import READINGS_APART, charted, lost_sentences, noise_sentence
from analysis.strong import knee_sentences
from analysis.winback import change
from bench.predict.split import PARTS

Body = pd.DataFrame | dict[str, pd.DataFrame] | list[str] | Figure | Glossary | None


@dataclass(frozen=True)
class Section:
    """One section of the report: its id (its anchor on the HTML page, and its file's name unless `file`
    says otherwise: <file>.csv, <file>_<sweep>.csv for a table per sweep, <file>.png and .svg for a chart),
    its title, what it builds from the study, its columns, how the page words a table's figures (`page`:
    also written as <file>_short.csv), a line under it (`note`), what its figures mean, and whether it is
    a detail: collapsed on the HTML page, one line with its files in the Markdown."""

    id: str
    title: str
    build: Callable[[ReportInputs], Body]
    columns: Columns | None = None
    page: Callable[[pd.DataFrame, ReportInputs], pd.DataFrame] | None = None
    note: Callable[[ReportInputs], str | None] | None = None
    definition: str = ""
    detail: bool = False
    file: str = ""

    @property
    def stem(self) -> str:
        return self.file or self.id


# ------------------------------------------------------------------------------------------- the answer

def _answer(i: ReportInputs) -> list[str]:
    """The first screen's sentences (analysis/first_screen.py); before any run, the plan's."""
    spanning = [line for sweep, records in i.systems.items() if (line := system.spans(sweep, records))]
    sentences = answer_sentences(spanning, knee_sentences(i.answers, i.train_tokens, i.knee_share),
                                 headline(i.agg)[0], i.frame, probe_sentences(i.probes), i.best, i.verdicts)
    if sentences and i.frame.empty:
        return ["Nothing has run yet: the plan's prediction (plan.csv)", *sentences]
    return sentences


def _scaling_rows(kind: str) -> Callable[[ReportInputs], pd.DataFrame | None]:
    def rows(i: ReportInputs) -> pd.DataFrame | None:
        found = i.answers[i.answers["scaling"] == kind]
        return None if found.empty else found
    return rows


def _budget_page(rows: pd.DataFrame, i: ReportInputs) -> pd.DataFrame:
    """Efficiency in percent, days as the sentences word them ("1,816"); the CSV keeps the numbers."""
    days = [None if pd.isna(d) else number(d) for d in rows["days_to_train"]]
    return percent(rows, "efficiency").assign(days_to_train=days)


def _percent_page(*columns: str) -> Callable[[pd.DataFrame, ReportInputs], pd.DataFrame]:
    return lambda frame, i: percent(frame, *columns)


BUDGET = ("days_to_train", "usd_to_train", "kwh_to_train", "energy_usd_to_train")
STRONG = ("model", "configuration", "nodes", "tokens_per_step", "micro_batch", "grad_accum", "step_time_s",
          "source", "pred_step_time_s", "efficiency", "next_step", *BUDGET, "answer", "straggler")
WEAK = tuple(c for c in STRONG if c not in ("next_step", "grad_accum"))  # no next share: no knee
CONFIG_COLUMNS = ("model", "sharding", "precision", "activation_checkpointing", "compile", "offload", "batch",
                  "gpus_per_node", "nodes")  # a configuration, as the scaling tables name it


# ------------------------------------------------------------------------------------ where the step went

SPLIT_AUDIT = ("waiting_duration_rule", "duration_rule", "traced_runs")  # check the figures, not state them
SPLIT_FIGURES = ("step_time_s", *PARTS, "exposed_comm_s", "pred_exposed_comm_s", "exposed_comm_error")


def _split(i: ReportInputs) -> pd.DataFrame | None:
    return None if i.split.empty else percent(i.split, "exposed_comm_error")


def _split_page(table: pd.DataFrame, i: ReportInputs) -> pd.DataFrame:
    """Each row's configuration in one label and its placement, as the page's other tables name them."""
    placement = table["nodes"].astype(int).astype(str) + "x" + table["gpus_per_node"].astype(int).astype(str)
    return table.assign(configuration=table.apply(configuration_label, axis=1), placement=placement)


def _split_note(i: ReportInputs) -> str | None:
    """What the page leaves to step_split.csv: the columns that audit its figures, and how often the
    duration rule's audit flags a row."""
    if i.split.empty:
        return None
    rule = i.split["duration_rule"].dropna()
    flagged = int((~rule.isin(["agrees"]) & ~rule.str.startswith("not checked")).sum())
    return ("In step_split.csv beside these, the columns that audit them: waiting by the duration rule (s), "
            "duration rule, traced runs. The rule's reading parts from the arrivals' by more than "
            f"{READINGS_APART:.0%} of the step, or its premise is contradicted, on {flagged} of "
            f"{len(i.split)} rows.")


def _named(i: ReportInputs) -> pd.DataFrame:
    """The split table's rows the chart draws: every configuration, or the ones the answer names."""
    strong = i.answers[i.answers["scaling"] == "strong"]
    answered = [t[["model", "configuration"]] for t in (i.best, strong) if not t.empty]
    named = pd.concat(answered) if answered else pd.DataFrame(columns=["model", "configuration"])
    return charted(i.split, named)


def _split_all(i: ReportInputs) -> Figure | None:
    return plots.split_chart(i.split) if len(_named(i)) < len(i.split) else None


def _points(i: ReportInputs) -> list[str]:
    """Per configuration traced at two node counts or more, where its points went and what wins them back;
    then how far runs of the same work read apart."""
    if not i.verdicts:
        return []
    out = [f"{a}: {change(v)}" if round(v.lost) >= 1 else a
           for a, v in zip(lost_sentences(i.split), i.verdicts)]
    return out + [noisy] if (noisy := noise_sentence(i.frame)) else out


# --------------------------------------------------------------------------------------------------- notes

def _notes(i: ReportInputs) -> list[str]:
    """What the reader should know of the runs and the predictions: loading, baselines, parity, the model's
    misses, restarts, stragglers, the network, energy, probes, prices."""
    frame = i.frame
    cpu = frame["device_name"].fillna("").eq("cpu").any()
    extrapolated, unreadable = i.extrapolated
    notes = (i.loaded.notes + missing_baselines(i.agg) + departures(i.parity) + memory_notes(i.memory)
             + largest_miss(i.predicted, cpu) + extrapolation_sentence(extrapolated) + i.preflight[1]
             + unreadable + restart_notes(frame) + straggler_notes(frame) + achieved_sentences(i.got)
             + energy_notes(frame, i.energy_prices) + _per_sweep(system.unread_records)(i))
    if not i.one_rank.empty:
        notes.append(f"{len(i.one_rank)} one-rank all-reduce probe(s) measured no network (bus bandwidth is "
                     "0 by definition on one rank): left out of the EFA table, kept in nccl.csv")
    unpriced = sorted(c for c in frame["cluster"].dropna().unique() if i.prices.get(c) is None)
    if unpriced:
        notes.append(f"no price for cluster(s) {', '.join(map(str, unpriced))}: costs are left empty "
                     "(set cluster.price_per_hour in the sweep, or pass --price USD to the report)")
    return notes


def _none_ok(i: ReportInputs) -> list[str]:
    ok = int((i.frame["status"] == "ok").sum())
    return ["every run failed or was pruned: see the run status table"] if ok == 0 and len(i.frame) else []


def _status_note(i: ReportInputs) -> str:
    ok, runs = int((i.frame["status"] == "ok").sum()), len(i.frame)
    return f"{ok} of {runs} runs ok" + (f"; the {runs - ok} not ok above" if ok < runs else "")


# ------------------------------------------------------------------------------------- network and model

def _nccl_sizes_page(table: pd.DataFrame, i: ReportInputs) -> pd.DataFrame:
    """The most nodes probed (the collectives side by side at the most adapters): size + 7 columns."""
    most = i.sizes[i.sizes["nodes"] == i.sizes["nodes"].max()]
    if most["collective"].nunique() > 1:
        most = most[most["efa_per_node"] == most["efa_per_node"].max()]
    return sizes_by_column(most).iloc[:, :8]


def _predicted_page(table: pd.DataFrame, i: ReportInputs) -> pd.DataFrame:
    return with_base(percent(table, "error", "scaling_efficiency"), table)


def _none_if_empty(table: pd.DataFrame) -> pd.DataFrame | None:
    return None if table.empty else table


def _table_of(name: str) -> Callable[[ReportInputs], pd.DataFrame | None]:
    """One of the inputs' tables as it is, None where empty (no CSV then)."""
    return lambda i: _none_if_empty(getattr(i, name))


# ------------------------------------------------------------------------------------------ the system

def _systems(table: Callable[[system.SystemRecords], pd.DataFrame]) -> Callable[[ReportInputs], dict]:
    """A table per sweep whose runs recorded their nodes."""
    return lambda i: {sweep: table(records) for sweep, records in i.systems.items() if records.nodes}


def _per_sweep(notes: Callable[[str, system.SystemRecords], list[str]]
               ) -> Callable[[ReportInputs], list[str]]:
    """A note per sweep's system records (analysis/system.py)."""
    return lambda i: [note for sweep, records in i.systems.items() for note in notes(sweep, records)]


def _nodes(i: ReportInputs) -> pd.DataFrame | None:
    return _none_if_empty(system.node_table(i.systems))


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


def _chart(make: Callable[[pd.DataFrame], Figure | None], source: str) -> Callable[[ReportInputs], Body]:
    """A chart of one of the inputs' tables (analysis/plots.py)."""
    return lambda i: make(getattr(i, source))


SECTIONS: list[Section] = [
    Section("answer", "The answer", _answer),
    Section(
        "strong", "Strong scaling: days and dollars to train at one global batch", _scaling_rows("strong"),
        Columns(STRONG), _budget_page,
        definition="every node count trains the same global batch (gb N: N sequences per optimizer step, "
        "micro batch x accumulation steps x GPUs = N), so every node count does the same work: "
        "strong-scaling efficiency at n nodes = (step time at base / step time at n) x base / n, the "
        "timed unit the optimizer step, all its micro-batches included. Days and dollars are to train the "
        "study's token budget, predicted where a node count has no ok run (each row's source says from "
        'what). "next node count": how much faster (or slower) a step is at the next planned node count, '
        "and the share it buys of the step time linear scaling would save by going there (`next_share` in "
        "strong.csv); the knee is the first node count whose next step buys less than study.knee_share of "
        "a linear gain."),
    Section(
        "headline", "Best configuration at each node count",
        lambda i: percent(i.best, "scaling_efficiency"),
        Columns(("model", "configuration", "nodes", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
                 "mfu_peak", "mem_peak_alloc_gib", "scaling_efficiency", "straggler", "status")),
        definition="per model, the configuration the answer names, at every node count it was planned (a "
        "node count that failed with its status, never a missing point)."),
    Section(
        "weak", "Weak scaling: days and dollars to train at each node count's batch", _scaling_rows("weak"),
        Columns(WEAK, labels={"efficiency": "scaling efficiency"}), _budget_page,
        definition="each GPU keeps its micro batch, so the global batch (micro batch x ranks) grows with "
        "the node count; days and dollars are at the batch each node count trains, predicted where a node "
        "count has no ok run. No knee: a step up changes what a step trains, and a larger batch may need "
        "more tokens to reach the same loss."),
    Section("throughput_vs_nodes", "Throughput vs nodes", _chart(plots.throughput_vs_nodes, "agg")),
    Section(
        "step_split", "Where the step went", _split,
        Columns((*CONFIG_COLUMNS, "step_time_s", *PARTS, "waiting_duration_rule", "duration_rule",
                 "exposed_comm_s", "pred_exposed_comm_s", "exposed_comm_error", "traced_runs"),
                ("model", "configuration", "placement", *SPLIT_FIGURES),
                labels={"step_time_s": "step (s)"}, short_labels=SHORT_PARTS),
        _split_page, _split_note,
        definition="seconds per step in each part, from each run's profiler trace scaled to its measured "
        "(unprofiled) step, the median over a configuration's traced runs. Waiting is read from the "
        "ranks' arrival times where a collective's group shares a host clock, else by the duration rule "
        "(a rank's wait: its time in the collective less its group's shortest); the model's exposed "
        "communication (bench/predict/perf.py) beside the measured exposed parts, and its error."),
    Section(
        "points", "Where the points went, and what wins them back", _points,
        definition="from each configuration's smallest to its largest node count, the points of per-GPU "
        "efficiency lost in parts that add up (bench/predict/split.py), and the change the study's own "
        "model predicts wins the most back (the code the plan's --dry-run prints its prediction with), "
        "measured beside where the study ran that change."),
    Section("step_split_chart", "Where the step went, from each run's profiler trace",
            lambda i: plots.split_chart(_named(i)), file="step_split"),
    Section("step_split_all", "Where the step went, every configuration", _split_all, detail=True),
    Section(
        "efa", "Collective bandwidth by EFA adapters: all-reduce, all-gather, reduce-scatter",
        lambda i: efa_table(i.probes.drop(i.one_rank.index)),
        Columns(("nodes", "gpus_per_node", "efa_per_node", "transport", "nics", "busbw_avg_gbs",
                 "busbw_max_gbs", "busbw_avg_gbs_all_gather", "busbw_max_gbs_all_gather",
                 "busbw_avg_gbs_reduce_scatter", "busbw_max_gbs_reduce_scatter", "ok_runs"),
                labels={"efa_per_node": "EFA adapters", "transport": "transport (NCCL)"}),
        definition="**busbw** (all-reduce) = algbw * 2(n-1)/n with algbw = bytes / time (nccl-tests' "
        "definition); avg busbw = mean over message sizes (and placements), as nccl-tests' \"Avg bus "
        "bandwidth\" line; the median over a placement's ok probes, all-gather's and reduce-scatter's "
        "named."),
    Section("notes", "Notes", _notes),
    Section("none_ok", "No successful runs", _none_ok),
    Section(
        "scaling", "Scaling per configuration and node count", lambda i: i.agg,
        Columns(("sweep", "model", "sharding", "precision", "activation_checkpointing", "wrap_policy",
                 "compile", "offload", "batch", "micro_batch", "seq_len", "gpus_per_node", "nodes", "status",
                 "compile_s", "ok_runs", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max",
                 "samples_per_s", "tflops_per_gpu", "mfu", "mfu_peak", "hfu", "step_time_s",
                 "step_time_s_std", "mem_peak_alloc_gib", "mem_peak_reserved_gib", "nvml_mem_used_gib",
                 "mem_rss_gib", "pred_mem_gib", "scaling_efficiency", "base_nodes"),
                (*CONFIG_COLUMNS, "tokens_per_s_per_gpu", "mfu", "mfu_peak", "mem_peak_alloc_gib",
                 "mem_rss_gib", "scaling_efficiency", "straggler", "status")),
        _percent_page("scaling_efficiency"),
        definition="**tokens/s**: global tokens per second of the whole job, from the median step time of "
        "the steady-state window (warm-up steps excluded); spread = min/max over repeats and the std of "
        "step times. **TFLOPS/GPU** (model): training FLOPs per token 6*N + 12*L*H*Q*T (N = parameters "
        "without the input embedding, L layers, H heads, Q head dim, T sequence length; the torchtitan / "
        "llm-foundry convention) times tokens/s, divided by the GPUs. **MFU** = model TFLOPS/GPU / the "
        "GPU's dense peak for the compute dtype (bench/core/hardware.py), named beside every MFU (\"989.4 "
        'dense bf16 (H100-SXM)"), never the 2:4-sparse figure twice as large; **HFU** also counts the '
        "forward recompute of activation checkpointing; CPU runs have no MFU. fp8_tensorwise runs "
        "(torchao Float8 linears) are divided by the BF16 peak too, so MFU compares precisions on one "
        "denominator; against the FP8 peak (twice the BF16 one) it would be about half. **compile time**: "
        "with compile=true, the warm-up steps' time beyond steady-state steps (Inductor caches compiled "
        "graphs on the node: a warm node takes seconds, a cold one longer). **Scaling efficiency** at n "
        "nodes = (tokens/s at n / n) / (tokens/s at base / base), base = the smallest node count with an "
        "ok run of the same configuration. **straggler**: the node whose own compute per step (without "
        "its waits in FSDP's collectives) was more than preflight.tolerance above the median of the other "
        "nodes'; in brackets, by how much, and the seconds a step the others waited for it: every rank "
        "waits for the slowest, so such a run's efficiency is that node's, not FSDP's."),
    Section(
        "predicted", "Throughput: predicted before launch vs measured", _table_of("predicted"),
        Columns(None, ("model", "configuration", "placement", "pred_tokens_per_s_per_gpu",
                       "tokens_per_s_per_gpu", "error", "pred_scaling_efficiency", "scaling_efficiency"),
                labels={"tokens_per_s_per_gpu": "measured tokens/s/GPU",
                        "scaling_efficiency": "measured efficiency"}),
        _predicted_page,
        definition="each row's predicted figures are the one prediction its run launched with "
        "(bench/predict/perf.py): step = matmuls at a calibrated fraction of the dense peak + elementwise "
        "and optimizer memory traffic at HBM bandwidth + the FSDP communication prefetch cannot hide "
        "(network: the study's probe, else the instance's published nccl-tests figure) + contention; "
        "error = measured / predicted - 1; its efficiency against the base node count's tokens/s/GPU in "
        "that same prediction. MFU, bound and step times in predicted.csv; the constants, their sources "
        "and every published row's error: `python benchmarks/perf_model.py`."),
    Section(
        "extrapolation", "Extrapolation: the smallest node count's calibration vs measured",
        lambda i: None if i.extrapolated[0].empty else percent(i.extrapolated[0], "error"),
        Columns(("sweep", "label", "base_nodes", "nodes", "predicted", "measured", "error"),
                labels={"label": "run", "base_nodes": "calibrated at nodes",
                        "predicted": "predicted tokens/s/GPU", "measured": "measured tokens/s/GPU"}),
        detail=True,
        definition="each run above the smallest node count, predicted from the smallest node count's runs "
        "alone (the study's calibration, bench/predict/calibrate.py), beside what it measured."),
    Section(
        "memory", "Memory per GPU: predicted before launch vs measured", _table_of("memory"),
        Columns(None, ("model", "configuration", "placement", "pred_mem_gib", "mem_peak_alloc_gib",
                       "mem_error", "reserved_ratio", "outside_allocator_gib"),
                labels={"mem_peak_alloc_gib": "measured peak alloc (GiB/GPU)", "mem_error": "error"}),
        _percent_page("mem_error"), detail=True,
        definition="peak allocated/reserved by torch per GPU (max over ranks), NVML memory used (max over "
        "GPUs and samples); on CPU, the host RSS peak per process. Predicted: what the plan judged the "
        "run by, rank 0's peak of one steady training step of the run's own model, parallelization and "
        "optimizer on fake tensors (FSDPMemTracker), else the lower bound of its state; error = "
        "(predicted - measured peak allocated) / measured. The plan adds headroom for what the "
        "allocator's peak does not hold: reserved / allocated and NVML used - reserved show what each GPU "
        "run really needed."),
    Section(
        "ablation", "Ablation: the gain of each optimisation, the rest held fixed", lambda i: ablation(i.agg),
        Columns(("factor", "baseline", "optimised", "model", "nodes", "held_fixed", "baseline_tokens_per_s",
                 "optimised_tokens_per_s", "gain_pct", "baseline_mem_gib", "optimised_mem_gib")),
        definition="the throughput gain of each optimisation over its baseline, in runs that differ in it "
        "alone (each row says what it holds fixed)."),
    Section(
        "nccl", "NCCL collectives by node count and EFA count", lambda i: i.probes,
        Columns(("sweep", "cluster", "collective", "nodes", "gpus_per_node", "efa_per_node", "runs",
                 "ok_runs", "transport", "busbw_avg_gbs", "busbw_max_gbs", "busbw_max_gbs_min",
                 "busbw_max_gbs_max", "algbw_max_gbs"),
                ("collective", "nodes", "gpus_per_node", "efa_per_node", "transport", "ok_runs",
                 "busbw_avg_gbs", "busbw_max_gbs")),
        detail=True, definition="each collective's probes, the median over their ok repeats."),
    Section(
        "nccl_sizes", "NCCL bus bandwidth per message size, most nodes probed",
        lambda i: None if i.sizes.empty else sizes_by_column(i.sizes), page=_nccl_sizes_page, detail=True,
        definition="bus bandwidth at each message size, a column per collective, node and EFA count "
        "(all-reduce's unprefixed); the page shows the most nodes probed."),
    Section(
        "network_achieved", "What each run got of the network",
        lambda i: None if i.got.empty else percent(i.got, "share"),
        Columns(("model", "sharding", "nodes", "efa_per_node", "kind", "ranks", "message_bytes",
                 "achieved_busbw_gbs", "probe_busbw_gbs", "share", "probe", "probe_placement", "run_id"),
                labels={"kind": "collective"}),
        detail=True,
        definition="each run's collectives' bus bandwidth, from its trace (bytes over the seconds after "
        "the last rank arrived), against the probe of the same collective placed as its group is, at the "
        "nearest size."),
    Section(
        "collective_bounds", "What bounds each collective, predicted", _table_of("bounds"),
        Columns(("model", "configuration", "nodes", "part", "algorithm", "protocol", "bound", "exposed_s",
                 "total_s"),
                labels={"part": "collective", "algorithm": "NCCL algorithm", "protocol": "protocol",
                        "bound": "bound by", "exposed_s": "exposed (s)", "total_s": "in all (s)"}),
        definition="per configuration and node count of the plan on a GPU cluster, each part of the step's "
        "collectives as the study's model predicts NCCL runs it: the algorithm and protocol NCCL picks for "
        "one block's message, what bounds it (latency, in-node bandwidth, network bandwidth), and the "
        "seconds per step the step waits for of its seconds in all (the plan prints the same on "
        "--dry-run; docs/prediction.md, \"Which term decides\")."),
    Section(
        "comm_model", "Communication model", _table_of("comm"),
        Columns(("sweep", "model", "sharding", "precision", "activation_checkpointing", "nodes",
                 "comm_gb_per_gpu", "busbw_gbs", "busbw_all_gather_gbs", "busbw_reduce_scatter_gbs",
                 "busbw_all_reduce_gbs", "fed_by", "comm_s", "step_time_s", "comm_fraction", "lost_s",
                 "comm_growth_s", "verdict"),
                ("model", "sharding", "nodes", "fed_by", "comm_s", "step_time_s", "comm_fraction",
                 "verdict")),
        detail=True,
        definition="the bus bytes FSDP moves per GPU and step for the strategy (analysis/comm.py) divided "
        "by the bus bandwidth probed at the same node and EFA count, as if nothing overlapped. A point is "
        "communication-bound when that time is >= 90% of the step, or when its growth explains at least "
        "half of the step time lost against the base node count."),
    Section(
        "loss_parity", "Loss parity across strategies", lambda i: i.parity,
        Columns(("model", "nodes", "precision", "reference", "run", "steps_compared", "max_rel_deviation",
                 "tolerance", "verdict"), drop_empty=False),
        detail=True,
        definition="runs equal in everything but strategy, AC and wrapping (same model, data and seed) "
        "must share a loss curve: max relative deviation within 0.1% in fp32, 2% in mixed precision, 5% "
        "in pure bf16."),
    Section(
        "cost_sweeps", "Cost per sweep", lambda i: sweep_costs(i.runs_cost),
        Columns(("sweep", "cluster", "price_per_hour", "runs", "instance_hours", "gpu_hours", "usd")),
        definition="every run, failed ones included: measured wall time (start-up included) x nodes x the "
        "cluster's on-demand price per instance-hour; each run's in cost_runs.csv."),
    Section(
        "cost", "Cost per configuration",
        lambda i: config_costs(i.agg, i.runs_cost, i.prices, i.train_tokens, i.energy_prices),
        Columns(("sweep", "model", "sharding", "precision", "activation_checkpointing", "nodes",
                 "price_per_hour", "tokens_per_s", "usd_per_run", "usd_per_million_tokens", *BUDGET[:2],
                 "energy_j_per_token", "energy_price", *BUDGET[2:])),
        detail=True,
        definition="per million tokens and time to train at the steady-state tokens/s and the on-demand "
        "price. **GPU energy**: every GPU's joules over the timed steps, from NVML's energy counter, else "
        "its power samples integrated (the run's energy_source says which), over the tokens trained in "
        "them; the board's energy only (hosts, network and cooling are not in it). kWh to train = tokens "
        "x J/token / 3.6e6, its cost at cluster.energy_price. A CPU run: not measured."),
    Section("cost_runs", "Cost per run", lambda i: i.runs_cost, detail=True,
            definition="each run's wall time, nodes and price, failed runs included."),
    Section(
        "preflight", "Preflight: each node alone and in pairs before the study",
        lambda i: _none_if_empty(i.preflight[0]),
        Columns(("sweep", "node", "matmul_tflops", "copy_gbs", "pair_busbw_gbs", "torch", "nccl", "driver",
                 "efa_adapters", "verdict")),
        definition="each node's matmul, copy and best pair's all-reduce before the study (preflight.json); "
        "a node that stands apart is named."),
    Section(
        "system", "System", _systems(system.system_table),
        definition="a row per distinct system a study's nodes ran, from each node's facts as its worker "
        "read them at start (bench/core/system.py); a study whose nodes are not one system says so first, "
        "because its efficiency then mixes machines. Every fact of every node in system.csv."),
    Section(
        "system_env", "Environment", _systems(system.env_table), detail=True,
        definition="the NCCL_*, FI_*, TORCH_*, CUDA_*, OMP_* ... variables the runs saw, with how many "
        "runs saw each value; variables named like secrets masked."),
    Section("system_notes", "System notes", _per_sweep(system.missing_facts), detail=True),
    Section("system_nodes", "Every node's facts", _nodes, detail=True, file="system",
            definition="every fact of every node as recorded, a missing one with why."),
    Section("status", "Run status", lambda i: status_table(i.frame), note=_status_note,
            definition="every run that is not ok, with its error."),
    Section("efficiency_vs_nodes", "Scaling efficiency vs nodes", _chart(plots.efficiency_vs_nodes, "agg"),
            detail=True),
    Section("tflops_per_config", "TFLOPS per GPU", _chart(plots.tflops_per_config, "agg")),
    Section("memory_vs_nodes", "Memory per GPU vs nodes", _chart(plots.memory_vs_nodes, "agg")),
    Section("busbw_vs_size", "All-reduce bus bandwidth vs message size", _chart(plots.busbw_vs_size, "sizes"),
            detail=True),
    Section("estimate_vs_measured", "Memory: predicted vs measured",
            _chart(plots.estimate_vs_measured, "agg")),
    Section("definitions", "Definitions", lambda i: Glossary()),
    Section("provenance", "Provenance", lambda i: provenance(i.frame)),
]
