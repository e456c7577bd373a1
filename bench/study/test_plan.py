"""Planning and validation on configs composed by Hydra from sweeps/, exactly as the CLI does."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace

import pytest

from bench.core import faults
from bench.core.config import ConfigError
from bench.core.load_config import from_dict
from bench.core.models import block_params, count_params, get_arch
from bench.core.schema import FAULTS_ENV, RunSpec
from bench.launchers import launcher_sections, placement_of
from bench.predict.memory import MemoryFigure, states_gib
from bench.study.plan import auto_starts, expand, feasibility, micro_batch_sizes
from bench.sweep import compose, main


def plan_for(*overrides: str):
    raw, _ = compose(list(overrides))
    return expand(from_dict(raw, launcher_sections()))


def test_smoke_full_plan_is_the_product_minus_exclusions() -> None:
    plan = plan_for("+sweep=smoke_full")
    train = [p.spec for p in plan if p.spec.kind == "train"]
    two = [s for s in train if s.gpus_per_node == 2]
    # 2 GPUs/node: 2 nodes x (FULL_SHARD: 2 precisions x 2 AC + 3 other strategies x bf16 x no AC), and the
    # strong-scaling pair: FULL_SHARD bf16 without AC at one global batch of 8 on both node counts
    assert len(two) == 2 * (4 + 3) + 2
    strong = [s for s in two if s.global_batch]
    assert [(s.nodes, s.global_batch, s.micro_batch, s.grad_accum, s.sequences_per_step) for s in strong] == [
        (1, 8, 2, 2, 8), (2, 8, 2, 1, 8)]
    assert {(s.sharding, s.precision, s.activation_checkpointing) for s in strong} == {
        ("FULL_SHARD", "bf16_mixed", "none")}
    assert {s.sharding for s in two} == {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"}
    assert not [s for s in two if s.sharding != "FULL_SHARD" and s.activation_checkpointing == "full"]
    # 1 GPU/node (what a one-GPU machine runs on its GPU): 1 node, FULL_SHARD, 4 precisions x 2 AC modes
    one = [s for s in train if s.gpus_per_node == 1]
    assert len(one) == 9 and {(s.nodes, s.sharding) for s in one} == {(1, "FULL_SHARD")}
    compiled = [s for s in train if s.compile]  # plus one compiled run: bf16, no AC
    assert [(s.precision, s.activation_checkpointing, s.gpus_per_node) for s in compiled] == [
        ("bf16_mixed", "none", 1)]
    assert len(train) == len(one) + len(two)
    probes = [p.spec for p in plan if p.spec.kind == "nccl"]  # each point probes the three collectives
    points = [(1, 1), (1, 2), (2, 1), (2, 2)]
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        assert sorted((s.nodes, s.gpus_per_node) for s in probes if s.collective == collective) == points
    assert len(probes) == 3 * len(points)
    # the all-reduce probes carry no study sizes (their run ids predate the other collectives); the gather's
    # and reduce-scatter's carry one tiny_llama block's messages: gathered in 4 (fp32) or 2 bytes, reduced
    # in 4 (or 2 under bf16_pure)
    assert {s.nccl_sizes for s in probes if s.collective == "all_reduce"} == {""}
    block = max(block_params(get_arch("tiny_llama")))
    assert {s.study_sizes for s in probes if s.collective == "all_gather"} == {(2 * block, 4 * block)}
    assert {s.study_sizes for s in probes if s.collective == "reduce_scatter"} == {(2 * block, 4 * block)}
    assert all(s.cluster == "local" for s in train)


def test_the_quick_smoke_keeps_every_strategy_precision_ac_mode_compile_and_collective() -> None:
    """The smoke a CI runs on every push: 22 runs of smoke_full's 37, each axis value still in it."""
    full = {p.spec.run_id for p in plan_for("+sweep=smoke_full")}
    plan = plan_for("+sweep=smoke")
    assert {p.spec.run_id for p in plan} <= full and len(plan) == 22
    train = [p.spec for p in plan if p.spec.kind == "train"]
    two = [s for s in train if s.gpus_per_node == 2]
    # every strategy at 1 and 2 nodes in bf16 without AC, and the strong-scaling pair
    strategies = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
    assert sorted((s.sharding, s.nodes) for s in two if not s.global_batch) == sorted(
        (sharding, n) for sharding in strategies for n in (1, 2))
    assert {(s.precision, s.activation_checkpointing) for s in two} == {("bf16_mixed", "none")}
    assert sorted((s.nodes, s.global_batch) for s in two if s.global_batch) == [(1, 8), (2, 8)]
    # one rank: every precision with AC full, bf16 without, eager and compiled
    one = sorted((s.precision, s.activation_checkpointing, s.compile) for s in train if s.gpus_per_node == 1)
    assert one == sorted([(p, "full", False) for p in ("fp32", "bf16_mixed", "fp16_mixed", "bf16_pure")]
                         + [("bf16_mixed", "none", False), ("bf16_mixed", "none", True)])
    probes = [p.spec for p in plan if p.spec.kind == "nccl"]
    assert sorted((s.collective, s.nodes, s.gpus_per_node) for s in probes) == sorted(
        (c, n, 2) for c in ("all_reduce", "all_gather", "reduce_scatter") for n in (1, 2))


def test_run_ids_are_stable_and_unique() -> None:
    a, b = plan_for("+sweep=smoke"), plan_for("+sweep=smoke")
    assert [p.spec.run_id for p in a] == [p.spec.run_id for p in b]
    assert len({p.spec.run_id for p in a}) == len(a)
    changed = plan_for("+sweep=smoke", "steps=7")
    train_ids = {p.spec.run_id for p in a if p.spec.kind == "train"}
    assert not train_ids & {p.spec.run_id for p in changed}
    # all-reduce probes do not train, so their identity does not depend on steps
    assert {p.spec.run_id for p in a if p.spec.kind == "nccl"} <= {p.spec.run_id for p in changed}


def test_command_line_overrides_any_axis() -> None:
    plan = plan_for("+sweep=smoke", "axes.nodes=[1]", "axes.sharding=[NO_SHARD]", "nccl.enabled=false")
    assert [(p.spec.nodes, p.spec.sharding) for p in plan] == [(1, "NO_SHARD")]


def test_p5_plan_marks_what_cannot_fit_on_80gb() -> None:
    plan = {(p.spec.model, p.spec.sharding, p.spec.nodes): p for p in plan_for("+sweep=p5_scaling")
            if p.spec.kind == "train"}
    assert len(plan) == 3 * 2 * 5
    # 70B under HYBRID_SHARD shards over one node's 8 GPUs only: 16 B/param of state / 8 = 138 GB.
    states_gib = count_params(get_arch("llama2_70b")) * 16 / 8 / 2**30
    assert states_gib > 80
    assert all(not plan[("llama2_70b", "HYBRID_SHARD", n)].feasible for n in (1, 2, 4, 8, 16))
    assert not plan[("llama2_70b", "FULL_SHARD", 1)].feasible
    assert plan[("llama2_70b", "FULL_SHARD", 16)].feasible  # 138 GB / 16 = 8.6 GB of state
    assert all(plan[("llama2_7b", s, n)].feasible for s in ("FULL_SHARD", "HYBRID_SHARD") for n in (1, 16))
    assert "GiB/GPU" in plan[("llama2_70b", "FULL_SHARD", 1)].reason


def test_every_shipped_sweep_plans() -> None:
    for name in ("smoke", "p5_scaling", "p4de_scaling", "ablation", "efa_probe"):
        assert plan_for(f"+sweep={name}"), name


def test_efa_probe_plans_every_adapter_count() -> None:
    plan = plan_for("+sweep=efa_probe")
    assert {(p.spec.nodes, p.spec.efa_per_node) for p in plan} == {
        (n, e) for n in (1, 2, 4, 8, 16) for e in (0, 1, 4, 32)}
    assert all(p.spec.kind == "nccl" for p in plan) and len(plan) == 20 * 3 * 3  # 3 repeats, 3 collectives
    assert {p.spec.collective for p in plan} == {"all_reduce", "all_gather", "reduce_scatter"}


def test_ablation_changes_one_factor_at_a_time() -> None:
    train = [p.spec for p in plan_for("+sweep=ablation")]
    best = ("FULL_SHARD", "bf16_mixed", "full", "transformer_block")
    for s in train:
        point = (s.sharding, s.precision, s.activation_checkpointing, s.wrap_policy)
        assert sum(a != b for a, b in zip(point, best)) <= 1
    assert len(train) == 2 * 2 * 6  # models x nodes x (best + 5 single changes)


@pytest.mark.parametrize("overrides,message", [
    (["axes.model=[gpt5]"], "model 'gpt5' is neither a preset"),
    (["axes.sharding=[FULLSHARD]"], "FULLSHARD"),
    (["cluster.gpus_per_node=1", "axes.gpus_per_node=[1]"], "HYBRID_SHARD needs >= 2 GPUs per node"),
    (["axes.nodes=[1,8]"], "exceed cluster local's max_nodes=4"),
    (["steps=3", "warmup_steps=3"], "warmup_steps"),
    (["exclude=[{colour: red}]"], "exclude[0]"),
    (["+axes.colour=[red]"], "unknown key axes.colour; known there: model, nodes"),
    (["sweep_name=../../etc"], "sweep_name='../../etc': a plain name"),
    (["sweep_name=/etc"], "a plain name"),
    (["results_root=/proc/nope"], "cannot create the sweep dir /proc/nope/smoke"),
    (["axes.gpus_per_node=[4]"], "axes.gpus_per_node: [4] exceed cluster local's gpus_per_node=2"),
    # a string where a number belongs, before anything is written or launched
    (["seed=abc"], "seed: Value 'abc' of type 'str' could not be converted to Integer"),
    (["nccl.iters=abc"], "nccl.iters: Value 'abc'"),
    (["nccl.min_bytes=abc"], "nccl.min_bytes: Value 'abc'"),
    (["micro_batch_search.warmup_steps=abc"], "micro_batch_search.warmup_steps: Value 'abc'"),
    (["cluster.price_per_hour=abc"],
     "cluster.price_per_hour: Value 'abc' of type 'str' could not be converted to Float"),
    (["launcher.timeout_s=abc"], "launcher.timeout_s: Value 'abc'"),
    (["launcher.poll_s=abc"], "launcher.poll_s: Value 'abc'"),
    (["launcher.timeout_s=-5"], "launcher.timeout_s=-5.0 must be > 0"),
    (["launcher.timeout_s=inf"], "launcher.timeout_s=inf must be a finite number > 0"),
    # typos are refused, not ignored: `+dry_runn=true` would launch for real
    (["+bogus_key=1"], "unknown key bogus_key; known there: sweep_name"),
    (["+dry_runn=true"], "unknown key dry_runn; known there: sweep_name, results_root, dry_run"),
    (["+steps_typo=5"], "unknown key steps_typo"),
    (["launcher.slurm.partitionn=p5"],
     "unknown key launcher.slurm.partitionn; known there: partition, account"),
    # `+` does not get past the schema
    (["+launcher.slurm.partitionn=p5"], "unknown key launcher.slurm.partitionn"),
    (["axes.nodes=4"], "axes.nodes: must be a list, e.g. [4]"),
    (["axes.nodes=[1,x]"], "axes.nodes[1]: Value 'x'"),
    (["launcher.max_nodes=0"], "launcher.max_nodes=0 must be > 0"),
    (["cluster=nope"], "Could not find 'cluster/nope'; available: a3-megagpu-8g, dgx-h100-ib, ethernet-tcp"),
    # a global batch that no run can split, and accumulation modes where they cannot act
    (["axes.global_batch=[0]"], "axes.global_batch=0 must be > 0"),
    (["axes.global_batch=[-8]"], "axes.global_batch=-8 must be > 0"),
    (["axes.global_batch=[1.5]"], "axes.global_batch[0]: Value '1.5' of type 'float' could not be converted"),
    (["axes.global_batch=[6]", "axes.micro_batch=[1]"],
     "global_batch 6 is not divisible by the 4 data-parallel ranks of 2 node(s) x 2 GPUs"),
    (["axes.global_batch=[12]", "axes.micro_batch=[4]"],
     "micro_batch 4 does not divide the 6 sequences per rank"),
    (["axes.global_batch=[2]", "axes.nodes=[2]"],
     "global_batch 2 is not divisible by the 4 data-parallel ranks"),
    (["axes.accumulation=[sync_once]", "axes.global_batch=[null]"], "axes.accumulation ['sync_once'] needs "
     "axes.global_batch"),
    (["axes.accumulation=[sync_twice]"], "axes.accumulation: unknown value 'sync_twice'"),
    (["axes.accumulation=[allreduce_once]", "axes.global_batch=[8]"],
     "accumulation=allreduce_once defers HYBRID_SHARD's all-reduce across nodes; FULL_SHARD has none"),
    (["axes.accumulation=[keep_gathered]", "axes.global_batch=[16]", "axes.sharding=[NO_SHARD]"],
     "accumulation=keep_gathered keeps gathered parameters; NO_SHARD never shards them"),
    (["study.train_tokens=-1"], "study.train_tokens=-1.0 must be > 0"),
    (["study.knee_share=1.5"], "study.knee_share=1.5 must be in (0, 1]"),
    # probes of a collective nccl-tests and the torch probe do not run, or of adapters the instance lacks
    (["nccl.collectives=[all_reduce,broadcast]"],
     "nccl.collectives: unknown collective(s) ['broadcast']; known: all_reduce, all_gather, reduce_scatter"),
    (["nccl.collectives=[]"], "nccl.collectives is empty: name at least one of all_reduce"),
    (["cluster=p5.48xlarge", "nccl.efa_per_node=[0,64]"],
     "nccl.efa_per_node: 64 EFA adapters per node, but p5.48xlarge has 32 (cluster p5.48xlarge)"),
    (["cluster=p5.48xlarge", "axes.efa_per_node=[48]"],
     "axes.efa_per_node: 48 EFA adapters per node, but p5.48xlarge has 32 (cluster p5.48xlarge)"),
])
def test_bad_config_is_one_line_and_exit_2(overrides, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative results_root would land here: nothing may be written
    assert main(["+sweep=smoke", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_no_sweep_lists_the_sweeps(capsys) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "+sweep=NAME" in err and "p5_scaling" in err and "smoke" in err
    assert main(["sweep=smoke"]) == 2  # Hydra's hint is kept
    assert "(to append to your default list use +sweep=smoke)" in capsys.readouterr().err


def test_unknown_sweep_is_a_config_error(capsys) -> None:
    assert main(["+sweep=nope"]) == 2
    err = capsys.readouterr().err
    assert "sweep/nope" in err and "available: ablation, efa_probe" in err and err.count("\n") == 1


@pytest.mark.parametrize("override,message", [
    ("cluster.slurm.partition=p5", "cluster.slurm.partition has moved: set launcher.slurm.partition (each "
     "launcher owns its keys)"),
    ("+cluster.kubernetes.image=reg.io/x:1", "set launcher.kubernetes.image"),
    ("launcher.python=/opt/venv/bin/python", "set launcher.local.python or launcher.slurm.python"),
    ("launcher.warm_workers=false", "set launcher.local.warm_workers or launcher.slurm.warm_workers"),
    ("launcher.workdir=/fsx/fsdpbench", "set launcher.slurm.workdir"),
    ("launcher.kubeconfig=/k", "set launcher.kubernetes.kubeconfig"),
    ("launcher.context=prod", "set launcher.kubernetes.context"),
    ("faults=[{match:{},fault:hang}]", "faults is no setting any more: faults are a test hook, given in "
     "$FSDPBENCH_FAULTS"),
])
def test_an_old_key_is_one_line_naming_its_new_key(override: str, message: str, capsys, tmp_path,
                                                   monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["+sweep=smoke", override, f"results_root={tmp_path}/r"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("group,text,message", [
    ("cluster", "slurm:\n  partition: debug\n",
     "cluster/mine.yaml: cluster.slurm has moved: set launcher.slurm"),
    ("launcher", "kubeconfig: /k\n", "launcher/mine.yaml: launcher.kubeconfig has moved: set "
     "launcher.kubernetes.kubeconfig")])
def test_an_old_key_in_a_yaml_file_is_one_line_naming_its_new_key(group: str, text: str, message: str,
                                                                   capsys, tmp_path) -> None:
    """A file of the old layout, as a user's own copy would still have it (found on Hydra's search path)."""
    head = {"cluster": "name: mine\ninstance_type: local\ngpus_per_node: 2\nmax_nodes: 4\n",
            "launcher": "name: kubernetes\n"}[group]
    (tmp_path / "mine" / group).mkdir(parents=True)
    (tmp_path / "mine" / group / "mine.yaml").write_text(head + text)
    assert main(["+sweep=smoke", f"{group}=mine", f"hydra.searchpath=[file://{tmp_path / 'mine'}]",
                 f"results_root={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message} (each launcher owns its keys)\n" and not (tmp_path / "r").exists()


def test_a_fault_named_nan_is_a_name_not_a_number(monkeypatch) -> None:
    monkeypatch.setenv(FAULTS_ENV, "[{match: {precision: fp32}, fault: nan}]")
    assert faults.rules()[0].fault == "nan"


@pytest.mark.parametrize("text,message", [
    ("[{match: {precison: fp32}, fault: nan}]", "FSDPBENCH_FAULTS: unknown match key(s) precison"),
    ("[{match: {}, fault: slow_collective, collective: all_gatherr}]",
     "FSDPBENCH_FAULTS: unknown collective 'all_gatherr'; known: all_reduce, all_gather, reduce_scatter"),
    ("[{match: {}, fault: explode}]", "FSDPBENCH_FAULTS: unknown fault 'explode'; known: none, oom"),
    ("[{match: {}, fault: hang, stepp: 1}]",
     "FSDPBENCH_FAULTS: unknown key stepp; known there: match, fault"),
    ("{fault: hang}", "FSDPBENCH_FAULTS must be a list of rules"),
    ("[{fault: [}]", "FSDPBENCH_FAULTS: not YAML"),
])
def test_a_bad_fault_rule_is_one_line_before_anything_is_written(text: str, message: str, capsys, tmp_path,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv(FAULTS_ENV, text)
    assert main(["+sweep=smoke", f"results_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_a_fault_rule_reaches_the_command_line_of_the_workers_it_matches(monkeypatch, tmp_path) -> None:
    """$FSDPBENCH_FAULTS -> each matching run's worker arguments (--fault ...), and no other run's; the run
    ids are the same with the rule and without (a test hook, not what a run measures)."""
    from bench.launchers.local import LocalLauncher
    cfg = from_dict(compose(["+sweep=smoke", f"results_root={tmp_path}"])[0], launcher_sections())
    specs = [p.spec for p in expand(cfg) if p.spec.kind == "train"]
    assert {s.precision for s in specs} >= {"fp32", "bf16_mixed"}
    monkeypatch.setenv(FAULTS_ENV, "[{match: {precision: fp32}, fault: hang, step: 2, rank: 1}]")
    assert [p.spec.run_id for p in expand(cfg) if p.spec.kind == "train"] == [s.run_id for s in specs]
    for spec in specs:
        argv = list(LocalLauncher(cfg, gpus=[]).render(spec, tmp_path).argvs[0])
        at = argv.index("--fault") if "--fault" in argv else len(argv)
        hang = ["--fault", "hang", "--fault-step", "2", "--fault-rank", "1"]
        assert argv[at:at + 6] == (hang if spec.precision == "fp32" else []), spec.label


def test_faults_are_no_key_of_the_configuration(capsys) -> None:
    """The test hook is kept out of what a user reads: the schema, --help-config and the saved sweep.yaml."""
    assert main(["--help-config"]) == 0
    listing = capsys.readouterr().out
    assert "launcher.timeout_s: float (> 0) = 900" in listing and not re.search(r"\bfaults?\b", listing)
    raw, yaml_text = compose(["+sweep=smoke"])
    assert "faults" not in raw and not re.search(r"\bfaults?\b", yaml_text)


def test_config_error_type_is_raised_by_from_dict() -> None:
    raw, _ = compose(["+sweep=smoke"])
    raw["axes"]["micro_batch"] = [0]
    with pytest.raises(ConfigError, match="positive integer"):
        from_dict(raw, launcher_sections())


class GrowingMemory:
    """A memory source whose peak grows with the micro batch: 10 GiB + 3 GiB per sequence."""

    def prefetch(self, specs: list[RunSpec]) -> None:
        pass

    def figure(self, spec: RunSpec) -> MemoryFigure:
        return MemoryFigure(10.0 + 3.0 * spec.micro_batch, 0.0, "measured")


def test_auto_micro_batch_starts_at_the_largest_power_of_two_that_fits() -> None:
    """On 80 GiB: (10 + 3m) x 1.10 + 0.5 + NCCL <= 80 holds up to m = 20, so the search starts at 16."""
    raw, _ = compose(["+sweep=p5_scaling", "axes.model=[llama2_13b]", "axes.nodes=[1]",
                      "axes.micro_batch=[auto]", "axes.activation_checkpointing=[none]",
                      "nccl.enabled=false"])
    cfg = from_dict(raw, launcher_sections())
    plan = expand(cfg, GrowingMemory())
    assert plan and all(p.spec.micro_batch == 0 and "mbauto" in p.spec.label and p.feasible for p in plan)
    assert {p.micro_batch_start for p in plan} == {16}
    assert {p.memory.gpu_gib for p in plan} == {10.0 + 3.0 * 16}  # the figure of the size that launches first
    unmeasured = expand(cfg)  # the lower bound does not grow with the micro batch: start at the top
    assert {p.micro_batch_start for p in unmeasured} == {cfg.micro_batch_search.max}
    local = plan_for("+sweep=smoke", "axes.micro_batch=[auto,2]", "micro_batch_search.max=6",
                     "nccl.enabled=false")
    weak = [p for p in local if p.spec.micro_batch == 0 and not p.spec.global_batch]
    assert {p.micro_batch_start for p in weak} == {4}  # no memory limit: 4 <= 6
    assert {p.spec.micro_batch for p in local} == {0, 2}
    # at one global batch of 8: the largest size that divides each rank's share (4 on 2 ranks, 2 on 4)
    strong = [p for p in local if p.spec.micro_batch == 0 and p.spec.global_batch]
    assert sorted((p.spec.nodes, p.micro_batch_start) for p in strong) == [(1, 4), (2, 2)]


class CountingMemory:
    """A peak given as a function of the micro batch, over the run's states (as the measured peaks are:
    the same curve at every node count) or not (`over_states=False`: a shape the search must survive);
    counts the rounds (prefetches) and measurements."""

    def __init__(self, peak: Callable[[int], float], over_states: bool = True) -> None:
        self.peak, self.over_states, self.rounds, self.measured = peak, over_states, 0, 0

    def prefetch(self, specs: list[RunSpec]) -> None:
        self.rounds, self.measured = self.rounds + 1, self.measured + len(specs)

    def figure(self, spec: RunSpec) -> MemoryFigure:
        gib = self.peak(spec.micro_batch) + states_gib(spec) * self.over_states
        return MemoryFigure(gib, 0.0, "measured")


@pytest.mark.parametrize("name,peak", [
    ("affine", lambda m: 10.0 + 3.0 * m),
    ("affine, steep", lambda m: 2.0 + 9.5 * m),
    ("convex", lambda m: 10.0 + 0.05 * m * m),
    ("a step", lambda m: 20.0 + (40.0 if m > 5 else 0.0)),
    ("nothing fits", lambda m: 90.0 + m),
    ("everything fits", lambda m: 1.0 + 0.01 * m),
])
@pytest.mark.parametrize("over_states", [True, False])
def test_the_micro_batch_search_finds_what_trying_every_size_finds(name: str, peak,
                                                                    over_states: bool) -> None:
    """The largest size whose need fits 80 GiB, as trying each size in turn finds it, whatever the shape of
    the peak; an affine peak over the states (the real shape) is settled in two rounds of measurement."""
    raw, _ = compose(["+sweep=p5_scaling", "axes.model=[llama2_13b]", "axes.nodes=[1,2,4]",
                      "axes.micro_batch=[auto]", "axes.activation_checkpointing=[none]", "nccl.enabled=false",
                      "micro_batch_search.max=64", "axes.global_batch=[null,96]"])
    cfg = from_dict(raw, launcher_sections())
    specs = [p.spec for p in expand(cfg)]
    memory = CountingMemory(peak, over_states)
    found = auto_starts(cfg, specs, memory)
    for spec in specs:
        fitting = [m for m in micro_batch_sizes(spec, 64)
                   if feasibility(cfg, replace(spec, micro_batch=m), memory)[1]]
        start, figure, feasible, _ = found[spec.run_id]
        assert (start, feasible) == ((max(fitting), True) if fitting else (1, False)), (name, spec.label)
        assert figure.gpu_gib == memory.figure(replace(spec, micro_batch=start)).gpu_gib
    assert memory.rounds <= (2 if name.startswith("affine") and over_states else 4), (name, memory.rounds)


@pytest.mark.parametrize("override,message", [
    ("axes.micro_batch=[0]", "axes.micro_batch must be a positive"),
    ("axes.micro_batch=[big]", "axes.micro_batch must be a positive"),
    ("micro_batch_search.max=0", "micro_batch_search.max=0 must be > 0")])
def test_micro_batch_values_are_checked(override: str, message: str) -> None:
    raw, _ = compose(["+sweep=smoke", override])
    with pytest.raises(ConfigError, match=message):
        from_dict(raw, launcher_sections())


def test_a_key_inside_a_section_the_cluster_leaves_null_is_one_line() -> None:
    """The smoke's cluster has no fabric.scale_out: setting a field of it names the cluster file to write;
    a cluster that has the section takes the field, and a value NCCL has no path for is refused by name."""
    with pytest.raises(ConfigError, match=r"^cluster.fabric.scale_out.nic_path: cluster.fabric.scale_out is "
                                          r"null in this configuration; set it whole \(cluster.fabric."
                                          r"scale_out=\{...\}\) or describe it in a cluster file"):
        compose(["+sweep=smoke", "cluster.fabric.scale_out.nic_path=phb"])
    tcp = ["+sweep=p5_scaling", "cluster=ethernet-tcp", "axes.efa_per_node=[0]", "nccl.efa_per_node=[0]"]
    raw, _ = compose([*tcp, "cluster.fabric.scale_out.nic_path=phb"])
    assert from_dict(raw, launcher_sections()).cluster.fabric.scale_out.nic_path == "phb"
    raw, _ = compose([*tcp, "cluster.fabric.scale_out.nic_path=nvl"])
    with pytest.raises(ConfigError, match="nic_path"):
        from_dict(raw, launcher_sections())


def test_a_section_the_cluster_leaves_null_can_be_set_whole_on_the_command_line() -> None:
    """`cluster.fabric.scale_out={...}` fills the section's schema from the mapping (its unset fields keep
    their defaults), a later override inside it applies after it, and a key the schema lacks is one line."""
    whole = "cluster.fabric.scale_out={transport:infiniband,adapters:8,gbps:400,rdma:true}"
    raw, _ = compose(["+sweep=smoke", whole, "cluster.fabric.scale_out.gbps=200"])
    out = from_dict(raw, launcher_sections()).cluster.fabric.scale_out
    assert (out.transport, out.adapters, out.gbps, out.rdma, out.nic_path) == (
        "infiniband", 8, 200.0, True, "pxb")
    with pytest.raises(ConfigError, match="^cluster.fabric.scale_out.gbps: .* is null"):  # before it
        compose(["+sweep=smoke", "cluster.fabric.scale_out.gbps=100", whole])
    with pytest.raises(ConfigError, match="speed"):
        compose(["+sweep=smoke", "cluster.fabric.scale_out={transport:roce,speed:400}"])


def test_a_dry_run_plans_the_run_ids_the_launch_will_use() -> None:
    launch = [p.spec.run_id for p in plan_for("+sweep=smoke")]
    assert [p.spec.run_id for p in plan_for("+sweep=smoke", "launcher=dryrun")] == launch
    assert [p.spec.run_id for p in plan_for("+sweep=smoke", "dry_run=true")] == launch


@pytest.mark.parametrize("overrides,message", [
    (["launcher.kubernetes.namespace=Bad_NS"],
     "launcher.kubernetes.namespace='Bad_NS' is not an RFC 1123 label"),
    (["launcher.kubernetes.shm_size=lots"], "launcher.kubernetes.shm_size='lots' is not a quantity"),
    (["launcher.kubernetes.image='Registry/My Image:1'"], "is not an image reference"),
    (["launcher.kubernetes.image_pull_secret=Not_A_Name"], "is not a Secret name"),
    ([], "set launcher.kubernetes.image to your worker image"),  # --dry-run without an image: one line
])
def test_bad_kubernetes_values_are_one_line_before_anything_is_written(overrides, message, capsys, tmp_path,
                                                                      monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["+sweep=p5_scaling", "launcher=kubernetes", "--dry-run", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides,message", [
    (["+sweep=ablation", "axes.precision=[bf16_mixed,fp8_tensorwise]"],
     "fp8_tensorwise needs FP8 tensor cores (H100, H200, L4, B200); cluster p4de.24xlarge has "
     "A100-SXM4-80GB"),
    (["+sweep=smoke", "axes.offload=[none,cpu]"],
     "axes.offload: cpu moves training state from GPU to host memory"),
    (["+sweep=smoke", "axes.compile=[true]", "warmup_steps=0"], "the first step compiles every block"),
    (["+sweep=smoke", "axes.offload=[disk]"], "axes.offload: unknown value 'disk'"),
    (["+sweep=smoke", "axes.compile=[maybe]"], "axes.compile[0]: Value 'maybe'"),
])
def test_bad_combinations_of_the_new_axes_are_one_line(overrides, message, capsys, tmp_path,
                                                       monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*overrides, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_offload_moves_the_states_to_host_memory_and_checks_it() -> None:
    from bench.predict.memory import lower_bound
    spec = RunSpec(model="llama2_70b", nodes=1, gpus_per_node=8, precision="bf16_mixed")
    on_gpu, offloaded = lower_bound(spec, "-"), lower_bound(replace(spec, offload="cpu"), "-")
    states = count_params(get_arch("llama2_70b")) * 16 / 8 / 2**30  # fp32 params + grads + 2 AdamW moments
    assert (on_gpu.gpu_gib, on_gpu.host_gib) == (pytest.approx(states), 0.0)
    assert (offloaded.gpu_gib, offloaded.host_gib) == (0.0, pytest.approx(states))
    # 70B on p4de: 8 x 140 GB of state = 1043 GiB per node > 80% of its 1152 GiB at 1 node, fits at 2
    plan = {(p.spec.nodes, p.spec.offload): p for p in plan_for(
        "+sweep=ablation", "axes.model=[llama2_70b]", "axes.nodes=[1,2]", "axes.offload=[none,cpu]",
        "axes.sharding=[FULL_SHARD]", "axes.precision=[bf16_mixed]", "axes.activation_checkpointing=[full]",
        "axes.wrap_policy=[transformer_block]", "exclude=[]", "axes.seq_len=[4096]", "axes.micro_batch=[1]")}
    assert not plan[(1, "cpu")].feasible and "host memory per node" in plan[(1, "cpu")].reason
    assert plan[(2, "cpu")].feasible and not plan[(1, "none")].feasible  # 140 GB of state per 80 GB GPU
    assert plan[(2, "cpu")].memory.gpu_gib < plan[(2, "none")].memory.gpu_gib


def test_new_axes_keep_the_run_ids_of_existing_studies() -> None:
    from bench.core.schema import RunSpec
    # schema v1's ids, pinned: a field added at its default (ADDED_DEFAULTS) keeps them, finished runs done
    assert RunSpec().run_id == "af7c06e5bab4"
    assert RunSpec(model="llama3_2_1b", nodes=2, gpus_per_node=8, activation_checkpointing="full").run_id == \
        "4e470e409415"
    on = RunSpec(compile=True, offload="cpu")
    assert (on.run_id != RunSpec().run_id
            and on.label.endswith("transformer_block-compile-offcpu-mb1-s128-efa0-r0"))
    assert RunSpec.from_dict(json.loads(on.canonical()) | {"compile": True}) == on
    import argparse

    from bench.core.schema import add_spec_arguments, spec_from_namespace
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    for spec in (on, RunSpec()):  # the worker reads back exactly the spec (bool("False") would be True)
        assert spec_from_namespace(parser.parse_args(spec.to_argv())) == spec


def test_the_schedule_line_names_its_node_budget_in_words() -> None:
    from bench.run.schedule import makespan_line
    for budget, words in ((1, "1 node in flight"), (4, "4 nodes in flight")):
        cfg = from_dict(compose(["+sweep=smoke", f"launcher.max_nodes={budget}"])[0], launcher_sections())
        line = makespan_line(cfg.cluster.name, placement_of(cfg), [], cfg.launcher.probes_alone)
        assert line.startswith(f"schedule: {words};")


def test_probe_specs_keep_their_run_ids_through_the_summary_and_the_table() -> None:
    """An all-reduce probe's id leaves the new fields out (a study begun before them keeps its probes);
    a gather probe's one study size, read back from a table cell as a number, is the same spec."""
    old = RunSpec(kind="nccl", model="none", nodes=2, gpus_per_node=8, efa_per_node=32)
    assert "collective" not in old.canonical() and "nccl_sizes" not in old.canonical()
    assert "--collective" not in old.to_argv()
    gather = RunSpec(kind="nccl", model="none", nodes=2, collective="all_gather", nccl_sizes="363008")
    assert RunSpec.from_dict({**gather.to_dict(), "nccl_sizes": 363008.0}).run_id == gather.run_id
    assert RunSpec.from_dict({**old.to_dict(), "nccl_sizes": float("nan")}).run_id == old.run_id
    with pytest.raises(ValueError, match="collective='broadcast' is not one of"):
        RunSpec(kind="nccl", collective="broadcast")
    with pytest.raises(ValueError, match="nccl_sizes must be comma-separated byte counts"):
        RunSpec(kind="nccl", nccl_sizes="1k")
