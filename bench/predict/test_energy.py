"""The energy to train a token budget (bench/predict/budget.py): kWh from a measured energy per token, its
cost at cluster.energy_price (USD per kWh), beside days and dollars; and the price's one-line refusal."""
from __future__ import annotations

import dataclasses
import math

import pytest

from bench.core.config import ConfigError
from bench.core.load_config import from_dict
from bench.core.validation import validate
from bench.launchers import launcher_sections
from bench.predict.budget import Point, answer, energy_usd, kwh_to_train
from bench.study.compose import compose


def test_kwh_is_tokens_times_joules_per_token_over_3_6_megajoules() -> None:
    # 1e12 tokens at 0.36 J/token: 3.6e11 J, 1e5 kWh; at 0.12 USD/kWh, 12,000 USD
    assert kwh_to_train(1e12, 0.36) == pytest.approx(1e5)
    assert energy_usd(1e5, 0.12) == pytest.approx(12_000.0)
    assert energy_usd(1e5, None) is None and energy_usd(None, 0.12) is None


def test_a_measured_node_count_gets_its_energy_beside_days_and_dollars() -> None:
    points = [Point(1, 4096.0, 1.0, "measured", j_per_token=0.36),
              Point(2, 4096.0, 0.55, "measured", j_per_token=0.40),
              Point(4, 4096.0, 0.3, "predicted (published constants)")]
    rows = answer(points, 1e12, 98.32, 0.5, energy_price=0.12).rows
    assert [r.kwh for r in rows] == [pytest.approx(1e5), pytest.approx(1e12 * 0.40 / 3.6e6), None]
    assert rows[0].energy_usd == pytest.approx(12_000.0) and rows[2].energy_usd is None
    assert rows[0].days == pytest.approx(1e12 / 4096 / 86400)  # the days are the step time's alone
    unpriced = answer(points, 1e12, 98.32, 0.5).rows
    assert unpriced[0].kwh == pytest.approx(1e5) and unpriced[0].energy_usd is None


@pytest.fixture(scope="module")
def cfg():
    return from_dict(compose(["+sweep=p5_strong"])[0], launcher_sections())


@pytest.mark.parametrize("price", [-0.01, math.nan, math.inf])
def test_a_bad_energy_price_is_one_line(cfg, price: float) -> None:
    bad = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, energy_price=price))
    with pytest.raises(ConfigError,
                       match=rf"^cluster.energy_price={price!r} must be (a finite number )?>= 0$"):
        validate(bad)


@pytest.mark.parametrize("price", [None, 0.0, 0.12])
def test_no_price_or_a_price_is_accepted(cfg, price: float | None) -> None:
    validate(dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, energy_price=price)))
