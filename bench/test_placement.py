"""Where and how a study's runs run is decided once, by its launcher (bench.launchers.base.Placement): no
layer tells launchers apart by name, each built-in launcher answers for its cluster, and a launcher defined
in one file of its own, with its own settings section, plans, dry-runs and runs a study with no other
edit."""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import pytest

from bench import launchers
from bench.core import rundir
from bench.core.config import POSITIVE, ConfigError, SweepConfig
from bench.core.load_config import from_dict
from bench.launchers import launcher_sections
from bench.launchers.base import CLUSTER_PROBE_S, CLUSTER_STARTUP_S, MACHINE_STARTUP_S, Placement
from bench.launchers.local import LocalLauncher
from bench.sweep import compose, main

ROOT = Path(__file__).resolve().parents[1]
# where a launcher's name may be compared with a literal: the launchers themselves, and the configuration's
# validation (a rule that holds for one launcher's options)
ALLOWED = (ROOT / "bench" / "launchers", ROOT / "bench" / "core" / "validation.py")


def cfg_of(*overrides: str) -> SweepConfig:
    return from_dict(compose(list(overrides))[0], launcher_sections())


def _is_launcher_name(node: ast.AST) -> bool:
    """`<anything>.launcher.name`, or `<anything>.launcher` / a name `launcher` (a spec's launcher field)."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        node = node.value
    return (isinstance(node, ast.Attribute) and node.attr == "launcher") or (
        isinstance(node, ast.Name) and node.id == "launcher")


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)


def name_comparisons(source: str) -> list[int]:
    """Lines that compare a launcher's name with a string (or a tuple of strings)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_launcher_name(s) for s in sides) and any(_is_literal(s) for s in sides):
                lines.append(node.lineno)
    return lines


def test_no_layer_tells_launchers_apart_by_name() -> None:
    found = []
    for path in sorted([*ROOT.glob("bench/**/*.py"), *ROOT.glob("analysis/**/*.py")]):
        if path.name.startswith("test_") or any(path == a or a in path.parents for a in ALLOWED):
            continue
        found += [f"{path.relative_to(ROOT)}:{line}" for line in name_comparisons(path.read_text())]
    assert not found, f"launcher.name compared with a literal (ask the launcher's Placement): {found}"


def test_the_check_finds_a_new_comparison() -> None:
    """The scan is not vacuous: each shape a layer could write is found, a comparison of other things not."""
    assert name_comparisons('if cfg.launcher.name == "slurm":\n    pass') == [1]
    assert name_comparisons('x = self.cfg.launcher.name in ("local", "dryrun")') == [1]
    assert name_comparisons('ok = spec.launcher != "kubernetes"') == [1]
    assert name_comparisons('ok = cfg.cluster.name == "local" and launcher.name == other') == []


@pytest.mark.parametrize("overrides,expected", [
    (("+sweep=smoke",), dict(startup_s=MACHINE_STARTUP_S, probe_s=0.0, launches=True, run_launcher="local",
                             this_machine=True, one_host=True, node_budget=None, admits_all=False,
                             preflight=False)),
    (("+sweep=smoke", "launcher=dryrun"), dict(launches=False, run_launcher="local")),
    (("+sweep=smoke", "launcher.max_nodes=3"), dict(node_budget=3)),
    (("+sweep=p5_scaling",), dict(startup_s=CLUSTER_STARTUP_S, probe_s=CLUSTER_PROBE_S, run_launcher="slurm",
                                  this_machine=False, one_host=False, node_budget=16, admits_all=False,
                                  preflight=True)),
    (("+sweep=p5_scaling", "launcher.slurm.admission=slurm"), dict(admits_all=True, node_budget=16)),
    (("+sweep=smoke", "cluster=slurm_local", "launcher=slurm"),
     dict(startup_s=MACHINE_STARTUP_S, probe_s=0.0, this_machine=True, one_host=False, preflight=True)),
    (("+sweep=p5_scaling", "launcher=kubernetes", "launcher.max_nodes=4"),
     dict(run_launcher="kubernetes", node_budget=4, admits_all=False, preflight=True)),
])
def test_each_launcher_answers_for_its_cluster(overrides: tuple[str, ...], expected: dict) -> None:
    cfg = cfg_of(*overrides)
    placement = launchers.placement_of(cfg)
    assert {k: getattr(placement, k) for k in expected} == expected


def test_an_unknown_launcher_is_one_line_before_anything_is_written(tmp_path: Path, capsys) -> None:
    known = "dryrun, inhouse, kubernetes, local, slurm"  # the built-in ones and this module's own
    with pytest.raises(ConfigError, match=rf"launcher.name: 'nope'; known: {known}"):
        launchers.launcher_for("nope")
    assert main(["+sweep=smoke", "launcher.name=nope", f"results_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "launcher.name: 'nope'" in err and not list(tmp_path.iterdir())


@dataclass
class InHouseSettings:
    """The in-house scheduler's own keys."""

    slots: Annotated[int, POSITIVE] = 2
    """Nodes' worth of runs the in-house scheduler runs side by side."""


@launchers.register
class InHouseLauncher(LocalLauncher):
    """A fourth launcher, as a user writes one for a scheduler of their own: here it runs on this machine
    like the local launcher (with the local launcher's keys), but answers for its placement itself (runs
    side by side up to its own key's nodes, a start-up of its own) and brings its own section of the
    configuration, launcher.inhouse."""

    name = "inhouse"
    settings = InHouseSettings

    @classmethod
    def placement(cls, cfg: SweepConfig) -> Placement:
        return replace(LocalLauncher.placement(cfg), run_launcher=cls.name,
                       node_budget=cfg.launcher.inhouse.slots, startup_s=3.0)


ONE_RANK = ["+sweep=smoke", "launcher.name=inhouse", "axes.gpus_per_node=[1]", "axes.nodes=[1]",
            "axes.precision=[bf16_mixed]", "axes.activation_checkpointing=[none]", "axes.compile=[false]",
            "axes.global_batch=[null]", "nccl.enabled=false", "trace.enabled=false", "steps=3",
            "warmup_steps=1", "progress=false", "memory.measure=false"]


def test_a_fourth_launchers_section_is_typed_checked_and_listed_with_no_other_edit(tmp_path: Path,
                                                                                 capsys) -> None:
    assert launchers.placement_of(cfg_of(*ONE_RANK, "launcher.inhouse.slots=3")).node_budget == 3
    for override, message in (("launcher.inhouse.slots=0", "launcher.inhouse.slots=0 must be > 0"),
                              ("launcher.inhouse.slotz=3", "unknown key launcher.inhouse.slotz; known there: "
                                                           "slots"),
                              ("launcher.inhouse.slots=many", "launcher.inhouse.slots: Value 'many'")):
        assert main([*ONE_RANK, override, f"results_root={tmp_path}"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and not list(tmp_path.iterdir()), err
    assert main(["--help-config"]) == 0
    assert ("[launcher.inhouse]\nThe in-house scheduler's own keys.\n"
            "  launcher.inhouse.slots: int (> 0) = 2\n      Nodes' worth of runs") in capsys.readouterr().out


def test_a_fourth_launcher_plans_dry_runs_and_runs_a_study_with_no_other_edit(tmp_path: Path, capsys) -> None:
    assert main([*ONE_RANK, f"results_root={tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "with launcher inhouse" in out and "schedule: 2 nodes in flight" in out
    (planned,) = rundir.iter_run_dirs(tmp_path / "smoke")
    assert json.loads((planned / rundir.SPEC_JSON).read_text())["launcher"] == "inhouse"  # in its run id
    assert main([*ONE_RANK, f"results_root={tmp_path}"]) == 0
    (summary,) = rundir.read_summaries(tmp_path / "smoke")
    assert summary.status == "ok" and summary.spec.launcher == "inhouse" and summary.tokens_per_s > 0
    ledger = rundir.read_ledger(planned)
    assert [a["launcher"] for a in ledger] == ["inhouse"] and summary.run_dir == str(planned)
