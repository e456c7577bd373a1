"""GPUs on the local launcher: counted without torch, each simulated node on its own devices, runs that do
not fit on CPU (smoke) or refused before launch (a cluster that names its GPU)."""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.config import ConfigError
from bench.core.gpus import agent_devices, local_gpus, parse_nvidia_smi_list
from bench.core.load_config import from_dict
from bench.core.schema import RunSpec
from bench.launchers import launcher_sections
from bench.launchers.local import LocalLauncher
from bench.study.plan import expand
from bench.sweep import compose

ROOT = Path(__file__).resolve().parents[2]
# `nvidia-smi -L` as the driver prints it: one line per GPU, MIG instances indented under theirs.
SMI_LIST = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1f2e3d4c-0000-1111-2222-333344445555)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1f2e3d4c-0000-1111-2222-333344445556)
  MIG 3g.40gb     Device  0: (UUID: MIG-0b1c2d3e-4444-5555-6666-777788889999)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-1f2e3d4c-0000-1111-2222-333344445557)
GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-1f2e3d4c-0000-1111-2222-333344445558)
"""


def fake_smi(tmp_path: Path, listing: str, rc: int = 0) -> dict[str, str]:
    """PATH with an nvidia-smi that answers -L like the driver does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{listing}EOF\nexit {rc}\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


def test_gpus_are_counted_from_nvidia_smi_or_cuda_visible_devices(tmp_path) -> None:
    assert parse_nvidia_smi_list(SMI_LIST) == [(str(i), "NVIDIA H100 80GB HBM3") for i in range(4)]
    assert local_gpus(fake_smi(tmp_path, SMI_LIST)) == ["0", "1", "2", "3"]
    assert local_gpus(fake_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate\n",
                               rc=9)) == []
    assert local_gpus({"PATH": str(tmp_path / "nowhere")}) == []  # no driver tools: no GPU
    env = fake_smi(tmp_path, SMI_LIST)
    assert local_gpus({**env, "CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]  # what the sweep may use
    assert local_gpus({**env, "CUDA_VISIBLE_DEVICES": "GPU-1f2e3d4c-0000-1111-2222-333344445556"}) == [
        "GPU-1f2e3d4c-0000-1111-2222-333344445556"]
    assert local_gpus({**env, "CUDA_VISIBLE_DEVICES": ""}) == []


def test_each_simulated_node_gets_its_own_gpus() -> None:
    assert agent_devices(4, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]  # never two ranks on one GPU
    assert agent_devices(2, 2, ["0", "1", "2", "3"]) == ["0", "1"]
    assert agent_devices(1, 1, ["3"]) == ["3"]
    assert agent_devices(4, 2, ["0"]) is None and agent_devices(1, 1, []) is None


def _smoke(*overrides: str):
    sweep = [] if any(o.startswith("+sweep=") for o in overrides) else ["+sweep=smoke"]
    return from_dict(compose([*sweep, *overrides])[0], launcher_sections())


def _agent_env(launcher: LocalLauncher, spec: RunSpec) -> list[str]:
    return [argv[1] for argv in launcher.render(spec, Path("/tmp/r")).argvs]


@pytest.mark.parametrize("sweep", ["smoke", "smoke_full"])
def test_the_smoke_sweep_fits_a_one_gpu_machine(sweep: str) -> None:
    """One GPU: every one-rank run gets the GPU (the quick smoke: each precision with AC full, bf16 without,
    eager and compiled; smoke_full: each precision with and without AC, and the one-rank probes); runs of
    more ranks run on CPU; the plan says so."""
    cfg = _smoke(f"+sweep={sweep}")
    plan = [p.spec for p in expand(cfg)]
    launcher = LocalLauncher(cfg, gpus=["0"])
    on_gpu = [s for s in plan if _agent_env(launcher, s) == ["CUDA_VISIBLE_DEVICES=0"]]
    modes = ("full",) if sweep == "smoke" else ("none", "full")
    assert {(s.precision, s.activation_checkpointing) for s in on_gpu if s.kind == "train"} == {
        (p, ac) for p in ("fp32", "bf16_mixed", "fp16_mixed", "bf16_pure") for ac in modes} | {
        ("bf16_mixed", "none")}
    assert any(s.kind == "nccl" for s in on_gpu) == (sweep == "smoke_full")
    assert all(s.world_size == 1 for s in on_gpu)
    for spec in plan:
        if spec.world_size > 1:
            assert set(_agent_env(launcher, spec)) == {"CUDA_VISIBLE_DEVICES="}  # CPU, gloo
    note = launcher.plan_note(plan)
    assert note == (f"devices: 1 GPU(s) here (0): {len(on_gpu)} run(s) on GPU (NCCL), "
                    f"{len(plan) - len(on_gpu)} on CPU (gloo; they need more ranks than GPUs)")
    assert LocalLauncher(cfg, gpus=[]).plan_note(plan).endswith("every run on CPU (gloo)")


def test_a_local_cluster_that_names_its_gpu_refuses_runs_that_do_not_fit(tmp_path, capsys) -> None:
    from bench.sweep import main
    cfg = _smoke("cluster.gpu=H100-SXM")
    two_nodes = next(p.spec for p in expand(cfg) if p.spec.world_size == 4)
    with pytest.raises(ConfigError, match=r"needs 4 GPUs, this machine has 1 \(0\)"):
        LocalLauncher(cfg, gpus=["0"]).render(two_nodes, Path("/tmp/r"))
    env = fake_smi(tmp_path, SMI_LIST.splitlines(keepends=True)[0])
    old = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        rc = main(["+sweep=smoke", "cluster.gpu=H100-SXM", f"results_root={tmp_path}"])
    finally:
        os.environ.clear()
        os.environ.update(old)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "GPUs, this machine has 1 (0)" in err
    assert not (tmp_path / "smoke").exists()  # refused before anything was written


@pytest.mark.slow  # 22 s on 2 cores: four workers started cold, as a GPU's are
def test_workers_of_each_simulated_node_see_only_their_devices(tmp_path) -> None:
    """A real 2-node local run on a machine said to have 4 GPUs: the ranks of node 0 see 0,1 and those of
    node 1 see 2,3 (on this CPU machine torch finds no CUDA device behind them and runs on gloo)."""
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from bench.core.load_config import from_dict
from bench.launchers import launcher_sections
from bench.launchers.local import LocalLauncher
from bench.study.plan import expand
from bench.run.runner import execute
from bench.sweep import compose, run_options
cfg = from_dict(compose(["+sweep=smoke", "results_root={tmp_path}", "trace.enabled=false", "steps=3",
                         "warmup_steps=1"])[0], launcher_sections())
plan = [p for p in expand(cfg) if p.spec.kind == "train" and p.spec.world_size == 4][:1]
sweep_dir = Path({str(tmp_path)!r}) / "smoke"
launcher = LocalLauncher(cfg, gpus=["0", "1", "2", "3"])
execute(run_options(cfg, launcher.placement(cfg)), plan, launcher, sweep_dir)
"""
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=300, capture_output=True)
    from bench.core import rundir
    (run,) = (tmp_path / "smoke" / "runs").glob("*/attempt-1")
    metas = [r for r in rundir.read_records(run) if r["kind"] == "meta"]
    seen = {(m["group_rank"], m["local_rank"]): m["cuda_visible_devices"] for m in metas}
    assert seen == {(0, 0): "0,1", (0, 1): "0,1", (1, 0): "2,3", (1, 1): "2,3"}
    # where each worker's start-up went: to main() (the interpreter, torch's import: seconds), the process
    # group, the model; together less than the whole launch the ledger saw (to the second)
    (attempt,) = json.loads((run.parent / "ledger.json").read_text())["attempts"]
    launch = (dt.datetime.fromisoformat(attempt["ended_at"])
              - dt.datetime.fromisoformat(attempt["submitted_at"])).total_seconds()
    for m in metas:
        startup = m["startup"]
        assert startup["to_main_s"] > 0.5 and startup["process_group_s"] >= 0 and startup["setup_s"] > 0
        assert startup["warm"] is False  # a GPU's worker starts cold (no warm process holds CUDA state)
        assert sum(startup.values()) < launch + 1, (startup, launch)
