"""The plan's cost line: GPU-hours and dollars from the cluster's price table, before anything launches."""
from __future__ import annotations

import pytest

from bench.core.flops import model_flops_per_token
from bench.core.load_config import from_dict
from bench.core.models import get_arch
from bench.launchers import launcher_sections, placement_of
from bench.launchers.base import CLUSTER_STARTUP_S, MACHINE_STARTUP_S
from bench.launchers.local import LocalLauncher
from bench.launchers.slurm import SlurmLauncher
from bench.predict.cost import estimated_seconds, plan_cost
from bench.study.plan import expand
from bench.sweep import compose, main


def cfg_for(*overrides: str):
    raw, _ = compose(list(overrides))
    return from_dict(raw, launcher_sections())


def test_timeout_bound_and_gpu_hours_have_exact_answers() -> None:
    cfg = cfg_for("+sweep=p5_scaling", "axes.model=[llama2_7b]", "axes.nodes=[1,2]",
                  "axes.sharding=[FULL_SHARD]", "nccl.enabled=false", "launcher.timeout_s=900",
                  "cluster.price_per_hour=98.32")
    cost = plan_cost(expand(cfg), cfg.cluster, cfg.launcher.timeout_s, placement_of(cfg))
    assert cost.price_per_hour == 98.32
    assert cost.usd_at_timeout == pytest.approx(3 * 0.25 * 98.32)  # 1 + 2 nodes, 15 minutes each
    assert cost.gpu_hours == pytest.approx(8 * cost.instance_hours)
    assert cost.usd == pytest.approx(cost.instance_hours * 98.32)
    assert cost.usd < cost.usd_at_timeout


def test_run_time_is_start_up_plus_steps_at_the_predicted_step_time() -> None:
    """No AC: model FLOPs per token are the 6N rule plus attention; a run's time is its launcher's start-up
    plus its steps at bench/predict/perf.py's predicted step time, which activation checkpointing
    lengthens."""
    # Llama-2-7b without its input embedding
    flops = 6 * (6_738_415_616 - 32000 * 4096) + 12 * 32 * 4096 * 4096
    assert model_flops_per_token(get_arch("llama2_7b"), 4096) == flops
    cfg = cfg_for("+sweep=p5_scaling", "axes.model=[llama2_7b]", "axes.nodes=[2]",
                  "axes.sharding=[FULL_SHARD]", "axes.activation_checkpointing=[none,full]",
                  "axes.micro_batch=[2]", "nccl.enabled=false")
    runs = {p.spec.activation_checkpointing: p for p in expand(cfg)}
    none, full = runs["none"], runs["full"]
    on_slurm, here = SlurmLauncher.placement(cfg), LocalLauncher.placement(cfg)
    assert estimated_seconds(none, on_slurm) == pytest.approx(CLUSTER_STARTUP_S + 30 * none.perf.step_time_s)
    assert estimated_seconds(none, here) == pytest.approx(MACHINE_STARTUP_S + 30 * none.perf.step_time_s)
    assert full.perf.step_time_s > none.perf.step_time_s  # recompute costs time
    # a step at the 6N rule's FLOPs could not beat the H100's peak: the prediction is physical
    assert none.perf.step_time_s > 2 * 4096 * flops / 989.4e12


def test_plan_prints_the_cost_and_the_price_is_overridable(capsys, tmp_path) -> None:
    # p5.48xlarge has no price on file (AWS's June 2025 cut made the old list price wrong): none is invented
    fast = "memory.measure=false"  # the cost line does not depend on how memory was judged
    assert main(["+sweep=p5_scaling", "--dry-run", f"results_root={tmp_path}", "launcher=dryrun", fast]) == 0
    assert "no price_per_hour for p5.48xlarge" in capsys.readouterr().out
    args = ["+sweep=p5_scaling", "--dry-run", f"results_root={tmp_path}", "launcher=dryrun", fast,
            "cluster.price_per_hour=98.32"]
    assert main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cost estimate"))
    assert "at $98.32/h per p5.48xlarge instance" in line and "GPU-hours" in line
    assert main([*args, "cluster.price_per_hour=9.832"]) == 0
    cheaper = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cost estimate"))
    usd = [float(x.split(" at $")[0].split(" ")[-1].strip("$").replace(",", "")) for x in (line, cheaper)]
    assert usd[1] == pytest.approx(usd[0] / 10, rel=1e-3)
    assert main(["+sweep=smoke", "--dry-run", f"results_root={tmp_path}", fast]) == 0
    assert "no price_per_hour for local" in capsys.readouterr().out
