"""The answer a study is for, as the plan prints it before anything runs: per configuration and node count,
days and dollars to train study.train_tokens, the fastest, the cheapest and the knee (the definition is
bench/predict/budget.py's; the report renders the same from what the runs measured, analysis/strong.py);
and where each configuration's step is predicted to go (`--dry-run`): the predicted step and its parts per
node count, the points of per-GPU efficiency lost against the smallest node count in those parts, and the
change the model predicts wins the most of the largest node count's loss back (bench/predict/split.py).
The report answers the same questions from the runs, with the same code (analysis/winback.py): asked here
before anything is paid for.
"""
from __future__ import annotations

from typing import Any

from bench.core.config import ClusterConfig, StudyConfig
from bench.core.schema import RunSpec
from bench.predict.budget import DEFAULT_TRAIN_TOKENS, Answer, Row, answer, step_up
from bench.predict.comm import EXPOSED_PARTS
from bench.predict.device import Bound
from bench.predict.perf import Prediction, Predictor
from bench.predict.split import (
    LABELS,
    MODELLED,
    SHORT,
    Known,
    Options,
    Split,
    best_change,
    largest,
    lost_points,
    memory_check,
    rounded,
    tokens_per_gpu_step,
    win_back,
    words,
)
from bench.study.plan import PlannedRun, _config, answer_points


def config_label(spec: RunSpec) -> str:
    """A configuration as the answer names it: "llama2_7b FULL_SHARD bf16_mixed + full AC, 8 GPUs/node,
    s4096, global batch 1024 sync_each" (analysis.scaling.configuration_label's words)."""
    ac = "" if spec.activation_checkpointing == "none" else f" + {spec.activation_checkpointing} AC"
    options = (" + compile" if spec.compile else "") + (
        f" + offload {spec.offload}" if spec.offload != "none" else "")
    batch = (f"global batch {spec.global_batch} {spec.accumulation}" if spec.global_batch else
             f"micro batch {spec.micro_batch or 'auto'} per GPU")
    return (f"{spec.model} {spec.sharding} {spec.precision}{ac}{options}, {spec.gpus_per_node} GPUs/node, "
            f"s{spec.seq_len}, {batch}")


def _day(days: float) -> str:
    return f"{days:,.1f}" if days >= 10 else f"{days:.3g}"


def _days(row: Row) -> str:
    """"412.9 (286-594)": the days with their ~90% interval (perf.Prediction.interval; none on a CPU)."""
    if row.days is None:
        return "-"
    low_high = f" ({_day(row.days_range[0])}-{_day(row.days_range[1])})" if row.days_range else ""
    return _day(row.days) + low_high


def _days_in_words(row: Row) -> str:
    """"26.4 days, 20.7-33.7 at ~90%" (the summary's; the table's is _days)."""
    if row.days is None:
        return "- days"
    span = f", {_day(row.days_range[0])}-{_day(row.days_range[1])} at ~90%" if row.days_range else ""
    return f"{_day(row.days)} days{span}"


def answer_table(ans: Answer) -> list[str]:
    """One line per node count, right-aligned columns; where a node count has no figure, why."""
    head = ("nodes", "tokens/step", "step (s)", "efficiency", "next node count", "days", "USD", "source")
    rows = [head]
    for r in ans.rows:
        p = r.point
        cells = (str(p.nodes), f"{p.tokens_per_step:,.0f}",
                 "-" if p.step_time_s is None else f"{p.step_time_s:.3g}",
                 "-" if r.efficiency is None else f"{r.efficiency:.0%}",
                 step_up(r), _days(r),
                 "-" if r.usd is None else f"${r.usd:,.0f}", p.source)
        rows.append(cells)
    if not ans.strong:  # the next node count trains another batch: no share of a linear gain
        rows = [r[:4] + r[5:] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join([*(c.rjust(w) for c, w in zip(r[:-1], widths)), r[-1]]) for r in rows]


def _nodes(n: int) -> str:
    return f"{n} node{'' if n == 1 else 's'}"


def _at(row: Row | None, what: str) -> str:
    if row is None:
        return "-"
    usd = f", ${row.usd:,.0f}" if row.usd is not None else ""
    return f"{_nodes(row.point.nodes)} ({what}{usd})"


def answer_summary(ans: Answer) -> str:
    """Fastest, cheapest and the knee in one line, the threshold named."""
    fastest = _at(ans.fastest, _days_in_words(ans.fastest) if ans.fastest else "")
    cheapest = _at(ans.cheapest, f"{ans.cheapest.node_hours:,.0f} node-hours" if ans.cheapest else "")
    text = f"  fastest {fastest}; cheapest {cheapest}; "
    if not ans.strong:
        return text + ("no knee: the global batch grows with the node count (weak scaling), so a step up "
                       "changes what a step trains, not only how fast")
    share = f"{ans.knee_share:.0%} of the time linear scaling would save (study.knee_share)"
    if ans.knee is None:
        return text + "no knee: fewer than two node counts with a figure"
    if ans.knee_beyond:
        return text + f"knee beyond {_nodes(ans.knee.point.nodes)}: every step up buys at least {share}"
    assert ans.knee_next is not None
    how = ("is slower" if (ans.knee.next_share or 0) < 0 else
           f"buys {ans.knee.next_share:.0%}, less than {share}")
    return text + f"knee {_nodes(ans.knee.point.nodes)}: going to {ans.knee_next.point.nodes} {how}"


def format_answer(study: StudyConfig, cluster: str, price: float | None, plan: list[PlannedRun]) -> str:
    """The question the study is for, before anything is paid: per configuration and node count, days and
    dollars to train study.train_tokens, the fastest, the cheapest and the knee (bench/predict/budget.py,
    the report's definition), at `price` USD per instance-hour of `cluster`."""
    tokens = study.train_tokens or DEFAULT_TRAIN_TOKENS
    unset = "" if study.train_tokens else " (study.train_tokens unset: set it to your budget)"
    lines = [f"the answer (predicted): days (a ~90% interval: the study's own runs' where they calibrate the "
             f"prediction, else the published rows' on as many nodes) and dollars to train {tokens:.3g} "
             f"tokens{unset} per node count"]
    for spec, points in answer_points(plan):
        ans = answer(points, tokens, price, study.knee_share)
        kind = ("one global batch" if spec.global_batch else
                "weak scaling: the global batch grows with the nodes")
        lines += [f"{config_label(spec)} ({kind}):", *answer_table(ans), answer_summary(ans)]
    if len(lines) == 1:
        return ""
    if price is None:
        lines.append(f"no dollars: set a price (cluster.price_per_hour=USD per {cluster} instance-hour)")
    return "\n".join(lines)


# --- where the step goes, predicted --------------------------------------------------------------

HEAD = ("where the step goes, predicted (bench/predict/split.py): ms per step by part, and the points of "
        "per-GPU efficiency lost against the smallest node count in those parts (waiting: a CPU's ranks "
        "taking turns on its cores; a GPU's straggler is not predicted; FSDP's copies are in other)")


def ms(seconds: float) -> str:
    """Milliseconds as the table prints them: "412", "3.25", "0.0812"; never an exponent."""
    value = seconds * 1e3
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if value >= 1e-3 else "0"


def scaled(pred: Prediction) -> dict[str, float]:
    """The prediction's parts adding up to its step: a run held to linear scaling (bench/study/plan.py
    at_most) keeps its parts' shares."""
    total = sum(pred.parts.values())
    return {k: v * pred.step_time_s / total for k, v in pred.parts.items()} if total else dict(pred.parts)


def groups(plan: list[PlannedRun]) -> list[tuple[RunSpec, list[PlannedRun]]]:
    """Per training configuration (the plan's, bench/study/plan.py), its feasible predicted runs, one per
    node count, in node order."""
    found: dict[tuple[Any, ...], dict[int, PlannedRun]] = {}
    for p in plan:
        if p.spec.kind == "train" and p.feasible and p.perf is not None and not p.perf.unmodeled:
            found.setdefault(_config(p.spec), {}).setdefault(p.spec.nodes, p)
    return [(runs[min(runs)].spec, [runs[n] for n in sorted(runs)]) for runs in found.values()]


def table(runs: list[PlannedRun]) -> list[str]:
    """A line per node count: the step, its modelled parts (those any node count has), the points lost."""
    parts = {p.spec.run_id: scaled(p.perf) for p in runs if p.perf}
    shown = [k for k in MODELLED if any(v.get(k, 0.0) > 0 for v in parts.values())]
    rows = [("nodes", "step (ms)", *(SHORT[k] for k in shown), "lost (points)")]
    base = runs[0]
    for p in runs:
        assert p.perf is not None and base.perf is not None
        lost = "-"
        if p is not base:
            total, by_part = lost_points(_split(base), _split(p))
            lost = f"{total:.0f}: " + ", ".join(words(by_part)) if round(total) else "0"
        rows.append((str(p.spec.nodes), ms(p.perf.step_time_s),
                     *(ms(parts[p.spec.run_id].get(k, 0.0)) for k in shown), lost))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join([*(c.rjust(w) for c, w in zip(r[:-1], widths)), r[-1]]) for r in rows]


BOUND_WORDS = {"latency": "latency", "intra-node bandwidth": "in-node bw", "network bandwidth": "network bw"}
SHOWN = 0.10  # a part's collectives count as exposed from where the step waits for this share of them
# (and for a percent of the step): below, prefetch hides them


def cell(b: Bound) -> str:
    """One part's pick, bound and exposed ms of its ms: "ring/LL128 network bw, 9.13 of 138"."""
    return f"{b.algorithm}/{b.protocol} {BOUND_WORDS[b.bound]}, {ms(b.exposed_s)} of {ms(b.total_s)}"


def bounds_table(runs: list[PlannedRun]) -> list[str]:
    """A line per node count: per part of the step's collectives, NCCL's predicted algorithm and protocol
    for one block's message, what bounds it, and the ms per step the step waits for of its ms in all."""
    found = [k for k in EXPOSED_PARTS if any(b.part == k for p in runs if p.perf for b in p.perf.bounds)]
    if not found:
        return []
    rows = [("nodes", *(SHORT[k] for k in found))]
    for p in runs:
        assert p.perf is not None
        have = {b.part: b for b in p.perf.bounds}
        rows.append((str(p.spec.nodes), *(cell(have[k]) if k in have else "-" for k in found)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    head = ("  NCCL's predicted pick for one block's message, what bounds it, and the exposed ms of the "
            "step's ms of each part:")
    return [head, *("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)]


def exposure_line(runs: list[PlannedRun]) -> str:
    """Per part, the node count from which its collectives stop hiding behind compute, and what bounds them
    there: "from 32 nodes the backward reduce-scatter is latency-bound and exposed: 4.1 of 11 ms"."""
    said = []
    for k in EXPOSED_PARTS:
        for p in runs:
            assert p.perf is not None
            b = next((b for b in p.perf.bounds if b.part == k), None)
            if b and b.exposed_s >= max(SHOWN * b.total_s, 0.01 * p.perf.step_time_s):
                said.append(f"from {_nodes(p.spec.nodes)} the {LABELS[k].removeprefix('exposed ')} is "
                            f"{b.bound}-bound and exposed: {ms(b.exposed_s)} of {ms(b.total_s)} ms")
                break
    return "  " + "; ".join(said) if said else ""


def one_line(p: PlannedRun) -> str:
    """A run's predicted step and its parts in a line: "117 ms: compute 63.4, optimizer 1.44, other 52.5"."""
    assert p.perf is not None
    parts = scaled(p.perf)
    return f"{ms(p.perf.step_time_s)} ms: " + ", ".join(f"{SHORT[k]} {ms(parts[k])}" for k in MODELLED
                                                       if parts.get(k, 0.0) > 0)


def _split(p: PlannedRun) -> Split:
    assert p.perf is not None
    return Split(scaled(p.perf), p.perf.step_time_s, tokens_per_gpu_step(p.first_spec))


def options(cluster: ClusterConfig, plan: list[PlannedRun], predictor: Predictor, spec: RunSpec) -> Options:
    """What the cluster allows a changed run: its adapters, its device, and the plan's memory figures."""
    known = {p.first_spec.run_id: Known(p.first_spec, p.memory.gpu_gib, p.feasible,
                                        p.memory.source == "measured")
             for p in plan if p.spec.kind == "train" and p.memory is not None}
    device = predictor.device(spec)
    return Options(cluster.efa_per_node, device if device and device.family != "cpu" else None,
                   memory_check(cluster.gpu_memory_gib, known))


def change_line(cluster: ClusterConfig, plan: list[PlannedRun], predictor: Predictor,
                runs: list[PlannedRun]) -> str:
    """The change the model predicts wins the most of the largest node count's loss back, in one line."""
    base, top = runs[0].first_spec, runs[-1].first_spec
    allowed = options(cluster, plan, predictor, top)
    found = best_change(base, top, predictor.predict, allowed)
    if found is None:
        return ""
    lost, parts, gain = found
    at = f"  at {top.nodes} nodes, {lost:.0f} points predicted lost"
    if gain is None or round(lost) < 1:
        return at + ": no change of the axes the project has is predicted to win back a point"
    part = largest(parts)
    return f"{at}, {rounded(parts, round(lost))[part]} of them {SHORT[part]}: " + win_back(gain, parts)


def predicted_split(cluster: ClusterConfig, plan: list[PlannedRun], predictor: Predictor) -> str:
    """The plan's predicted split per configuration (a table each, named as the answer names it, and its
    change line where it has more than one node count), by the predictor the plan was made with."""
    found = groups(plan)
    if not found:
        return ""
    lines = [HEAD]
    for spec, runs in found:
        if len(runs) == 1:  # one node count: its split in a line
            lines.append(f"{config_label(spec)}, {runs[0].spec.nodes} node(s): {one_line(runs[0])}")
            continue
        lines += [f"{config_label(spec)}:", *table(runs), *bounds_table(runs), exposure_line(runs),
                  change_line(cluster, plan, predictor, runs)]
    return "\n".join(line for line in lines if line)
