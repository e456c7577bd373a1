"""The preflight (bench/preflight.py): which node it names and why, the pairs it measures, its jobs through
the launchers, and one real run on this machine. On the 4-node Slurm cluster with a node slowed from outside:
bench/launchers/test_slurm.py (slow)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import preflight
from bench.core import rundir
from bench.core.config import ConfigError, SweepConfig
from bench.core.load_config import from_dict
from bench.launchers import launcher_sections, placement_of
from bench.launchers.k8s_manifests import manifest
from bench.launchers.slurm_script import render_script
from bench.study.plan import expand
from bench.sweep import compose


def cfg_of(*overrides: str):
    return from_dict(compose(["+sweep=smoke", *overrides])[0], launcher_sections())


def _nodes(cfg: SweepConfig) -> preflight.Nodes:
    return preflight.nodes_of(cfg, placement_of(cfg))


def row(node: str, matmul: float = 1.0, copy: float = 10.0, **facts: Any) -> dict[str, Any]:
    answer = preflight.Answer([{"kind": "preflight", "node": node, "torch": "2.13.0", "python": "3.11.7",
                                "matmul_tflops": matmul, "copy_gbs": copy, "efa_adapters": 0, **facts}])
    return preflight.node_row(node, answer)


def test_a_node_slower_than_the_median_by_more_than_the_tolerance_is_named_and_no_other() -> None:
    cfg = cfg_of()
    rows = [row("a", 1.0), row("b", 0.9), row("c", 1.1), row("d", 0.5)]  # median 0.95; d is 47% below
    assert preflight.judge(_nodes(cfg), rows, {}) == []
    assert [r["problems"] for r in rows] == [[], [], [], ["matmul TFLOPS 0.5, 47% below the median 0.95"]]


def test_a_node_whose_versions_or_adapters_differ_is_named_with_the_difference() -> None:
    cfg = cfg_of("axes.efa_per_node=[4]")
    rows = [row("a", efa_adapters=4), row("b", efa_adapters=4), row("c", efa_adapters=2, torch="2.12.0")]
    preflight.judge(_nodes(cfg), rows, {})
    assert rows[0]["problems"] == rows[1]["problems"] == []
    assert rows[2]["problems"] == ["torch 2.12.0 where 2 of 3 have 2.13.0",
                                   "2 EFA adapters, the study asks 4"]
    plugin = "/opt/amazon/ofi-nccl/lib/libnccl-net.so"
    rows = [row(n, ofi_plugin=plugin, ofi_plugin_loads=True) for n in "ab"] + [
        row("c", ofi_plugin=plugin, ofi_plugin_loads=False, ofi_plugin_error="libfabric.so.1: cannot open")]
    preflight.judge(_nodes(cfg_of()), rows, {})  # the same plugin everywhere, one that does not load on c
    assert [r["problems"] for r in rows] == [[], [],
                                             ["aws-ofi-nccl does not load: libfabric.so.1: cannot open"]]


def test_a_node_slow_with_both_its_pairs_is_named_a_link_slow_alone_is_the_link() -> None:
    cfg = cfg_of()
    rows = [row(n) for n in "abcd"]
    pairs = preflight.pair_rounds(["a", "b", "c", "d"])
    # each node in two pairs, in none twice a round
    assert pairs == [[("a", "b"), ("c", "d")], [("b", "c"), ("d", "a")]]
    node_c = {("a", "b"): 10.0, ("c", "d"): 4.0, ("b", "c"): 4.0, ("d", "a"): 10.0}
    assert preflight.judge(_nodes(cfg), rows, node_c) == []
    assert [r["node"] for r in rows if r["problems"]] == ["c"]
    assert rows[2]["problems"] == ["all-reduce GB/s 4, 60% below the median 10"]
    rows = [row(n) for n in "abcd"]
    link = {("a", "b"): 10.0, ("c", "d"): 10.0, ("b", "c"): 4.0, ("d", "a"): 10.0}
    slow = ["all-reduce b-c 4 GB/s, 60% below the median pair's 10"]
    assert preflight.judge(_nodes(cfg), rows, link) == slow
    assert not any(r["problems"] for r in rows)


def test_a_node_that_did_not_answer_is_named_as_such() -> None:
    silent = preflight.node_row("x", preflight.Answer(error="no answer within preflight.timeout_s=40 s"))
    assert silent == {"node": "x", "answered": False,
                      "problems": ["no answer within preflight.timeout_s=40 s"]}
    verdict = {"rows": [row("a"), silent], "links": [], "seconds": 3, "tolerance": 0.25}
    assert preflight.problems(verdict) == ["x: no answer within preflight.timeout_s=40 s"]
    assert "x     -" in preflight.format_verdict(verdict)


def test_each_job_runs_on_its_node_on_slurm_and_kubernetes(tmp_path: Path, shared_data: Path) -> None:
    """Slurm's --nodelist; on Kubernetes a required node affinity on the node's name, the manifest checked
    against the served CRD's schema like any job of the study (bench/launchers/test_kubernetes.py)."""
    from bench.launchers.k8s_schema import load_crds, validate
    crds = load_crds(shared_data / "k8s")
    slurm = cfg_of("cluster=slurm_local", "launcher=slurm")
    script = render_script(slurm, preflight.node_spec(_nodes(slurm), "node3"), tmp_path, {})
    assert "#SBATCH --nodelist=node3\n#SBATCH --no-requeue\n" in script and " -m trainer.preflight " in script
    study = render_script(slurm, next(p.spec for p in expand(slurm) if p.spec.kind == "train"), tmp_path, {})
    assert "--no-requeue" not in study  # a study's run is requeued after a node failure, on its own clock
    k8s = cfg_of("cluster=p5.48xlarge", "launcher=kubernetes", "launcher.kubernetes.image=reg.io/fsdpbench:1")
    job = manifest(k8s, preflight.pair_spec(_nodes(k8s), ("ip-10-0-0-1", "ip-10-0-0-2")))
    assert job["kind"] == "MPIJob"  # nccl-tests between the pair, as the study's own probes
    pod = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    term = required["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                           "values": ["ip-10-0-0-1", "ip-10-0-0-2"]}]}]
    assert validate(job, crds) == []
    node_job = manifest(k8s, preflight.node_spec(_nodes(k8s), "ip-10-0-0-1"))
    worker = node_job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    command = worker["containers"][0]["command"]
    assert command[command.index("-m", 2) + 1] == "trainer.preflight"
    assert validate(node_job, crds) == []


@pytest.mark.parametrize("override,message", [("preflight.mode=sometimes", "preflight.mode='sometimes'"),
                                              ("preflight.tolerance=1.5", "preflight.tolerance=1.5 must be")])
def test_bad_preflight_settings_are_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg_of(override)


def test_the_preflight_of_this_machine_reports_what_it_runs(tmp_path: Path, capsys) -> None:
    assert preflight.main(["+sweep=smoke", f"results_root={tmp_path}", "preflight.seconds=0.5"]) == 0
    verdict = json.loads((tmp_path / "smoke" / rundir.PREFLIGHT_JSON).read_text())
    (node,) = verdict["rows"]
    assert node["answered"] and node["torch"] == torch.__version__ and node["problems"] == []
    assert node["matmul_tflops"] > 0 and node["copy_gbs"] > 0 and node["efa_adapters"] == 0
    assert node["met"] == 2  # its two ranks met before timing their workload (the cluster is this machine)
    assert not rundir.preflight_ready_dir(tmp_path / "smoke").exists()  # the meeting is cleared away
    (submission,) = (tmp_path / "smoke").glob("preflight/preflight-*/attempt-1/submission/submission.json")
    argvs = json.loads(submission.read_text())["argvs"]
    (worker,) = {tuple(a[a.index("trainer.preflight") + 1:]) for a in argvs}
    assert worker[-4:] == ("--seconds", "0.5", "--ready-dir",
                           str(rundir.preflight_ready_dir(tmp_path.absolute() / "smoke")))
    assert "no node stands apart" in capsys.readouterr().out
    local, slurm = cfg_of(), cfg_of("launcher=slurm")
    assert preflight.mode_of(local.preflight.mode, placement_of(local)) == "off"
    assert preflight.mode_of(slurm.preflight.mode, placement_of(slurm)) == "on"


def test_a_sweep_whose_preflight_names_a_node_launches_nothing(tmp_path: Path, capsys) -> None:
    """preflight.mode=on on this machine, its one job given no time to answer: the sweep stops with exit 3
    and one line naming the node, before any run; the job is gone."""
    from bench.sweep import main
    assert main(["+sweep=smoke", f"results_root={tmp_path}", "preflight.mode=on", "preflight.timeout_s=0.01",
                 "memory.measure=false"]) == preflight.EXIT_REFUSED  # the plan's memory is not the point
    err = capsys.readouterr().err
    assert err.startswith("error: preflight: ") and "no answer within preflight.timeout_s=0.01 s" in err
    assert err.count("\n") == 1 and not (tmp_path / "smoke" / rundir.RUNS_DIR).exists()
    (job,) = (tmp_path / "smoke" / rundir.PREFLIGHT_DIR).iterdir()
    submission = json.loads((job / "attempt-1" / "submission" / "submission.json").read_text())
    assert "trainer.preflight" in submission["argvs"][0]
    assert not [c for c in Path("/proc").glob("[0-9]*/cmdline") if str(tmp_path) in _read(c)]  # cleaned up


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


def test_ranks_meet_before_timing_and_one_that_never_comes_is_not_waited_for(tmp_path: Path) -> None:
    """The round's ranks on one machine meet before timing their workload: each waits for all that the
    preflight expects; where one never comes (a node that did not start), gap_s after the last one came."""
    import threading
    import time

    from trainer.preflight import meet
    ready = tmp_path / "ready"
    ready.mkdir()
    (ready / "expected").write_text("3")
    came: dict[str, tuple[int, float]] = {}

    def rank(name: str, after_s: float) -> None:
        time.sleep(after_s)
        came[name] = (meet(str(ready), name, gap_s=1.0), time.monotonic())

    started = time.monotonic()
    ranks = [threading.Thread(target=rank, args=(f"node{i}-0", 0.3 * i)) for i in range(2)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join()
    # two of three came: both left together, a second after the second came (not at once, not forever)
    assert [n for n, _ in came.values()] == [2, 2]
    left = [at - started for _, at in came.values()]
    assert 1.25 <= min(left) and max(left) - min(left) < 0.2 and max(left) < 2.5, left
    third = threading.Thread(target=rank, args=("node2-0", 0.0))
    third.start()
    third.join()
    assert came["node2-0"][0] == 3  # all three there now: no wait
    assert meet(str(tmp_path / "none"), "x") == 0  # no meeting prepared: timed alone, at once
