"""The study's own calibration (bench/predict/calibrate.py): the fit recovers constants that generated the
runs, holds what the runs cannot see at the prior, is deterministic, and its file is refused when it
belongs to another cluster or model set or is corrupt."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.core import rundir
from bench.core.hardware import GPUS
from bench.core.load_config import from_dict
from bench.core.models import get_arch
from bench.core.schema import RunSpec, RunSummary
from bench.launchers import launcher_sections, placement_of
from bench.predict import calibrate, calibration_file, perf
from bench.predict.calibrate import Observation, fit
from bench.predict.comm import EXPOSED_PARTS, Network
from bench.predict.cpu import CPU, CPU_EMULATED_16BIT, CpuFacts, cpu_efficiency
from bench.predict.devices import LocalMachine
from bench.predict.gpu import gpu_efficiency
from bench.predict.network import published
from bench.predict.perf import CALIBRATION, Predictor, predict
from bench.predict.split import comparable
from bench.study.plan import PlannedRun
from bench.sweep import compose, format_plan

H100 = GPUS["H100-SXM"]
EFA = published("p5.48xlarge")
LOOPBACK = Network(None, "test loopback")
# what a study's cluster "really" is: other constants than the published ones (contention as published:
# one node's NVLink collectives hide almost entirely, so its runs cannot tell it)
TRUE_GPU = replace(CALIBRATION, matmul_efficiency={**CALIBRATION.matmul_efficiency, "H100": 0.5},
                   elementwise_bytes=500.0)
TRUE_CPU = replace(CALIBRATION, matmul_efficiency={"cpu": 0.35}, elementwise_bytes=250.0, cpu_capacity=1.1)
# The CPU the figures below were set on, as a study's records give it: 2 cores of an AVX-512 EPYC with bf16
# units at 2.6 GHz (every test passes it: none reads the machine that runs it)
EPYC = CpuFacts(frozenset({"avx2", "avx512f", "avx512_bf16"}), 2600.0, 2)
# a reader elsewhere: 16 cores, every 16-bit unit
BIG = CpuFacts(frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16"}), 3000.0, 16)


# A 1B model's step on an H100 is the GPU's at micro batch 8; at 2 it is its host's (gpu.HOST_BLOCK_PASS_S),
# which no calibrated constant moves.
MICRO_BATCH = 8


def _predictor(cfg: Any) -> Predictor:
    return Predictor(cfg.cluster, placement_of(cfg), local=LocalMachine(EPYC))


def _study_predictor(cfg: Any, sweep_dir: Path, here: CpuFacts = EPYC) -> tuple[Predictor, str | None]:
    """The study's predictor as a reader on `here` sees it."""
    return calibration_file.study_predictor(cfg.cluster, placement_of(cfg), cfg.axes.model, sweep_dir,
                                            here=here)


def _runs(cal: object, gpu: object, network: Network, nodes: int, model: str = "llama3_2_1b",
          gpus: int = 8, shardings: tuple[str, ...] = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP"),
          cpu: CpuFacts = EPYC, **fields: object) -> list[Observation]:
    """Runs of a truth `cal` on `gpu`, measured as it predicts them (`cpu`: the CPU a CPU study's ran on)."""
    out = []
    cpu_ = cpu if gpu is CPU else None
    local = LocalMachine(cpu) if gpu is CPU else None
    for sharding in shardings:
        for ac in ("none", "full"):
            spec = RunSpec(model=model, nodes=nodes, gpus_per_node=gpus, sharding=sharding,
                           activation_checkpointing=ac, micro_batch=MICRO_BATCH, seq_len=2048, **fields)
            truth = predict(spec, gpu, network, get_arch(model), cal, local=local).tokens_per_s_per_gpu
            out.append(Observation(spec.run_id, spec, gpu, network, get_arch(model), truth, cpu=cpu_))
    return out


def test_no_runs_no_fit() -> None:
    assert fit([]) is None


def test_the_fit_learns_a_cluster_from_its_one_node_runs_and_predicts_its_larger_ones() -> None:
    one_node = _runs(TRUE_GPU, H100, EFA, 1)
    f = fit(one_node)
    assert f.names == ("efficiency:H100:bf16", "elementwise_bytes", "contention")
    assert f.calibration.source == "this study's 6 runs" and f.nodes == (1,)
    for o in _runs(TRUE_GPU, H100, EFA, 4):  # never seen: the calibration carries to 4 nodes
        published = o.predicted(CALIBRATION) / o.tokens_per_s_per_gpu - 1
        calibrated = o.predicted(f.calibration) / o.tokens_per_s_per_gpu - 1
        assert abs(published) > 0.15 and abs(calibrated) < 0.03, (o.spec.label, published, calibrated)


def test_a_cpu_study_learns_how_its_ranks_share_the_machine() -> None:
    runs = (_runs(TRUE_CPU, CPU, LOOPBACK, 1, "tiny_llama", gpus=1, shardings=("FULL_SHARD",))
            + _runs(TRUE_CPU, CPU, LOOPBACK, 1, "tiny_llama", gpus=2))
    f = fit(runs)
    assert "cpu_capacity" in f.names and f.calibration.cpu_capacity == pytest.approx(1.1, rel=0.15)
    four = _runs(TRUE_CPU, CPU, LOOPBACK, 2, "tiny_llama", gpus=2)
    errors = [abs(o.predicted(f.calibration) / o.tokens_per_s_per_gpu - 1) for o in four]
    assert max(errors) < 0.05


def test_a_cpu_studys_traced_collectives_calibrate_its_ring_step_and_carry_it_to_four_ranks() -> None:
    """One-node runs traced at a ring step 2.5x the prior: the fit learns the step from their exposed
    collectives (2-rank rings) and predicts a 2-node run's (4-rank rings: three times the gather's steps)
    within 5%, part by part; fitted on tokens/s alone the step stays at its prior."""
    truth = replace(TRUE_CPU, cpu_step_s=2.5e-3)

    def traced(o: Observation) -> Observation:
        return replace(o, parts=comparable(o.prediction(truth).parts))
    one = [traced(o) for o in _runs(truth, CPU, LOOPBACK, 1, "tiny_llama", gpus=2)]
    f = fit(one)
    assert "cpu_step_s" in f.names and f.calibration.cpu_step_s == pytest.approx(2.5e-3, rel=0.05)
    for o in (traced(o) for o in _runs(truth, CPU, LOOPBACK, 2, "tiny_llama", gpus=2)):
        predicted = o.prediction(f.calibration).parts
        for part in EXPOSED_PARTS:
            assert predicted[part] == pytest.approx(o.parts[part], rel=0.05, abs=1e-9), (o.spec.label, part)
    untraced = fit([replace(o, parts=None) for o in one])
    assert "cpu_step_s" not in untraced.names and untraced.calibration.cpu_step_s == CALIBRATION.cpu_step_s


def test_the_prior_holds_what_runs_cannot_see_and_one_run_moves_only_its_own() -> None:
    spec = RunSpec(model="llama3_2_1b", nodes=1, gpus_per_node=1, micro_batch=MICRO_BATCH, seq_len=2048)
    slow = predict(spec, H100, EFA).tokens_per_s_per_gpu / 2  # one run at half the published speed
    f = fit([Observation("x", spec, H100, EFA, get_arch("llama3_2_1b"), slow)])
    assert "contention" not in f.names  # one rank communicates nothing: nothing to learn of contention
    assert f.calibration.contention == CALIBRATION.contention
    assert f.calibration.matmul_efficiency["A100"] == CALIBRATION.matmul_efficiency["A100"]
    moved = predict(spec, H100, EFA, cal=f.calibration).tokens_per_s_per_gpu
    assert slow < moved < 1.1 * slow  # most of the way: one run's evidence outweighs a 30% prior
    assert f.spread(lambda cal: predict(spec, H100, EFA, cal=cal).tokens_per_s_per_gpu) > 0


def test_a_16_bit_dtype_the_study_has_not_run_takes_its_siblings_measured_speed() -> None:
    """A CPU emulates fp16 and bf16 alike, several times slower than fp32 (this machine's smoke: bf16 at 1/5.6
    of fp32): the study's first fp16 run is predicted from its bf16 runs, not from its fp32 runs (from which
    it would be predicted about 5x too fast)."""
    cpu_truth = replace(TRUE_CPU, matmul_efficiency={"cpu:fp32": 0.35, "cpu:bf16": 0.06, "cpu:fp16": 0.06})
    seen = [o for p in ("fp32", "bf16_mixed")
            for o in _runs(cpu_truth, CPU, LOOPBACK, 1, "tiny_llama", gpus=1, shardings=("FULL_SHARD",),
                           precision=p)]
    f = fit(seen)
    assert "efficiency:cpu:fp16" not in f.names
    first_fp16 = _runs(cpu_truth, CPU, LOOPBACK, 1, "tiny_llama", gpus=1, shardings=("FULL_SHARD",),
                       precision="fp16_mixed")
    errors = [abs(o.predicted(f.calibration) / o.tokens_per_s_per_gpu - 1) for o in first_fp16]
    assert max(errors) < 0.1, errors
    assert cpu_efficiency(f.calibration, "fp16", EPYC) == cpu_efficiency(f.calibration, "bf16", EPYC)
    assert cpu_efficiency(f.calibration, "fp32", EPYC) > 4 * cpu_efficiency(f.calibration, "fp16", EPYC)
    assert gpu_efficiency(CALIBRATION, "H100", "fp16") == CALIBRATION.matmul_efficiency["H100"]  # family's


def test_a_cpu_study_predicts_its_first_16_bit_run_from_its_fp32_runs() -> None:
    """Before any 16-bit run, a CPU without 16-bit units is taken at CPU_EMULATED_16BIT of its fp32 figure
    (at its fp32 figure the smoke's bf16 run after one fp32 run is predicted several times too fast); a CPU
    with them at its fp32 figure: the units of the CPU the study's runs ran on, whoever reads it."""
    emulated = 0.35 * CPU_EMULATED_16BIT
    cpu_truth = replace(TRUE_CPU, matmul_efficiency={"cpu:fp32": 0.35, "cpu:bf16": emulated})
    avx2 = CpuFacts(frozenset({"avx2"}), 2445.0, 2)
    one_rank = {"gpus": 1, "shardings": ("FULL_SHARD",), "cpu": avx2}
    fp32 = _runs(cpu_truth, CPU, LOOPBACK, 1, "tiny_llama", **one_rank, precision="fp32")
    bf16 = _runs(cpu_truth, CPU, LOOPBACK, 1, "tiny_llama", **one_rank)
    f = fit(fp32)
    assert f.cpu == avx2
    assert cpu_efficiency(f.calibration, "bf16", avx2) == cpu_efficiency(f.calibration, "fp32", avx2) * 0.18
    assert max(abs(o.predicted(f.calibration) / o.tokens_per_s_per_gpu - 1) for o in bf16) < 0.1
    assert cpu_efficiency(f.calibration, "bf16", EPYC) == cpu_efficiency(f.calibration, "fp32", EPYC)
    assert cpu_efficiency(f.calibration, "fp16", EPYC) < cpu_efficiency(f.calibration, "fp32", EPYC)


def test_the_fit_is_deterministic_and_ignores_the_order_runs_are_read_in() -> None:
    runs = _runs(TRUE_GPU, H100, EFA, 1) + _runs(TRUE_GPU, H100, EFA, 2)
    runs[0] = replace(runs[0], tokens_per_s_per_gpu=runs[0].tokens_per_s_per_gpu * 1.3)  # scatter
    a, b = fit(sorted(runs, key=lambda o: o.run_id)), fit(sorted(runs, key=lambda o: o.run_id))
    assert a == b and a.residual > 0.01


def test_the_interval_covers_the_runs_scatter() -> None:
    runs = _runs(TRUE_GPU, H100, EFA, 1)
    noisy = [replace(o, tokens_per_s_per_gpu=o.tokens_per_s_per_gpu * (1.2 if i % 2 else 0.8))
             for i, o in enumerate(runs)]
    tight, loose = fit(runs), fit(noisy)
    o = runs[0]
    width = [f.spread(lambda cal: o.predicted(cal)) for f in (tight, loose)]
    assert width[0] < width[1] and width[1] > calibrate.Z90 * 0.15  # the scatter (~20%) widens it


# --- the study's file ----------------------------------------------------------------------------------

def _cfg(tmp_path: Path, *overrides: str) -> object:
    return from_dict(compose(["+sweep=smoke", f"results_root={tmp_path}", *overrides])[0],
                     launcher_sections())


def _finished(sweep_dir: Path, cfg: object, nodes: int, gpus: int, tokens: float,
              **fields: object) -> RunSummary:
    spec = RunSpec(model="tiny_llama", nodes=nodes, gpus_per_node=gpus, micro_batch=2, seq_len=128,
                   cluster=cfg.cluster.name, **fields)
    summary = RunSummary(run_id=spec.run_id, sweep="smoke", status="ok", spec=spec,
                         tokens_per_s_per_gpu=tokens, device_name="cpu", torch_version="2.13.0+cpu")
    rundir.write_summary(rundir.run_dir(sweep_dir, spec), summary)
    return summary


def test_a_study_writes_its_calibration_and_predicts_with_it(tmp_path: Path) -> None:
    """On a 16-core machine the published constants expect 4 ranks to run at full speed; this study's runs
    (which recorded no CPU: the reader's is theirs) say they share far fewer cores."""
    cfg = _cfg(tmp_path)
    sweep_dir = tmp_path / "smoke"
    predictor, note = _study_predictor(cfg, sweep_dir, BIG)
    assert predictor.fit is None and note is None  # no runs yet: the published constants
    _finished(sweep_dir, cfg, 1, 1, 7000.0)
    _finished(sweep_dir, cfg, 1, 2, 3700.0)
    gpu_run = _finished(sweep_dir, cfg, 2, 2, 1200.0)
    gpu_run.extra["nccl_version"] = "2.27.5"  # what collect takes from a GPU worker's meta record
    rundir.write_summary(rundir.run_dir(sweep_dir, gpu_run.spec), gpu_run)
    predictor, note = _study_predictor(cfg, sweep_dir, BIG)
    assert note == "predictions calibrated on 3 runs at 1-2 nodes of this study " \
                   f"(residual {predictor.fit.residual:.0%}): calibration.json"
    data = json.loads((sweep_dir / rundir.CALIBRATION_JSON).read_text())
    assert data["cluster"]["name"] == "local" and data["models"] == ["tiny_llama"]
    assert data["torch_versions"] == ["2.13.0+cpu"] and len(data["runs"]) == 3
    assert data["nccl_versions"] == ["2.27.5"]
    assert [r["nodes"] for r in data["extrapolation"]] == [2]  # the 2-node run, from the 1-node ones
    spec = RunSpec(model="tiny_llama", nodes=2, gpus_per_node=2, micro_batch=2, seq_len=128, cluster="local")
    pred = predictor.predict(spec)
    assert pred.source == "this study's 3 runs" and pred.fields()["pred_source"] == pred.source
    assert pred.interval[0] < pred.tokens_per_s_per_gpu < pred.interval[1]
    big = Predictor(cfg.cluster, placement_of(cfg), local=LocalMachine(BIG))
    published = big.predict(spec).tokens_per_s_per_gpu
    # it learnt 2 x 2 ranks
    assert published / 1200 > 1.5 and abs(pred.tokens_per_s_per_gpu / 1200 - 1) < 0.25
    assert data["cpu"] == {"isa": sorted(BIG.isa), "mhz": BIG.mhz, "cores": 16}  # the CPU it was fitted at
    again, _ = _study_predictor(cfg, sweep_dir, BIG)  # read back from the file: the same fit
    assert again.fit == predictor.fit


def test_a_cpu_study_is_calibrated_at_the_cpu_its_runs_recorded_wherever_it_is_read(tmp_path: Path) -> None:
    """A study whose runs recorded their CPU (2 usable cores of an AVX2 CPU at 2445 MHz: its system records,
    as bench/run/collect.py keeps them) read on a 16-core AVX-512 machine calibrates as it did where it
    ran; runs without a record take the reader's CPU, and come out otherwise. Either study's file reads back
    the same fit on any machine: it names the CPU it was fitted at."""
    cfg = _cfg(tmp_path)
    avx2 = CpuFacts(frozenset({"avx2"}), 2445.0, 2)
    record = [{"node": "node1", "source": "trainer",
               "facts": {"cpu_count": 4, "cpus_usable": 2, "cpu_isa": "avx2", "cpu_mhz": 2445.0}},
              {"node": "node2", "source": "trainer",
               "facts": {"cpu_count": 4, "cpus_usable": {"missing": "sched_getaffinity unavailable"},
                         "cpu_isa": "avx2", "cpu_mhz": {"missing": "no cpufreq and no 'cpu MHz'"}}}]

    def study(name: str, recorded: bool) -> Path:
        sweep_dir = tmp_path / name
        for nodes, gpus, tokens in ((1, 1, 7000.0), (1, 2, 3700.0), (2, 2, 1200.0)):
            summary = _finished(sweep_dir, cfg, nodes, gpus, tokens, precision="bf16_mixed")
            if recorded:
                summary.extra["system"] = record
                rundir.write_summary(rundir.run_dir(sweep_dir, summary.spec), summary)
        return sweep_dir

    bare_on_avx2 = study("bare_on_avx2", recorded=False)
    where_it_ran = _study_predictor(cfg, bare_on_avx2, avx2)[0].fit
    recorded = study("recorded", recorded=True)
    elsewhere = _study_predictor(cfg, recorded, BIG)[0].fit
    bare = _study_predictor(cfg, study("bare_on_big", recorded=False), BIG)[0].fit
    assert where_it_ran.cpu == elsewhere.cpu == avx2 and bare.cpu == BIG
    assert elsewhere.calibration == where_it_ran.calibration
    assert bare.calibration != where_it_ran.calibration
    assert _study_predictor(cfg, recorded, BIG)[0].fit == elsewhere  # read back from its file on BIG
    assert _study_predictor(cfg, bare_on_avx2, BIG)[0].fit == where_it_ran  # its file names its CPU


@pytest.mark.parametrize("damage, why", [
    (lambda d: {**d, "cluster": {**d["cluster"], "name": "p5-prod"}}, "fitted on cluster 'p5-prod'"),
    (lambda d: {**d, "models": ["llama2_70b"]},
     "fitted on models llama2_70b, none of which this sweep trains"),
    (lambda d: {**d, "prior": {**d["prior"], "contention": 0.1}}, "other published constants"),
    (lambda d: {**d, "theta": d["theta"][:-1]}, "disagree in size"),
    (lambda d: "{not json", "unreadable (JSONDecodeError"),
])
def test_a_foreign_or_corrupt_calibration_is_refused_in_one_line(tmp_path: Path, damage: object,
                                                                   why: str) -> None:
    cfg = _cfg(tmp_path)
    sweep_dir = tmp_path / "smoke"
    _finished(sweep_dir, cfg, 1, 1, 7000.0)
    _study_predictor(cfg, sweep_dir)
    path = sweep_dir / rundir.CALIBRATION_JSON
    bad = damage(json.loads(path.read_text()))
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    before = path.read_text()
    predictor, note = _study_predictor(cfg, sweep_dir)
    assert predictor.fit is None and "\n" not in note
    assert note.startswith(f"calibration: refusing {path}: ") and why in note
    assert "published constants" in note and path.read_text() == before  # left for the user to judge
    spec = RunSpec(model="tiny_llama", nodes=1, gpus_per_node=1, micro_batch=2, seq_len=128, cluster="local")
    assert predictor.predict(spec).source == "published constants"


def test_runs_of_another_cluster_or_device_are_not_evidence(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    sweep_dir = tmp_path / "smoke"
    _finished(sweep_dir, cfg, 1, 1, 7000.0)
    other = _finished(sweep_dir, replace(cfg, cluster=replace(cfg.cluster, name="elsewhere")), 1, 2, 1.0)
    gpu_run = _finished(sweep_dir, cfg, 1, 1, 50000.0, precision="fp32")
    gpu_run.device_name = "NVIDIA H100 80GB HBM3"  # ran on a GPU this machine does not have now
    rundir.write_summary(rundir.run_dir(sweep_dir, gpu_run.spec), gpu_run)
    seen = calibrate.observations(_predictor(cfg), rundir.read_summaries(sweep_dir))
    assert [o.run_id for o in seen] == [s.run_id for s in rundir.read_summaries(sweep_dir)
                                        if s.run_id not in (other.run_id, gpu_run.run_id)]
    assert math.isclose(seen[0].tokens_per_s_per_gpu, 7000.0)


def test_a_cpu_offload_run_is_predicted_as_a_floor_and_is_no_evidence(tmp_path: Path) -> None:
    """The model has no host optimizer step and no PCIe copies: an offload run's prediction is a floor
    (the H200's offload run measured 13x below it), named so, and the fit never sees the run, which would
    pull every other prediction."""
    cfg = _cfg(tmp_path, "cluster=p5.48xlarge", "launcher=dryrun")
    sweep_dir = tmp_path / "smoke"
    runs = [_finished(sweep_dir, cfg, 1, 8, tokens, **fields)
            for tokens, fields in ((20000.0, {}), (1500.0, {"offload": "cpu"}))]
    for run in runs:
        run.device_name = "NVIDIA H100 80GB HBM3"
        rundir.write_summary(rundir.run_dir(sweep_dir, run.spec), run)
    predictor = _predictor(cfg)
    seen = calibrate.observations(predictor, rundir.read_summaries(sweep_dir))
    assert [o.run_id for o in seen] == [runs[0].run_id]
    plain, offload = (predictor.predict(r.spec) for r in runs)
    assert plain.unmodeled is None and perf.FLOOR not in plain.fields()["pred_source"]
    assert offload.unmodeled.startswith("CPU offload") and perf.FLOOR in offload.fields()["pred_source"]
    # the GPU's work alone (tiny_llama: the launches bound both)
    assert offload.step_time_s <= plain.step_time_s
    alone = predict(runs[1].spec, CPU, Network(None, "loopback"), local=LocalMachine(EPYC))
    assert alone.unmodeled is None  # host is all
    line = format_plan([PlannedRun(runs[1].spec, None, True, perf=offload)]).splitlines()[-1]
    assert f"<={offload.tokens_per_s_per_gpu:,.0f}" in line and f"<={offload.mfu:.2f}" in line
    calibrated, _ = _study_predictor(cfg, sweep_dir)  # fitted on the plain run alone
    assert calibrated.fit.runs == (runs[0].run_id,)
    assert calibrated.predict(runs[0].spec).interval is not None
    assert calibrated.predict(runs[1].spec).interval is None  # a floor has no interval about it


def test_a_studys_traces_tell_its_compute_from_its_host_work_which_its_steps_cannot() -> None:
    """A CPU study of the smoke's shape (tiny Llama, micro batch 2 of 128 tokens) whose ranks spend 6 ms a
    block and pass on the host (Python, FSDP2's hooks and copies) and compute at 0.35 of the peak: its
    steps alone fit any mix of the two that sums to the same steps (the host stays at the prior, the
    compute takes the rest); its traced parts find both, and predict the 2-node runs' compute."""
    from bench.predict.split import comparable
    truth = replace(TRUE_CPU, cpu_host_s=6e-3, cpu_capacity=2.0)

    def runs(nodes: int, gpus: int, traced: bool) -> list[Observation]:
        out = []
        for sharding in ("FULL_SHARD", "NO_SHARD") if gpus > 1 else ("FULL_SHARD",):
            for ac in ("none", "full"):
                spec = RunSpec(model="tiny_llama", nodes=nodes, gpus_per_node=gpus, sharding=sharding,
                               activation_checkpointing=ac, micro_batch=2, seq_len=128)
                pred = predict(spec, CPU, LOOPBACK, cal=truth, local=LocalMachine(EPYC))
                out.append(Observation(spec.run_id, spec, CPU, LOOPBACK, spec.arch, pred.tokens_per_s_per_gpu,
                                       parts=comparable(pred.parts) if traced else None, cpu=EPYC))
        return out
    blind = fit(runs(1, 1, False) + runs(1, 2, False))
    seeing = fit(runs(1, 1, True) + runs(1, 2, True))
    assert blind is not None and seeing is not None
    assert "cpu_host_s" not in blind.names and blind.calibration.cpu_host_s == CALIBRATION.cpu_host_s
    assert seeing.calibration.cpu_host_s == pytest.approx(6e-3, rel=0.05)
    for o in runs(2, 2, True):
        compute = o.prediction(truth).parts["compute"]
        assert o.prediction(seeing.calibration).parts["compute"] == pytest.approx(compute, rel=0.05)
        assert o.prediction(blind.calibration).parts["compute"] > 1.2 * compute  # the host's time in it
