"""What the plan predicted before launch, beside what the runs measured, with the error of each.

Throughput: bench/predict/perf.py's tokens/s per GPU, MFU and scaling efficiency against the timed steps, and
one sentence naming the largest miss and what the model held to bound that run (compute, memory bandwidth or
network), which is where a miss most likely comes from.

Memory: the peak the planner measured on fake tensors (bench/predict/memory.py; the lower bound of the state
where it could not, the analytic estimate in studies planned before) against torch's allocator peak on the GPU
(`torch.cuda.max_memory_allocated`, max over ranks),
and the planner's headroom assumptions against what each GPU run showed: reserved / allocated (allocator
fragmentation) and NVML used - reserved (CUDA context and NCCL buffers, outside the allocator).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.scaling import configuration_label, node_count
from bench.core import rundir
from bench.core.hardware import compute_dtype
from bench.core.schema import PRECISIONS
from bench.predict.memory import CUDA_CONTEXT_GIB, FRAGMENTATION
from bench.predict.perf import FLOOR


def _placement(rows: pd.DataFrame) -> pd.Series:
    return rows["nodes"].astype(int).astype(str) + "x" + rows["gpus_per_node"].astype(int).astype(str)


def memory_table(agg: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and node count: predicted and measured peak per GPU, the error, and the headroom
    checks. Empty where no run has a prediction (results from before predictions were recorded)."""
    if "pred_mem_gib" not in agg or agg["pred_mem_gib"].isna().all():
        return pd.DataFrame()
    rows = agg[agg["pred_mem_gib"].notna()]
    measured = rows["mem_peak_alloc_gib"]
    return pd.DataFrame({
        "model": rows["model"], "configuration": rows.apply(configuration_label, axis=1),
        "precision": rows["precision"], "nodes": rows["nodes"], "placement": _placement(rows),
        "pred_mem_gib": rows["pred_mem_gib"],
        "pred_mem_source": rows["pred_mem_source"],
        "mem_peak_alloc_gib": measured, "mem_error": (rows["pred_mem_gib"] - measured) / measured,
        "reserved_ratio": rows["mem_peak_reserved_gib"] / measured,
        "outside_allocator_gib": rows["nvml_mem_used_gib"] - rows["mem_peak_reserved_gib"],
        "status": rows["status"]}).reset_index(drop=True)


def memory_notes(table: pd.DataFrame) -> list[str]:
    """One sentence on how far the memory predictions were off and whether the headroom held."""
    if table.empty:
        return []
    both = table[table["mem_error"].notna()]
    if both.empty:
        return ["memory: predicted per run; no run measured device memory (CPU runs have no device "
                "allocator)"]
    worst = both.loc[both["mem_error"].abs().idxmax()]
    text = (f"memory: predicted within {both['mem_error'].abs().median():.1%} of the measured peak (median), "
            f"worst {worst['mem_error']:+.1%} ({worst['model']} {worst['configuration']} at "
            f"{node_count(worst['nodes'])})")
    ratio = both["reserved_ratio"].max()
    if pd.notna(ratio):
        text += (f"; reserved / allocated up to {ratio:.2f} (the plan allows {1 + FRAGMENTATION:.2f})")
    outside = both["outside_allocator_gib"].max()
    if pd.notna(outside):
        text += (f"; outside the allocator up to {outside:.1f} GiB (the plan allows {CUDA_CONTEXT_GIB:g} "
                 "+ NCCL)")
    return [text]


CAUSES = {  # what a miss most likely means, by what the model said bounds the step
    "compute-bound": "the matmuls ran at another fraction of the GPU's peak than calibrated (kernels, "
                     "clocks, a power cap)",
    "memory-bandwidth-bound": "the elementwise work and optimizer moved more or fewer bytes than modelled "
                              "(fusion: compile; unfused norms)",
    "network-bound": "the network delivered another bandwidth than assumed (compare the all-reduce probe "
                     "with the cluster's published figure)",
    "host-bound": "the CPU launched the step's kernels faster or slower than the H200's host did (a "
                  "larger micro batch moves the step onto the GPU)",
}

CPU_16BIT_CAUSE = ("it computes in {dtype} on a CPU, whose 16-bit matmuls run far from fp32's speed and "
                   "differently per dtype: the model takes them at a fixed fraction of fp32's "
                   "(bench/predict/cpu.py CPU_EMULATED_16BIT) until the study's runs of {dtype} calibrate it")
CPU_UNKNOWN_CAUSE = ("cause unknown: a CPU run records no figure that would tell (its compute dtype is "
                     "fp32, which the study's calibration covers)")


def cpu_cause(precision: str) -> str:
    """Why a CPU run missed, as far as its record supports: a 16-bit compute dtype (precision on a CPU),
    else unknown."""
    dtype = compute_dtype(precision) if precision in PRECISIONS else None
    return CPU_16BIT_CAUSE.format(dtype=dtype) if dtype in ("bf16", "fp16") else CPU_UNKNOWN_CAUSE


def throughput_table(agg: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and node count: predicted and measured tokens/s/GPU, MFU and scaling efficiency.
    Every predicted figure of a row is the one prediction its run launched with (pred_source: the published
    constants, or the study's calibration on its N runs finished by then), its efficiency against the base
    node count's tokens/s/GPU in that same prediction (pred_base_tokens_per_s_per_gpu), which the base
    row's own figure, predicted at its own launch, need not be."""
    if "pred_tokens_per_s_per_gpu" not in agg or agg["pred_tokens_per_s_per_gpu"].isna().all():
        return pd.DataFrame()
    rows = agg[agg["pred_tokens_per_s_per_gpu"].notna()]
    measured = rows["tokens_per_s"] / (rows["nodes"] * rows["gpus_per_node"])
    return pd.DataFrame({
        "model": rows["model"], "configuration": rows.apply(configuration_label, axis=1),
        "nodes": rows["nodes"], "placement": _placement(rows),
        "pred_tokens_per_s_per_gpu": rows["pred_tokens_per_s_per_gpu"],
        "tokens_per_s_per_gpu": measured, "error": measured / rows["pred_tokens_per_s_per_gpu"] - 1,
        "pred_mfu": rows["pred_mfu"], "mfu": rows["mfu"],
        "pred_scaling_efficiency": rows["pred_scaling_efficiency"],
        "pred_base_tokens_per_s_per_gpu": rows["pred_base_tokens_per_s_per_gpu"],
        "scaling_efficiency": rows["scaling_efficiency"], "pred_bound": rows["pred_bound"],
        "pred_step_time_s": rows["pred_step_time_s"], "step_time_s": rows["step_time_s"],
        "pred_source": rows["pred_source"].fillna("published constants"),
        "status": rows["status"]}).reset_index(drop=True)


def with_base(shown: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """The predicted efficiency as the page reads it, with what it came from: "47% of 2,145 (this study's 1
    runs)", the base node count's tokens/s/GPU and the constants of the same prediction."""
    cells = [None if pd.isna(eff) else f"{eff:.0%}" + ("" if pd.isna(base) else f" of {base:,.0f}")
             + ("" if pd.isna(source) else f" ({source})")
             for eff, base, source in zip(predicted["pred_scaling_efficiency"],
                                          predicted["pred_base_tokens_per_s_per_gpu"],
                                          predicted["pred_source"])]
    return shown.assign(pred_scaling_efficiency=cells)


def largest_miss(table: pd.DataFrame, cpu: bool) -> list[str]:
    """The run furthest from its prediction, in one sentence with the likely cause; and how many runs the
    study's own calibration predicted (bench/predict/calibrate.py), with their median error apart. Runs
    whose prediction is a floor only (perf.unmodeled: CPU offload) are counted apart, not missed."""
    both = table[table["error"].notna()] if not table.empty else table
    floors = both[both["pred_source"].str.contains(FLOOR, regex=False)] if not both.empty else both
    both = both.drop(floors.index)
    left_out = ""
    if not floors.empty:  # perf.unmodeled: the miss is what the model leaves out, not its constants
        why = str(floors["pred_source"].iloc[0]).split(FLOOR, 1)[1]
        left_out = f"left out, their prediction a floor only: {len(floors)} ({why})"
    if both.empty:
        return [f"prediction: {left_out}"] if left_out else []
    row = both.loc[both["error"].abs().idxmax()]
    ratio = row["tokens_per_s_per_gpu"] / row["pred_tokens_per_s_per_gpu"]
    how = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    own = both[both["pred_source"].str.startswith("this study")]
    calibrated = str(row["pred_source"]).startswith("this study")
    cause = ("predicted with the published constants, which no CPU run calibrated: the study's own runs "
             "calibrate the runs after them" if cpu and not calibrated
             else cpu_cause(str(row.get("precision"))) if cpu else CAUSES.get(row["pred_bound"], "unknown"))
    text = (f"prediction: measured tokens/s/GPU within {both['error'].abs().median():.0%} of the predicted "
            f"(median over {len(both)})")
    if not own.empty:
        text += (f"; {len(own)} of them predicted with this study's own calibration: within "
                 f"{own['error'].abs().median():.0%} (median)")
    text += f"; {left_out}" if left_out else ""
    where = f"{row['model']} {row['configuration']} at {node_count(row['nodes'])}"
    return [text + f"; largest miss {where} ran "
            f"{how} than predicted ({row['tokens_per_s_per_gpu']:,.0f} vs "
            f"{row['pred_tokens_per_s_per_gpu']:,.0f}; "
            f"{row['pred_source']}); the model held it {row['pred_bound']}: {cause}"]


def extrapolation_table(sweeps: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """Each sweep's runs above its smallest node count as its calibration file predicted them from the
    smallest node count's runs alone, beside what they measured; notes for files that cannot be read."""
    frames, notes = [], []
    for sweep in sweeps:
        path = sweep / rundir.CALIBRATION_JSON
        if not path.is_file():
            continue
        try:
            rows = json.loads(path.read_text())["extrapolation"]
            frame = pd.DataFrame(rows, columns=EXTRAPOLATION_FIELDS)
        except (OSError, ValueError, KeyError, TypeError) as e:
            notes.append(f"{path}: unreadable ({type(e).__name__}): no extrapolation check from it")
            continue
        frames.append(frame.assign(sweep=sweep.name))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return (table.sort_values(["sweep", "nodes", "label"], ignore_index=True)
            if not table.empty else table), notes


EXTRAPOLATION_FIELDS = ["label", "model", "nodes", "base_nodes", "base_runs", "predicted", "measured",
                        "error"]


def extrapolation_sentence(table: pd.DataFrame) -> list[str]:
    """How far calibrating on the smallest node count and predicting the largest missed."""
    if table.empty:
        return []
    out = []
    for sweep, rows in table.groupby("sweep"):
        top = rows[rows["nodes"] == rows["nodes"].max()]
        worst = top.loc[top["error"].abs().idxmax()]
        out.append(f"extrapolation ({sweep}): calibrated on its {int(worst['base_runs'])} runs at "
                   f"{node_count(worst['base_nodes'])} alone, the prediction of its largest node count "
                   f"({int(worst['nodes'])}) missed by {top['error'].abs().median():.0%} (median over "
                   f"{len(top)} runs), at worst {worst['error']:+.0%} ({worst['label']})")
    return out
