"""The page's names for each table's columns, by table: what the report shows of a frame (every column stays
in its CSV; a `_SHORT` map is what the page shows of a wide table)."""
from __future__ import annotations

from analysis.strong import COLUMNS as STRONG_COLUMNS

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
