"""The report's name for each results column, one for every table (a table gives its own only where the
word means something narrower there), and a table's columns as its section declares them: every one its
CSV keeps (long) and those its page shows (short), so that a column is named in one place."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from bench.core.schema import ADDED_DEFAULTS
from bench.predict.split import LABELS as PART_LABELS, PARTS, SHORT as PART_SHORT

# What each MFU was divided by, beside it: the GPU's dense peak for the run's compute dtype (no 2:4 sparsity)
MFU_PEAK = "MFU of (dense peak TFLOPS/GPU)"
BUDGET = "{budget}"  # in a label: the token budget its figure is for ("days to train 1e+12 tokens")
LABELS = {
    # a configuration and its placement
    "sweep": "sweep", "cluster": "cluster", "model": "model", "configuration": "configuration",
    "sharding": "sharding", "precision": "precision", "activation_checkpointing": "AC", "wrap_policy": "wrap",
    "compile": "compile", "offload": "offload", "batch": "batch", "micro_batch": "micro batch",
    "grad_accum": "accumulation steps", "seq_len": "seq len", "gpus_per_node": "GPUs/node", "nodes": "nodes",
    "placement": "nodes x GPUs", "efa_per_node": "EFA/node", "status": "status", "ok_runs": "ok runs",
    "runs": "runs", "base_nodes": "base nodes", "straggler": "straggler",
    # throughput, efficiency and memory
    "compile_s": "compile time (s)", "tokens_per_s": "tokens/s", "tokens_per_s_min": "tokens/s min",
    "tokens_per_s_max": "tokens/s max", "tokens_per_s_per_gpu": "tokens/s/GPU", "samples_per_s": "samples/s",
    "tflops_per_gpu": "TFLOPS/GPU", "mfu": "MFU", "mfu_peak": MFU_PEAK, "hfu": "HFU",
    "step_time_s": "step time (s)", "step_time_s_std": "step time std (s)",
    "scaling_efficiency": "scaling efficiency", "mem_peak_alloc_gib": "peak alloc (GiB/GPU)",
    "mem_peak_reserved_gib": "peak reserved (GiB/GPU)", "nvml_mem_used_gib": "NVML used (GiB/GPU)",
    "mem_rss_gib": "host RSS (GiB/proc)", "pred_mem_gib": "predicted (GiB/GPU)",
    # the budget: a node count's days, dollars and energy to train it
    "tokens_per_step": "tokens/step", "source": "source", "pred_step_time_s": "predicted step time (s)",
    "efficiency": "strong-scaling efficiency", "next_step": "next node count",
    "days_to_train": f"days to train {BUDGET}", "usd_to_train": f"USD to train {BUDGET}",
    "kwh_to_train": f"GPU kWh to train {BUDGET}", "energy_usd_to_train": f"energy USD to train {BUDGET}",
    "answer": "answer", "price_per_hour": "price (USD/instance-h)", "usd_per_run": "USD per run",
    "usd_per_million_tokens": "USD per 1M tokens", "energy_j_per_token": "GPU J/token",
    "energy_price": "energy price (USD/kWh)", "instance_hours": "instance-hours", "gpu_hours": "GPU-hours",
    "usd": "USD",
    # predicted beside measured
    "pred_tokens_per_s_per_gpu": "predicted tokens/s/GPU", "error": "error",
    "pred_scaling_efficiency": "predicted efficiency (of the base, predicted with)",
    "reserved_ratio": "reserved / allocated", "outside_allocator_gib": "NVML - reserved (GiB)",
    # the network
    "collective": "collective", "transport": "transport", "nics": "NICs found",
    "busbw_avg_gbs": "avg busbw (GB/s)", "busbw_max_gbs": "max busbw (GB/s)",
    "busbw_max_gbs_min": "max busbw min (GB/s)", "busbw_max_gbs_max": "max busbw max (GB/s)",
    "algbw_max_gbs": "max algbw (GB/s)",
    "busbw_avg_gbs_all_gather": "all-gather avg busbw (GB/s)",
    "busbw_max_gbs_all_gather": "all-gather max busbw (GB/s)",
    "busbw_avg_gbs_reduce_scatter": "reduce-scatter avg busbw (GB/s)",
    "busbw_max_gbs_reduce_scatter": "reduce-scatter max busbw (GB/s)",
    "comm_gb_per_gpu": "comm (GB/GPU/step)", "busbw_gbs": "busbw used (GB/s)",
    "busbw_all_gather_gbs": "all-gather busbw (GB/s)",
    "busbw_reduce_scatter_gbs": "reduce-scatter busbw (GB/s)",
    "busbw_all_reduce_gbs": "all-reduce busbw (GB/s)", "fed_by": "probes used", "comm_s": "modelled comm (s)",
    "comm_fraction": "comm / step", "lost_s": "step time lost vs base (s)",
    "comm_growth_s": "comm growth vs base (s)", "verdict": "verdict", "ranks": "group ranks",
    "message_bytes": "bytes per call", "achieved_busbw_gbs": "busbw (GB/s)", "probe": "probe",
    "probe_busbw_gbs": "probe busbw (GB/s)", "share": "of the probe",
    "probe_placement": "probe over (nodes x GPUs)", "run_id": "run",
    # ablation, loss parity, the preflight
    "factor": "factor", "baseline": "baseline", "optimised": "optimised", "held_fixed": "held fixed",
    "baseline_tokens_per_s": "baseline tokens/s", "optimised_tokens_per_s": "optimised tokens/s",
    "gain_pct": "gain (%)", "baseline_mem_gib": "baseline mem (GiB/GPU)",
    "optimised_mem_gib": "optimised mem (GiB/GPU)", "reference": "reference run", "run": "run",
    "steps_compared": "steps compared", "max_rel_deviation": "max relative deviation",
    "tolerance": "tolerance",
    "node": "node", "matmul_tflops": "matmul TFLOPS", "copy_gbs": "copy GB/s",
    "pair_busbw_gbs": "all-reduce GB/s (best pair)", "torch": "torch", "nccl": "NCCL", "driver": "driver",
    "efa_adapters": "EFA",
    # where the step went (bench/predict/split.py names the parts)
    **{p: f"{PART_LABELS[p]} (s)" for p in PARTS},
    "waiting_duration_rule": "waiting by the duration rule (s)", "duration_rule": "duration rule",
    "exposed_comm_s": "exposed comm. measured (s)", "pred_exposed_comm_s": "exposed comm. predicted (s)",
    "exposed_comm_error": "predicted / measured - 1", "traced_runs": "traced runs",
}
SHORT_PARTS = {p: f"{PART_SHORT[p]} (s)" for p in PARTS}  # a narrow page's names for the parts


@dataclass(frozen=True)
class Columns:
    """A table's columns by the results' names, in order: `long` every one its CSV keeps (None: the table
    as built, its own names), `short` those the page shows where it shows fewer. LABELS names them, unless
    `labels` names one for this table (both pages) or `short_labels` for its page alone. `drop_empty`: a
    column no row fills, or an axis the study never varied, is left out."""

    long: tuple[str, ...] | None
    short: tuple[str, ...] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    short_labels: Mapping[str, str] = field(default_factory=dict)
    drop_empty: bool = True

    def names(self, keys: tuple[str, ...], budget: str, page: bool = False) -> dict[str, str]:
        """Each key's label, the token budget filled in."""
        mine = {**self.labels, **(self.short_labels if page else {})}
        return {k: (mine[k] if k in mine else LABELS[k]).replace(BUDGET, budget) for k in keys}

    def csv(self, frame: pd.DataFrame, budget: str) -> pd.DataFrame:
        """The table its CSV holds."""
        return frame if self.long is None else self._select(frame, self.names(self.long, budget))

    def page(self, frame: pd.DataFrame, budget: str) -> pd.DataFrame:
        """The table its page shows, of the frame as the page words it."""
        keys = self.short or self.long
        return frame if keys is None else self._select(frame, self.names(keys, budget, page=True))

    def _select(self, frame: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
        keep = [c for c in names if c in frame.columns]
        if self.drop_empty:
            keep = [c for c in keep if (frame[c].notna().any() or c == "status") and not (
                c in ADDED_DEFAULTS and (frame[c] == ADDED_DEFAULTS[c]).all())]  # never varied
        return frame[keep].rename(columns=names)


def percent(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """Ratios as a reader takes them on the page ("+35%", "98%"): signed where the column is an error."""
    out = frame.copy()
    for c in (c for c in columns if c in frame):
        signed = c.endswith("error")
        out[c] = [None if pd.isna(v) else (f"{v:+.0%}" if signed else f"{v:.0%}") for v in frame[c]]
    return out
