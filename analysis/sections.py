"""What the report's page says, in order: the answer first (its sentence, the configuration per node count,
the throughput chart, the EFA table), then the details, then how the numbers are defined and where they
come from. analysis/report.py builds the tables and charts this places."""
from __future__ import annotations

import datetime as dt

import pandas as pd

from analysis.definitions import DEFINITIONS


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



def page_sections(frame: pd.DataFrame, tables: dict[str, pd.DataFrame], charts: dict[str, str],
              notes: list[str], sentences: list[str], system_notes: list[str] | None = None,
              split_sentences: list[str] | None = None) -> list[tuple[str, object]]:
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
    if split_sentences:
        sections.append(("Where the points went from each configuration's smallest to its largest node "
                         "count, and the change the model predicts wins the most back "
                         "(bench/predict/split.py, the code the plan's --dry-run prints its prediction with; "
                         "measured beside where the study ran the change)", split_sentences))
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
    sections += [("Definitions", DEFINITIONS), ("Provenance", provenance(frame))]
    return sections
