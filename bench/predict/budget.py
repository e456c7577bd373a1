"""Days, dollars and the knee: what a team sizing a training run decides on, one definition for the plan
(bench/sweep.py prints it before anything launches) and the report (analysis/strong.py, as runs finish).

A configuration's answer is one row per node count: the time per optimizer step (measured, else
predicted), the scaling efficiency against its smallest node count with a figure, and the days and
dollars to train a token budget at the global batch that node count trains. At one global batch (strong
scaling) every node count trains the same tokens per step, and the knee says where another node stops
paying: going from n nodes to the next count n' saves T_n - T_n' of each step; linear scaling would save
T_n (1 - n/n'). Their ratio is the share of a linear gain that step buys (1: as much, 0: nothing, below 0:
slower). The knee is the first n whose next step buys less than the threshold (`study.knee_share`); where
every step buys at least that, it lies beyond the planned node counts. Where the global batch grows with
the node count (weak scaling) a step up also changes what a step trains, so there is no knee. Where a node
count's runs measured their GPUs' energy per token (NVML, trainer/nvml.py), the budget's energy too: kWh =
tokens x joules per token / 3.6e6, and its cost at `cluster.energy_price` (USD per kWh). It is the GPUs'
board energy only: the hosts, the network and the cooling are not in it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

SECONDS_PER_DAY = 86400.0
JOULES_PER_KWH = 3.6e6
DEFAULT_TRAIN_TOKENS = 1e12  # the budget where study.train_tokens is unset (said so wherever it is used)
DEFAULT_KNEE_SHARE = 0.5  # bench.core.config.StudyConfig.knee_share's default, for callers without a config


@dataclass(frozen=True)
class Point:
    """One node count of a configuration: what a step trains and how long it takes."""

    nodes: int
    tokens_per_step: float  # the global batch in tokens: sequences per optimizer step x sequence length
    step_time_s: float | None  # one optimizer step; None: no figure (infeasible, failed unpredicted)
    source: str  # "measured", "predicted (<its constants>)", or the status that left it without a figure
    spread: float | None = None  # a calibrated prediction's ~90% half-width in log units (perf.Prediction)
    j_per_token: float | None = None  # the GPUs' measured joules per token trained; None: not measured


@dataclass(frozen=True)
class Row:
    """A node count's answer; the figures are None where the point has no step time."""

    point: Point
    efficiency: float | None = None  # tokens/s per node against the base node count's
    next_share: float | None = None  # the share of a linear gain the next node count with a figure buys
    next_nodes: int | None = None  # that next node count
    next_speedup: float | None = None  # this step time over the next's: above 1 the step up is faster
    days: float | None = None  # to train the budget
    usd: float | None = None  # None without a price
    kwh: float | None = None  # the GPUs' energy to train the budget; None where not measured
    energy_usd: float | None = None  # that energy at the energy price; None without one

    @property
    def node_hours(self) -> float | None:
        return None if self.days is None else self.days * 24 * self.point.nodes

    @property
    def days_range(self) -> tuple[float, float] | None:
        """The ~90% interval of the days where the prediction has one (days go as 1 / tokens/s)."""
        if self.days is None or self.point.spread is None:
            return None
        return self.days * math.exp(-self.point.spread), self.days * math.exp(self.point.spread)


@dataclass(frozen=True)
class Answer:
    """A configuration's rows, in node order, and what they say."""

    rows: list[Row]
    strong: bool  # every node count with a figure trains the same tokens per step
    knee_share: float
    fastest: Row | None  # fewest days
    cheapest: Row | None  # fewest node-hours (fewest dollars at one price per node-hour)
    knee: Row | None  # strong scaling, with two node counts or more
    knee_beyond: bool = False  # every step up buys at least knee_share: the knee lies past the last count
    knee_next: Row | None = None  # the node count after the knee, whose step up fell short

    @property
    def known(self) -> list[Row]:
        return [r for r in self.rows if r.days is not None]


def days_to_train(train_tokens: float, tokens_per_step: float, step_time_s: float) -> float:
    """Steps to train the budget at this global batch, times the step time, in days."""
    return days_at(train_tokens, tokens_per_step / step_time_s)


def days_at(train_tokens: float, tokens_per_s: float) -> float:
    """The budget at a steady throughput, in days."""
    return train_tokens / tokens_per_s / SECONDS_PER_DAY


def kwh_to_train(train_tokens: float, j_per_token: float) -> float:
    """The GPUs' energy to train the budget at a measured energy per token, in kWh."""
    return train_tokens * j_per_token / JOULES_PER_KWH


def energy_usd(kwh: float | None, price_per_kwh: float | None) -> float | None:
    """That energy at a price per kWh; None without either."""
    return None if kwh is None or price_per_kwh is None else kwh * price_per_kwh


def usd_to_train(days: float, nodes: int, price_per_hour: float | None) -> float | None:
    """Every node of the run paid for the whole time; None without a price."""
    return None if price_per_hour is None else days * 24 * nodes * price_per_hour


def efficiency(base: Point, point: Point) -> float:
    """Tokens/s per node against the base's: at one global batch, (T_base / T_n) x base / n."""
    assert base.step_time_s and point.step_time_s
    return (point.tokens_per_step / point.step_time_s / point.nodes) / (
        base.tokens_per_step / base.step_time_s / base.nodes)


def next_share(point: Point, nxt: Point) -> float:
    """The share of the time linear scaling would save that going from `point` to `nxt` saves."""
    assert point.step_time_s and nxt.step_time_s
    return (point.step_time_s - nxt.step_time_s) / (point.step_time_s * (1 - point.nodes / nxt.nodes))


def step_up(row: Row) -> str:
    """The step up to the next node count in a reader's terms: "2 nodes: 1.85x faster (92% of linear)",
    "2 nodes: 1.30x slower"; "-" where there is none."""
    if row.next_nodes is None or row.next_speedup is None or row.next_share is None:
        return "-"
    where = f"{row.next_nodes} node{'' if row.next_nodes == 1 else 's'}"
    if row.next_speedup < 1:
        return f"{where}: {1 / row.next_speedup:.2f}x slower"
    return f"{where}: {row.next_speedup:.2f}x faster ({row.next_share:.0%} of linear)"


def check_knee_share(value: float) -> None:
    """The threshold is a share of a linear gain: in (0, 1]; ValueError naming it otherwise."""
    if not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise ValueError(f"the knee threshold must be in (0, 1], got {value!r}")


def answer(points: list[Point], train_tokens: float, price_per_hour: float | None,
           knee_share: float = DEFAULT_KNEE_SHARE, energy_price: float | None = None) -> Answer:
    """The rows of one configuration (one point per node count) and its fastest, cheapest and knee; the
    energy to train where a point measured its joules per token (energy_price: USD per kWh)."""
    points = sorted(points, key=lambda p: p.nodes)
    if len({p.nodes for p in points}) < len(points):  # a step up needs a larger node count
        raise ValueError(f"one point per node count, got {[p.nodes for p in points]}")
    known = [p for p in points if p.step_time_s is not None and math.isfinite(p.step_time_s)
             and p.step_time_s > 0]
    rows = {id(p): Row(p) for p in points}
    for i, p in enumerate(known):
        days = days_to_train(train_tokens, p.tokens_per_step, p.step_time_s)  # type: ignore[arg-type]
        rows[id(p)] = Row(p, efficiency=efficiency(known[0], p), days=days,
                          usd=usd_to_train(days, p.nodes, price_per_hour))
    for p in points:
        if p.j_per_token is not None and math.isfinite(p.j_per_token):
            kwh = kwh_to_train(train_tokens, p.j_per_token)
            rows[id(p)] = replace(rows[id(p)], kwh=kwh, energy_usd=energy_usd(kwh, energy_price))
    strong = len({p.tokens_per_step for p in known}) <= 1
    if strong:
        for p, nxt in zip(known, known[1:]):
            rows[id(p)] = replace(rows[id(p)], next_share=next_share(p, nxt), next_nodes=nxt.nodes,
                                  next_speedup=p.step_time_s / nxt.step_time_s)  # type: ignore[operator]
    ordered = [rows[id(p)] for p in points]
    with_days = [r for r in ordered if r.days is not None]
    fastest = min(with_days, key=lambda r: (r.days, r.point.nodes), default=None)
    # ties (linear scaling: the same node-hours) go to the faster count: the same money, sooner
    cheapest = min(with_days, key=lambda r: (round(r.node_hours or 0.0, 6), r.days), default=None)
    out = Answer(ordered, strong, knee_share, fastest, cheapest, None)
    if not strong or len(with_days) < 2:  # a knee needs a step up to judge
        return out
    short = [i for i, r in enumerate(with_days) if r.next_share is not None and r.next_share < knee_share]
    if not short:
        return replace(out, knee=with_days[-1], knee_beyond=True)
    return replace(out, knee=with_days[short[0]], knee_next=with_days[short[0] + 1])
