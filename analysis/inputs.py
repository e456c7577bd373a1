"""What the report's sections (analysis/sections.py) are built from: the loaded results and what several
sections read of them, each computed once, the first time a section asks for it."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pandas as pd

from analysis import system
from analysis.bounds import bounds_table
from analysis.comm import achieved, comm_model
from analysis.cost import run_costs, sweep_energy_prices, sweep_prices, with_energy
from analysis.first_screen import best_peak, with_mfu_peak
from analysis.load import Loaded
from analysis.nodes import preflight_table
from analysis.parity import loss_parity
from analysis.predicted import extrapolation_table, memory_table, throughput_table
from analysis.scaling import aggregate, headline, nccl_sizes, nccl_summary
from analysis.step_split import split_table
from analysis.strong import strong_rows, study_settings
from analysis.winback import Verdict, verdicts
from bench.predict.budget import DEFAULT_KNEE_SHARE, DEFAULT_TRAIN_TOKENS


@dataclass
class ReportInputs:
    """The results a report is made of, and the settings it reads them with."""

    loaded: Loaded
    prices: dict[str, float | None]  # USD per instance-hour, by cluster
    train_tokens: float  # the budget the days, dollars and kWh to train are for
    knee_share: float  # bench/core/config.py StudyConfig.knee_share

    @property
    def frame(self) -> pd.DataFrame:
        return self.loaded.frame

    @property
    def budget(self) -> str:
        """The token budget as the columns it is for name it: "1e+12 tokens"."""
        return f"{self.train_tokens:.3g} tokens"

    @cached_property
    def energy_prices(self) -> dict[str, float | None]:
        return sweep_energy_prices(self.loaded.sweeps)

    @cached_property
    def agg(self) -> pd.DataFrame:
        """Per configuration and node count, over its repeats (analysis/scaling.py aggregate)."""
        return with_mfu_peak(with_energy(aggregate(self.frame), self.frame), self.frame)

    @cached_property
    def answers(self) -> pd.DataFrame:
        """analysis/strong.py's rows, strong and weak: days and dollars per node count."""
        return strong_rows(self.agg, self.prices, self.train_tokens, self.knee_share, self.loaded.plan,
                           self.energy_prices)

    @cached_property
    def best(self) -> pd.DataFrame:
        """The headline's rows: the configuration the answer names, at each node count."""
        return best_peak(headline(self.agg)[1], self.agg)

    @cached_property
    def probes(self) -> pd.DataFrame:
        return nccl_summary(self.frame)

    @property
    def one_rank(self) -> pd.DataFrame:
        """One-rank probes: no network to measure (bus bandwidth is 0 on one rank)."""
        probes = self.probes
        return probes[probes["nodes"] * probes["gpus_per_node"] == 1] if len(probes) else probes

    @cached_property
    def sizes(self) -> pd.DataFrame:
        return nccl_sizes(self.frame)

    @cached_property
    def got(self) -> pd.DataFrame:
        """What each run got of the network (analysis/comm.py achieved)."""
        return achieved(self.frame, self.sizes) if not self.sizes.empty else pd.DataFrame()

    @cached_property
    def bounds(self) -> pd.DataFrame:
        """Per planned configuration and node count, what bounds each collective (analysis/bounds.py)."""
        return bounds_table(self.loaded.plan, self.loaded.sweeps)

    @cached_property
    def comm(self) -> pd.DataFrame:
        return comm_model(self.agg, self.sizes) if not self.sizes.empty else pd.DataFrame()

    @cached_property
    def split(self) -> pd.DataFrame:
        """Where each step went (analysis/step_split.py split_table)."""
        return split_table(self.frame)

    @cached_property
    def verdicts(self) -> list[Verdict]:
        """Per configuration traced at two node counts, its loss and the change that wins it back."""
        return verdicts(self.frame, self.split, self.loaded.sweeps) if not self.split.empty else []

    @cached_property
    def systems(self) -> dict[str, system.SystemRecords]:
        return system.system_records(self.frame)

    @cached_property
    def runs_cost(self) -> pd.DataFrame:
        return run_costs(self.frame, self.prices)

    @cached_property
    def memory(self) -> pd.DataFrame:
        return memory_table(self.agg)

    @cached_property
    def predicted(self) -> pd.DataFrame:
        return throughput_table(self.agg)

    @cached_property
    def extrapolated(self) -> tuple[pd.DataFrame, list[str]]:
        return extrapolation_table(self.loaded.sweeps)

    @cached_property
    def preflight(self) -> tuple[pd.DataFrame, list[str]]:
        return preflight_table(self.loaded.sweeps)

    @cached_property
    def parity(self) -> pd.DataFrame:
        return loss_parity(self.frame)


def report_inputs(loaded: Loaded, prices: dict[str, float] | None = None, train_tokens: float | None = None,
                  knee_share: float | None = None) -> ReportInputs:
    """The inputs, with the sweeps' prices and study settings where the command line gives none: prices
    override the sweeps' own price_per_hour by cluster; train_tokens and knee_share the study's
    study.train_tokens (else DEFAULT_TRAIN_TOKENS) and study.knee_share."""
    settings = study_settings(loaded.sweeps)
    return ReportInputs(loaded, {**sweep_prices(loaded.sweeps), **(prices or {})},
                        train_tokens or settings.get("train_tokens") or DEFAULT_TRAIN_TOKENS,
                        knee_share or settings.get("knee_share", DEFAULT_KNEE_SHARE))
