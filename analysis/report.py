"""`python -m analysis.report PATH [--out DIR]`: tables and charts from a results root or one sweep dir.

Writes report.md, report.html (tables and charts together), one CSV per table and PNG+SVG charts to
DIR (default PATH/report). Missing or broken input gives one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import pandas as pd

from analysis import plots, system
from analysis.columns import (
    ABLATION_COLUMNS,
    ACHIEVED_COLUMNS,
    COMM_COLUMNS,
    COMM_SHORT,
    COST_COLUMNS,
    EFA_COLUMNS,
    EXTRAPOLATION_COLUMNS,
    HEADLINE_COLUMNS,
    MEMORY_COLUMNS,
    NCCL_COLUMNS,
    NCCL_SHORT,
    PARITY_COLUMNS,
    PREDICTED_COLUMNS,
    SCALING_COLUMNS,
    SCALING_SHORT,
    SWEEP_COST_COLUMNS,
    WEAK_COLUMNS,
)
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
from analysis.first_screen import answer_sentences, best_peak, with_mfu_peak
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
from analysis.render import markdown, number, page_html
from analysis.scaling import (
    ablation,
    aggregate,
    headline,
    missing_baselines,
    nccl_sizes,
    nccl_summary,
    probe_sentences,
    restart_notes,
    status_table,
)
from analysis.sections import page_sections
from analysis.step_split import COLUMNS as SPLIT_COLUMNS, charted, lost_sentences, noise_sentence, split_table
from analysis.strong import COLUMNS as STRONG_COLUMNS, knee_sentences, strong_rows, study_settings
from analysis.winback import change, verdicts
from bench.core.schema import ADDED_DEFAULTS, COLLECTIVES
from bench.predict.budget import DEFAULT_KNEE_SHARE, DEFAULT_TRAIN_TOKENS, check_knee_share

TRAIN_TOKENS = DEFAULT_TRAIN_TOKENS
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


def system_tables(frame: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], list[str], list[str], pd.DataFrame]:
    """Per study, its table of distinct systems and of the environment its runs saw; the first screen's
    lines for studies that span systems; the section's notes; every node's facts (system.csv)."""
    records = system.system_records(frame)
    tables: dict[str, pd.DataFrame] = {}
    first, notes = [], []
    for sweep, one in records.items():
        if one.nodes:
            tables[f"system_{sweep}"] = system.system_table(one)
            tables[f"system_env_{sweep}"] = system.env_table(one)
        first += [line for line in [system.spans(sweep, one)] if line]
        notes += system.system_notes(sweep, one)
    return tables, first, notes, system.node_table(records)


@dataclass
class _Study:
    """What the report's tables, charts, notes and sentences are computed from, computed once."""

    loaded: Loaded
    agg: pd.DataFrame
    answers: pd.DataFrame  # analysis/strong.py's rows, strong and weak
    best: pd.DataFrame  # the headline's rows
    probes: pd.DataFrame
    split: pd.DataFrame
    sizes: pd.DataFrame
    got: pd.DataFrame  # what each run got of the network (analysis/comm.py achieved)
    price_table: dict[str, float | None]
    energy_prices: dict[str, float | None]
    train_tokens: float
    knee_share: float

    @property
    def frame(self) -> pd.DataFrame:
        return self.loaded.frame


def _study(loaded: Loaded, prices: dict[str, float] | None, train_tokens: float | None,
           knee_share: float | None) -> _Study:
    frame = loaded.frame
    agg = with_mfu_peak(with_energy(aggregate(frame), frame), frame)
    energy_prices = sweep_energy_prices(loaded.sweeps)
    price_table = {**sweep_prices(loaded.sweeps), **(prices or {})}
    settings = study_settings(loaded.sweeps)
    train_tokens = train_tokens or settings.get("train_tokens") or TRAIN_TOKENS
    knee_share = knee_share or settings.get("knee_share", DEFAULT_KNEE_SHARE)
    answers = strong_rows(agg, price_table, train_tokens, knee_share, loaded.plan, energy_prices)
    sizes = nccl_sizes(frame)
    got = achieved(frame, sizes) if not sizes.empty else pd.DataFrame()
    return _Study(loaded, agg, answers, best_peak(headline(agg)[1], agg), nccl_summary(frame),
                  split_table(frame), sizes, got, price_table, energy_prices, train_tokens, knee_share)


def build(loaded: Loaded, out: Path, prices: dict[str, float] | None = None,
          train_tokens: float | None = None, knee_share: float | None = None) -> Path:
    """Write every table, chart and the two report pages; returns the Markdown path.

    prices override the sweeps' own price_per_hour by cluster name; train_tokens the study's
    study.train_tokens (default TRAIN_TOKENS); knee_share its study.knee_share.
    """
    out.mkdir(parents=True, exist_ok=True)
    st = _study(loaded, prices, train_tokens, knee_share)
    frame = st.frame
    systems, spanning, system_notes, nodes = system_tables(frame)
    judged = verdicts(frame, st.split, loaded.sweeps) if not st.split.empty else []
    sentences = answer_sentences(spanning, knee_sentences(st.answers, st.train_tokens, st.knee_share),
                                 headline(st.agg)[0], frame, probe_sentences(st.probes), st.best, judged)
    runs_cost = run_costs(frame, st.price_table)
    runs_cost.to_csv(out / "cost_runs.csv", index=False)
    tables = {**_first_tables(st), **_cost_tables(st, runs_cost), **_network_tables(st)}
    model_tables, model_notes = _model_tables(st)
    parity = loss_parity(frame)
    tables.update({**model_tables, **systems, "loss_parity": parity.rename(columns=PARITY_COLUMNS)})
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    if not nodes.empty:
        nodes.to_csv(out / "system.csv", index=False)
    notes = loaded.notes + missing_baselines(st.agg) + departures(parity) + model_notes + _notes(st)
    split_sentences = [f"{a}: {change(v)}" if round(v.lost) >= 1 else a
                       for a, v in zip(lost_sentences(st.split), judged)] if judged else []
    if split_sentences and (noisy := noise_sentence(frame)):
        split_sentences.append(noisy)
    sections = page_sections(frame, tables, _charts(st, out), notes, sentences, system_notes, split_sentences)
    md = out / "report.md"
    md.write_text(markdown(sections))
    (out / "report.html").write_text(page_html(sections, out))
    return md


def _first_tables(st: _Study) -> dict[str, pd.DataFrame]:
    """The answer's tables: the headline, days and dollars (strong and weak scaling), the EFA table."""
    budget = _budget_names(st.train_tokens)
    one_rank = _one_rank(st.probes)
    tables = {"headline": _present(_percent(st.best, "scaling_efficiency"), HEADLINE_COLUMNS),
              "efa": _present(efa_table(st.probes.drop(one_rank.index)), EFA_COLUMNS),
              "scaling": _present(st.agg, SCALING_COLUMNS),
              "scaling_short": _present(_percent(st.agg, "scaling_efficiency"), SCALING_SHORT),
              "ablation": _present(ablation(st.agg), ABLATION_COLUMNS),
              "status": status_table(st.frame)}
    for kind, columns in (("strong", STRONG_COLUMNS), ("weak", WEAK_COLUMNS)):
        rows = st.answers[st.answers["scaling"] == kind]
        if not rows.empty:  # the CSV keeps the numbers, the page the percentages and days as it words them
            tables[kind] = _present(rows, columns).rename(columns=budget)
            days = [None if pd.isna(d) else number(d) for d in rows["days_to_train"]]
            shown = _percent(rows, "efficiency").assign(days_to_train=days)
            tables[f"{kind}_short"] = _present(shown, columns).rename(columns=budget)
    return tables


def _one_rank(probes: pd.DataFrame) -> pd.DataFrame:
    """One-rank probes: no network to measure (bus bandwidth is 0 on one rank)."""
    return probes[probes["nodes"] * probes["gpus_per_node"] == 1] if len(probes) else probes


def _cost_tables(st: _Study, runs_cost: pd.DataFrame) -> dict[str, pd.DataFrame]:
    costs = config_costs(st.agg, runs_cost, st.price_table, st.train_tokens, st.energy_prices)
    return {"cost_sweeps": _present(sweep_costs(runs_cost), SWEEP_COST_COLUMNS),
            "cost": _present(costs, COST_COLUMNS).rename(columns=_budget_names(st.train_tokens))}


def _network_tables(st: _Study) -> dict[str, pd.DataFrame]:
    """The probes' tables, what each run got of the network, the communication model, the step split."""
    tables = {"nccl": _present(st.probes, NCCL_COLUMNS), "nccl_short": _present(st.probes, NCCL_SHORT)}
    sizes = st.sizes
    if not sizes.empty:
        tables["nccl_sizes"] = _sizes_by_column(sizes)
        most = sizes[sizes["nodes"] == sizes["nodes"].max()]
        if most["collective"].nunique() > 1:  # the collectives side by side at the most adapters
            most = most[most["efa_per_node"] == most["efa_per_node"].max()]
        tables["nccl_sizes_short"] = _sizes_by_column(most).iloc[:, :8]  # the page: size + at most 7 columns
        comm = comm_model(st.agg, sizes)
        if not comm.empty:
            tables["comm_model"] = _present(comm, COMM_COLUMNS)
            tables["comm_model_short"] = _present(comm, COMM_SHORT)
        if not st.got.empty:
            tables["network_achieved"] = _present(_percent(st.got, "share"), ACHIEVED_COLUMNS)
    if not st.split.empty:
        tables["step_split"] = _present(_percent(st.split, "exposed_comm_error"), SPLIT_COLUMNS)
    return tables


def _model_tables(st: _Study) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Predicted beside measured: memory, throughput, the extrapolation; the preflight; and their notes."""
    tables: dict[str, pd.DataFrame] = {}
    preflight, preflight_notes = preflight_table(st.loaded.sweeps)
    if not preflight.empty:
        tables["preflight"] = preflight
    memory, predicted = memory_table(st.agg), throughput_table(st.agg)  # every column in their CSVs
    extrapolated, unreadable = extrapolation_table(st.loaded.sweeps)
    if not extrapolated.empty:
        tables["extrapolation"] = _present(_percent(extrapolated, "error"), EXTRAPOLATION_COLUMNS)
    if not memory.empty:
        tables["memory"] = memory
        tables["memory_short"] = _present(_percent(memory, "mem_error"), MEMORY_COLUMNS)
    if not predicted.empty:
        tables["predicted"] = predicted
        tables["predicted_short"] = _present(_with_base(_percent(predicted, "error", "scaling_efficiency"),
                                                        predicted), PREDICTED_COLUMNS)
    cpu = st.frame["device_name"].fillna("").eq("cpu").any()
    notes = (memory_notes(memory) + largest_miss(predicted, cpu) + extrapolation_sentence(extrapolated)
             + preflight_notes + unreadable)
    return tables, notes


def _charts(st: _Study, out: Path) -> dict[str, str]:
    """Every chart with something to draw, as PNG and SVG; by name, its title."""
    strong = st.answers[st.answers["scaling"] == "strong"]
    answered = [t[["model", "configuration"]] for t in (st.best, strong) if not t.empty]
    named = pd.concat(answered) if answered else pd.DataFrame(columns=["model", "configuration"])
    shown = charted(st.split, named)  # the chart: the configurations the answer names, where there are many
    rest = st.split if len(shown) < len(st.split) else pd.DataFrame()
    charts = {}
    for name, (title, make, source) in FIGURES.items():
        fig = make({"agg": st.agg, "sizes": st.sizes, "split": shown, "split_all": rest}[source])
        if fig is not None:
            fig.savefig(out / f"{name}.png", dpi=110)
            fig.set_layout_engine("none")  # keep the layout the PNG computed: the SVG need not redo it
            with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: searchable, selectable
                fig.savefig(out / f"{name}.svg", dpi=110)
            charts[name] = title
    return charts


def _notes(st: _Study) -> list[str]:
    """The notes of the runs themselves: restarts, stragglers, the network, energy, probes, prices."""
    frame = st.frame
    notes = (restart_notes(frame) + straggler_notes(frame) + achieved_sentences(st.got)
             + energy_notes(frame, st.energy_prices))
    one_rank = _one_rank(st.probes)
    if not one_rank.empty:
        notes.append(f"{len(one_rank)} one-rank all-reduce probe(s) measured no network (bus bandwidth is 0 "
                     "by definition on one rank): left out of the EFA table, kept in nccl.csv")
    unpriced = sorted(c for c in frame["cluster"].dropna().unique() if st.price_table.get(c) is None)
    if unpriced:
        notes.append(f"no price for cluster(s) {', '.join(map(str, unpriced))}: costs are left empty "
                     "(set cluster.price_per_hour in the sweep, or pass --price USD to the report)")
    return notes


def _budget_names(train_tokens: float) -> dict[str, str]:
    """The budget's columns as the page titles them, with the token budget they are for."""
    return {name: f"{name} {train_tokens:.3g} tokens" for name in (
        "days to train", "USD to train", "GPU kWh to train", "energy USD to train")}


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
