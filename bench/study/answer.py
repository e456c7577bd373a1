"""The answer a study is for, as the plan prints it before anything runs: per configuration and node count,
days and dollars to train study.train_tokens, the fastest, the cheapest and the knee (the definition is
bench/predict/budget.py's; the report renders the same from what the runs measured, analysis/strong.py)."""
from __future__ import annotations

from bench.core.config import StudyConfig
from bench.core.schema import RunSpec
from bench.predict.budget import DEFAULT_TRAIN_TOKENS, Answer, Row, answer, step_up
from bench.study.plan import PlannedRun, answer_points


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
    """"412.9", with its ~90% interval where the study's own runs calibrate the prediction."""
    if row.days is None:
        return "-"
    low_high = f" ({_day(row.days_range[0])}-{_day(row.days_range[1])})" if row.days_range else ""
    return _day(row.days) + low_high


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
    fastest = _at(ans.fastest, f"{_days(ans.fastest)} days" if ans.fastest else "")
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
    lines = [f"the answer (predicted): days and dollars to train {tokens:.3g} tokens{unset} per node count"]
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
