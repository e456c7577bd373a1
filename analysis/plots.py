"""One function per figure. Each builds a matplotlib Figure object (no pyplot, no global state) and
returns it, or None when the data has nothing to draw. Only ok runs are drawn; the status table shows the
rest. Large studies are cut to the MAX_LINES best configurations, said in the title."""
from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from analysis.scaling import CONFIG, describe
from bench.predict.split import LABELS, PARTS

MAX_LINES = 12


def _configs(agg: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    measured = agg[agg["tokens_per_s"].notna()]
    groups = [(dict(zip(CONFIG, key)), g.sort_values("nodes"))
              for key, g in measured.groupby(CONFIG, dropna=False)]
    groups.sort(key=lambda kg: -kg[1]["tokens_per_s"].max())
    return groups


def _title(text: str, shown: int, total: int) -> str:
    return text + (f" (best {shown} of {total} configurations)" if total > shown else "")


def _node_axis(ax, nodes: pd.Series) -> None:
    """Log-2 node axis labelled with the node counts themselves."""
    ax.set_xscale("log", base=2)
    ticks = sorted({int(n) for n in nodes.dropna()})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("nodes")


def _figure(width: float = 8, height: float = 5) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _per_config_lines(agg: pd.DataFrame, groups: list[tuple[dict, pd.DataFrame]], y: str, ylabel: str,
                      title: str, scale: float = 1.0) -> tuple[Figure, Any]:
    """A line per configuration over nodes (the best MAX_LINES); returns the figure and its axes."""
    fig = _figure()
    ax = fig.add_subplot()
    for config, g in groups[:MAX_LINES]:
        ax.plot(g["nodes"], scale * g[y], marker="o", label=describe(config))
    ax.set_ylabel(ylabel)
    _node_axis(ax, agg["nodes"])
    ax.set_title(_title(title, min(len(groups), MAX_LINES), len(groups)))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig, ax


def throughput_vs_nodes(agg: pd.DataFrame) -> Figure | None:
    groups = _configs(agg)
    if not groups:
        return None
    fig, ax = _per_config_lines(agg, groups, "tokens_per_s", "tokens/s (whole job)",
                                "Throughput vs nodes (dotted: ideal linear scaling)")
    for line, (_, g) in zip(ax.get_lines(), groups[:MAX_LINES]):
        if g["tokens_per_s_min"].notna().all():
            ax.fill_between(g["nodes"], g["tokens_per_s_min"], g["tokens_per_s_max"], alpha=0.15,
                            color=line.get_color())
        base = g.iloc[0]
        ax.plot(g["nodes"], base["tokens_per_s"] / base["nodes"] * g["nodes"], linestyle=":",
                color=line.get_color(), alpha=0.7)
        for _, point in g.iterrows():  # the efficiency at each point, where a reader looks for it
            if pd.notna(point.get("scaling_efficiency")) and point["nodes"] != base["nodes"]:
                ax.annotate(f"{point['scaling_efficiency']:.0%}", (point["nodes"], point["tokens_per_s"]),
                            textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                            color=line.get_color())
    return fig


def efficiency_vs_nodes(agg: pd.DataFrame) -> Figure | None:
    groups = [(c, g) for c, g in _configs(agg) if len(g) > 1]
    if not groups:
        return None
    fig, ax = _per_config_lines(agg, groups, "scaling_efficiency", "scaling efficiency (%)",
                                "Scaling efficiency by strategy", scale=100)
    ax.axhline(100, color="grey", linestyle=":")
    return fig


def tflops_per_config(agg: pd.DataFrame) -> Figure | None:
    measured = agg[agg["tflops_per_gpu"].notna()].sort_values("tflops_per_gpu", ascending=False)
    if measured.empty:
        return None
    shown = measured.head(3 * MAX_LINES)
    labels = [f"{describe(dict(r[CONFIG]))} n{int(r['nodes'])}" for _, r in shown.iterrows()]
    fig = _figure(8, 1 + 0.3 * len(shown))
    ax = fig.add_subplot()
    ax.barh(range(len(shown)), shown["tflops_per_gpu"])
    for i, (_, r) in enumerate(shown.iterrows()):
        if pd.notna(r["mfu"]):
            ax.text(r["tflops_per_gpu"], i, f" MFU {100 * r['mfu']:.1f}%", va="center", fontsize=7)
    ax.set_yticks(range(len(shown)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("model TFLOPS per GPU")
    ax.set_title(f"TFLOPS per GPU ({len(shown)} of {len(measured)} configurations)")
    return fig


def _memory_column(agg: pd.DataFrame) -> str | None:
    for column in ("mem_peak_alloc_gib", "nvml_mem_used_gib", "mem_rss_gib"):
        if agg[column].notna().any():
            return column
    return None


def memory_vs_nodes(agg: pd.DataFrame) -> Figure | None:
    column = _memory_column(agg)
    groups = _configs(agg)
    if column is None or not groups:
        return None
    ylabel = {"mem_peak_alloc_gib": "peak allocated (GiB/GPU, torch)",
              "nvml_mem_used_gib": "memory used (GiB/GPU, NVML)",
              "mem_rss_gib": "host RSS peak (GiB/process, CPU run)"}[column]
    return _per_config_lines(agg, groups, column, ylabel, "Memory per GPU vs nodes")[0]


def busbw_vs_size(sizes: pd.DataFrame) -> Figure | None:
    if "collective" in sizes:  # the all-reduce's; the others are in nccl_sizes.csv and the EFA table
        sizes = sizes[sizes["collective"] == "all_reduce"]
    if sizes.empty:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for (nodes, efa), g in sizes.groupby(["nodes", "efa_per_node"]):
        ax.plot(g["size_bytes"], g["busbw_gbs"], marker=".", label=f"{int(nodes)} nodes, {int(efa)} EFA")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
    ax.set_title("All-reduce bus bandwidth vs message size")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def estimate_vs_measured(agg: pd.DataFrame) -> Figure | None:
    """The plan's memory figure against torch's allocator peak, both of allocated tensors."""
    column = "mem_peak_alloc_gib"
    if "pred_mem_gib" not in agg or not agg[column].notna().any():
        return None  # CPU runs have no device memory to compare with
    both = agg[agg[column].notna() & agg["pred_mem_gib"].notna()]
    if both.empty:
        return None
    fig = _figure(6, 6)
    ax = fig.add_subplot()
    ax.scatter(both["pred_mem_gib"], both[column])
    top = float(max(both["pred_mem_gib"].max(), both[column].max())) * 1.1
    ax.plot([0, top], [0, top], color="grey", linestyle=":")
    ax.set_xlabel("predicted before launch (GiB/GPU)")
    ax.set_ylabel("measured peak allocated (GiB/GPU)")
    ax.set_title("Memory: predicted vs measured")
    return fig


# how the step split chart names a configuration's fields: those that differ between its panels above each
# panel, the others of these in its title
FIELD_WORDS = {"sweep": "{}", "cluster": "{}", "model": "{}", "gpus_per_node": "{} GPUs/node",
               "sharding": "{}", "precision": "{}", "activation_checkpointing": "AC {}",
               "wrap_policy": "wrap {}", "compile": "{}", "offload": "offload {}", "batch": "{}",
               "seq_len": "seq {}", "efa_per_node": "{} EFA"}
VALUE_WORDS = {"compile": {True: "compiled", False: "eager", "True": "compiled", "False": "eager"},
               "gpus_per_node": {1: "1 GPU/node"}}
TITLE_FIELDS = ("model", "sharding", "precision", "activation_checkpointing", "batch", "gpus_per_node",
                "seq_len")
SPLIT_COLUMNS = 3  # panels a row: each 3.2 inches wide, legible at the report's width (1200 px)


def _words(config: dict, fields: list[str]) -> str:
    return ", ".join(VALUE_WORDS.get(f, {}).get(config[f]) or FIELD_WORDS[f].format(config[f])
                     for f in fields if f in FIELD_WORDS)


def split_chart(table: pd.DataFrame) -> Figure | None:
    """The step of each configuration and node count stacked in its parts (seconds): one panel per
    configuration, named by the fields that differ between them (the rest in the title), its node counts
    beneath its bars, one legend below; the title says which configurations a chart of some of them
    (analysis.step_split.charted) draws."""
    if table.empty:
        return None
    groups = [(dict(zip(CONFIG, key)), g.sort_values("nodes"))
              for key, g in table.groupby(CONFIG, dropna=False, sort=False)]
    note = ""
    if table.attrs.get("of", len(groups)) > len(groups):  # analysis.step_split.charted left some out
        which = "the answer names" if table.attrs.get("named") else "first"
        note = (f"; the {len(groups)} configuration{'s' * (len(groups) > 1)} {which} of "
                f"{table.attrs['of']}, every one in step_split_all.png")
    differ = [c for c in CONFIG if c != "model_config" and table[c].astype(str).nunique() > 1]
    same = [c for c in TITLE_FIELDS if c not in differ]
    cols = min(len(groups), SPLIT_COLUMNS)
    rows = math.ceil(len(groups) / cols)
    width = max(3.2 * cols + 0.8, 7.0)  # the legend below needs 7 inches
    fig = Figure(figsize=(width, 2.5 * rows + 1.6), layout="constrained")
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False)
    colors = colormaps["tab10"].colors
    for ax, (config, g) in zip(axes.flat, groups):
        bottom = np.zeros(len(g))
        for part, color in zip(PARTS, colors):
            values = g[part].to_numpy(dtype=float)
            ax.bar(range(len(g)), values, bottom=bottom, width=0.6, color=color, label=LABELS[part])
            bottom += values
        ax.set_xticks(range(len(g)), [str(int(n)) for n in g["nodes"]], fontsize=8)
        ax.set_xlim(-0.6, max(len(g), 2) - 0.4)  # one node count: a bar as wide as in a pair
        ax.set_xlabel("nodes", fontsize=8)
        ax.set_title(textwrap.fill(_words(config, differ), 34), fontsize=8)  # one panel: the title says it
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("seconds per step", fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(textwrap.fill(f"Where the step went: {_words(groups[0][0], same)} (each run's profiler "
                               f"trace, scaled to its measured step){note}", int(width * 11)), fontsize=10)
    return fig
