"""The sweep end to end on this machine: real torchrun processes, real files, real signals."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.core import faults, rundir
from bench.core.records import parse_records
from conftest import SMOKE_SHAPE, UNTRACED

ROOT = Path(__file__).resolve().parents[1]
ONE_NODE = ["axes.global_batch=[null]",
            "axes.nodes=[1]", "axes.sharding=[FULL_SHARD]", "axes.activation_checkpointing=[none]",
            "nccl.enabled=false", "steps=3", "warmup_steps=1", "exclude=[]"]


def sweep(tmp_path: Path, *args: str, timeout: float = 600, rules: str = "") -> subprocess.CompletedProcess:
    """The smoke's sweep, its workers given the test hook's fault `rules`."""
    return subprocess.run([sys.executable, "-m", "bench.sweep", "+sweep=smoke_full",
                           f"results_root={tmp_path}",
                           *SMOKE_SHAPE, *UNTRACED, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=faults.environ(rules))


def table(tmp_path: Path) -> pd.DataFrame:
    return pd.read_csv(tmp_path / "smoke_full" / rundir.RESULTS_CSV)


def by_precision(frame: pd.DataFrame) -> dict[str, str]:
    return dict(zip(frame.precision, frame.status))


@pytest.mark.slow  # a real sweep or a whole deep model: minutes on 2 cores (CI runs it)
def test_timeout_and_oom_are_classified_and_the_rest_finish(tmp_path: Path) -> None:
    rules = ("[{match: {precision: fp32}, fault: hang, step: 1}, "
             "{match: {precision: bf16_mixed}, fault: oom, step: 1}]")
    proc = sweep(tmp_path, *ONE_NODE, "axes.precision=[fp32,bf16_mixed,bf16_pure]",
                 "launcher.timeout_s=25", "launcher.grace_s=3", rules=rules)
    assert proc.returncode == 1, proc.stderr[-2000:]  # some run failed: table written, exit 1
    frame = table(tmp_path)
    assert by_precision(frame) == {"fp32": "timeout", "bf16_mixed": "oom", "bf16_pure": "ok"}
    hung = frame[frame.precision == "fp32"].iloc[0]
    assert 25 <= hung.wall_s < 25 + 20  # killed at its limit, not left running
    assert "injected out of memory" in frame[frame.precision == "bf16_mixed"].iloc[0].error
    # Resume: failed runs are kept unless asked; --rerun-failed redoes exactly them.
    again = sweep(tmp_path, *ONE_NODE, "axes.precision=[fp32,bf16_mixed,bf16_pure]")
    assert "skipped 3" in again.stdout and again.returncode == 1  # the failures are still there
    redo = sweep(tmp_path, *ONE_NODE, "axes.precision=[fp32,bf16_mixed,bf16_pure]", "--rerun-failed")
    assert "ok 2" in redo.stdout and "skipped 1" in redo.stdout and redo.returncode == 0
    assert set(table(tmp_path).status) == {"ok"}
    # Each attempt kept apart: the redone runs have two attempt dirs, their summaries come from the second.
    redone = table(tmp_path).set_index("precision").loc[["fp32", "bf16_mixed"]]
    assert list(redone.attempt) == [2, 2]
    for run_id in redone.run_id:
        d = next((tmp_path / "smoke_full" / "runs").glob(f"*-{run_id}"))
        assert sorted(p.name for p in d.glob("attempt-*")) == ["attempt-1", "attempt-2"]
        assert [r["status"] for r in rundir.read_records(d) if r["kind"] == "summary"] == ["ok"]


def _wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.5)


@pytest.mark.slow  # a real sweep or a whole deep model: minutes on 2 cores (CI runs it)
def test_sigterm_mid_sweep_leaves_a_consistent_store(tmp_path: Path) -> None:
    # Runs start longest first (bench.run.schedule): full AC recomputes the whole forward pass, selective
    # every second block's, none nothing, so this order holds on any machine (a dtype's order would not: it
    # turns on the CPU's 16-bit units).
    args = [*(a for a in ONE_NODE if not a.startswith("axes.activation_checkpointing")),
            "axes.precision=[fp32]", "axes.activation_checkpointing=[none,selective,full]"]
    hang = "[{match: {activation_checkpointing: selective}, fault: hang, step: 1}]"
    proc = subprocess.Popen([sys.executable, "-m", "bench.sweep", "+sweep=smoke_full",
                             f"results_root={tmp_path}", *SMOKE_SHAPE, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=faults.environ(hang))
    runs = tmp_path / "smoke_full" / "runs"
    hanging = lambda: [d for d in runs.glob("*-acsel-*") if any(  # noqa: E731
        r["kind"] == "step" for r in rundir.read_records(d))]
    _wait_for(lambda: runs.is_dir() and hanging(), timeout=240)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume" in err
    frame = table(tmp_path)
    assert dict(zip(frame.activation_checkpointing, frame.status)) == {"full": "ok", "selective": "cancelled"}
    summaries = [rundir.read_summary(d) for d in rundir.iter_run_dirs(tmp_path / "smoke_full")]
    assert sorted(s.run_id for s in summaries if s) == sorted(frame.run_id)
    left = subprocess.run(["pgrep", "-f", str(runs)], capture_output=True, text=True).stdout.split()
    assert not left, "worker processes survived the cancel"
    # The same command resumes: the cancelled run and the one never started; the ok run is kept.
    done = sweep(tmp_path, *args)
    assert "ok 2" in done.stdout and "skipped 1" in done.stdout, done.stdout[-1500:]
    assert set(table(tmp_path).status) == {"ok"}


def test_dry_run_renders_and_launches_nothing(tmp_path: Path) -> None:
    proc = sweep(tmp_path, "--dry-run", "memory.measure=false")  # what is rendered, not what is measured
    assert proc.returncode == 0, proc.stderr
    sub_files = list((tmp_path / "smoke_full" / "runs").glob("*/attempt-1/submission/submission.json"))
    # the two-ranks-per-node smoke: 16 training runs (2 strong scaling), 2 probes of each of 3 collectives
    assert len(sub_files) == 16 + 2 * 3
    for sub in sub_files:
        argvs = json.loads(sub.read_text())["argvs"]
        # each agent: its devices (none on this machine: CPU), a simulated node's own name where there are
        # several (what a run names its straggler by), then torchrun
        names = [f"FSDPBENCH_NODE_NAME=local{i}" for i in range(len(argvs))] if len(argvs) > 1 else []
        for argv, name in zip(argvs, names or [None] * len(argvs)):
            env = argv[:2 + bool(name)]
            assert env == ["env", "CUDA_VISIBLE_DEVICES=", *([name] if name else [])], argv
            assert argv[len(env) + 1:len(env) + 3] == ["-m", "bench.core.torchrun"]  # torchrun, warm
    assert not list((tmp_path / "smoke_full" / "runs").glob("*/summary.json"))
    assert not list((tmp_path / "smoke_full" / "runs").glob("*/logs/*"))


@pytest.mark.slow
def test_smoke_sweep_end_to_end_then_resume(smoke_results: Path) -> None:
    frame = table(smoke_results)
    plan = pd.read_csv(smoke_results / "smoke_full" / rundir.PLAN_CSV)
    assert sorted(frame.run_id) == sorted(plan.run_id)
    assert (frame.status == "ok").all(), frame[frame.status != "ok"][["run_id", "status", "error"]]
    # Table values are the workers' own summaries, not recomputed or rounded.
    for row in frame.itertuples():
        d = next((smoke_results / "smoke_full" / "runs").glob(f"*-{row.run_id}"))
        summary = [r for r in rundir.read_records(d) if r["kind"] == "summary"][0]
        key = "tokens_per_s" if row.kind == "train" else "busbw_avg_gbs"
        value = row.tokens_per_s if row.kind == "train" else row.nccl_busbw_avg_gbs
        assert value == pytest.approx(summary[key], rel=1e-12)
    hybrid = frame[(frame.sharding == "HYBRID_SHARD") & (frame.nodes == 2) & (frame.kind == "train")]
    d = next((smoke_results / "smoke_full" / "runs").glob(f"*-{hybrid.iloc[0].run_id}"))
    with open(rundir.current_attempt_dir(d) / "logs" / "node0.log") as f:
        metas = [r for r in parse_records(f) if r["kind"] == "meta"]
    assert {tuple(m["mesh_shape"]) for m in metas} == {(2, 2)}
    # the study's calibration learnt from every run it can, the last to end too (runner's settle): the
    # file is what a refit on the finished study gives, not the fit before its last run
    import yaml

    from bench.core.load_config import from_dict
    from bench.launchers import launcher_sections, placement_of
    from bench.predict.calibration_file import study_predictor
    saved = yaml.safe_load((smoke_results / "smoke_full" / rundir.SWEEP_CONFIG).read_text())
    cfg = from_dict(saved, launcher_sections())
    fresh = study_predictor(cfg.cluster, placement_of(cfg), cfg.axes.model, smoke_results / "smoke_full",
                            write=False)[0].fit
    fitted = json.loads((smoke_results / "smoke_full" / rundir.CALIBRATION_JSON).read_text())["runs"]
    assert fitted == list(fresh.runs) and len(fitted) >= 12, (len(fitted), len(fresh.runs))
    # a run's log holds what the run did: no library notices repeated per run (issue 64's quiet logs)
    logs = list((smoke_results / "smoke_full" / "runs").glob("*/attempt-*/logs/*.log"))
    assert logs
    for log in logs:
        text = log.read_text()
        assert "USDT:" not in text and "Failed to load" not in text, (log, text[-2000:])
    # torchrun kept its error files in each run's attempt dir, not a torchelastic_* dir in /tmp per node
    for d in (smoke_results / "smoke_full" / "runs").glob("*"):
        assert (rundir.current_attempt_dir(d) / rundir.TORCHELASTIC_DIR).is_dir(), d
    # every CPU worker was forked by the sweep's warm process (launcher.local.warm_workers, on by default)
    starts = [r["startup"] for d in (smoke_results / "smoke_full" / "runs").glob("tiny_llama-*")
              for r in rundir.read_records(d) if r["kind"] == "meta"]
    assert len(starts) >= len(frame[frame.kind == "train"]) and all(s["warm"] for s in starts)
    # The report of these results: charts exist, its scaling table holds the summaries' values.
    out = smoke_results / "smoke_full" / "report"
    for chart in ("throughput_vs_nodes", "efficiency_vs_nodes", "tflops_per_config", "memory_vs_nodes",
                  "busbw_vs_size"):
        assert (out / f"{chart}.png").stat().st_size > 5000 and (out / f"{chart}.svg").is_file()
    parity = pd.read_csv(out / "loss_parity.csv")  # 4 strategies x AC on/off: one loss curve per group
    assert len(parity) == 2 * 5 and set(parity["verdict"]) == {"same curve"}
    assert set(parity["reference run"]) == {"FULL_SHARD AC=none transformer_block r0"}
    comm = pd.read_csv(out / "comm_model.csv")  # probes at 1 and 2 nodes feed the communication model
    assert len(comm) == 16 and comm["modelled comm (s)"].notna().all()
    scaling = pd.read_csv(out / "scaling.csv")
    train = frame[frame.kind == "train"]
    assert sorted(scaling["tokens/s"]) == pytest.approx(sorted(train.tokens_per_s), rel=1e-9)
    # Second invocation: everything is finished, nothing is launched.
    started = time.monotonic()
    again = sweep(smoke_results)
    assert again.returncode == 0 and f"skipped {len(frame)}" in again.stdout  # 16 trainings, 6 probes
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_the_smoke_report_puts_predictions_beside_measurements_on_cpu(smoke_results: Path) -> None:
    """Every ok training run has its plan-time prediction (bench/predict/perf.py on this machine's cores) and
    its measured tokens/s side by side, the error between them, and the plan's memory figure (measured on
    fake tensors) beside it; the notes name the largest miss and why."""
    frame = table(smoke_results)
    train = frame[frame.kind == "train"]
    assert train.pred_tokens_per_s_per_gpu.notna().all() and (train.pred_mem_source == "measured").all()
    out = smoke_results / "smoke_full" / "report"
    predicted = pd.read_csv(out / "predicted.csv")
    assert len(predicted) == 16 and predicted[["pred_tokens_per_s_per_gpu", "tokens_per_s_per_gpu",
                                               "error"]].notna().all().all()
    per_gpu = train.tokens_per_s / (train.nodes * train.gpus_per_node)
    assert sorted(predicted.tokens_per_s_per_gpu) == pytest.approx(sorted(per_gpu), rel=1e-9)
    row = predicted.iloc[0]
    assert row.error == pytest.approx(row.tokens_per_s_per_gpu / row.pred_tokens_per_s_per_gpu - 1)
    # each row's figures are one prediction: its efficiency is its tokens/s over the base it shows
    assert predicted.pred_scaling_efficiency.tolist() == pytest.approx(
        (predicted.pred_tokens_per_s_per_gpu / predicted.pred_base_tokens_per_s_per_gpu).tolist(), rel=1e-9)
    memory = pd.read_csv(out / "memory.csv")
    assert len(memory) == 16 and (memory.pred_mem_gib > 0).all()
    text = (out / "report.md").read_text()
    assert "<section id='predicted'>" in (out / "report.html").read_text()
    assert "largest miss" in text and ("predicted with the published constants" in text
                                       or "this study's" in text)
    # the runs after the first ones were predicted with the study's own calibration, the report says so
    assert predicted.pred_source.str.startswith("this study's").sum() >= len(predicted) - 2
    assert "predicted with this study's own calibration" in text
    extrapolation = pd.read_csv(out / "extrapolation.csv")
    page = (out / "report.html").read_text()  # the details: collapsed on the HTML page, linked from the md
    assert set(extrapolation.nodes) == {2} and "<details id='extrapolation'" in page
    assert "[extrapolation.csv](extrapolation.csv)" in text
    assert "extrapolation (smoke_full)" in text
    assert " runs at 1 node alone, " in text
    # what each 2-node run got of the network: its traced all-gathers and reduce-scatters against the
    # same collective's 2-node probe (gloo over loopback here)
    got = pd.read_csv(out / "network_achieved.csv")
    two = got[got.nodes == 2]
    assert {"all_gather_fwd", "all_gather_bwd", "reduce_scatter"} <= set(two.collective), got.to_string()
    assert (two["busbw (GB/s)"] > 0).all() and (two["probe busbw (GB/s)"] > 0).all()
    gathers = two[two.collective.str.startswith("all_gather")]
    assert (gathers.probe == "all_gather probe").all()  # its own collective's probe, not the all-reduce's
    assert "<details id='network_achieved'" in page and "[network_achieved.csv](network_achieved.csv)" in text
    assert re.search(r"the 2-node runs' reduce-scatters reached \d+% of the probe", text), text[-3000:]


@pytest.mark.slow
def test_the_smoke_reports_its_strong_scaling_pair_in_days_and_dollars(smoke_results: Path,
                                                                        tmp_path: Path) -> None:
    """The smoke's strong-scaling pair: 8 sequences per optimizer step on 1 node (2 ranks x micro batch 2 x 2
    accumulation steps) and on 2 (4 ranks x 2 x 1) train the same sequences, so the same losses; the report
    gives its efficiency on the step time, and days and dollars at a price, from the runs' own numbers."""
    frame = table(smoke_results)
    pair = frame[frame.global_batch == 8].sort_values("nodes")
    assert list(pair.nodes) == [1, 2] and (pair.status == "ok").all()
    one, two = pair.iloc[0], pair.iloc[1]
    losses = [json.loads(row.extra)["losses"] for row in (one, two)]
    assert losses[0] == pytest.approx(losses[1], rel=2e-2)  # bf16: the parity tolerance of mixed precision
    weak = frame[(frame.kind == "train") & (frame.global_batch == 0) & (frame.nodes == 2)
                 & (frame.gpus_per_node == 2) & (frame.sharding == "FULL_SHARD")
                 & (frame.precision == "bf16_mixed")
                 & (frame.activation_checkpointing == "none")].iloc[0]
    assert json.loads(weak.extra)["losses"] == pytest.approx(losses[1], rel=1e-6)  # the same 8 sequences
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "analysis.report", str(smoke_results / "smoke_full"),
                           "--out", str(out), "--price", "2.5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    strong = pd.read_csv(out / "strong.csv").set_index("nodes")
    assert list(strong["accumulation steps"]) == [2, 1] and list(strong["source"]) == ["measured"] * 2
    assert list(strong["step time (s)"]) == pytest.approx([one.step_time_s, two.step_time_s], rel=1e-12)
    assert list(strong["predicted step time (s)"]) == pytest.approx([one.pred_step_time_s,
                                                                     two.pred_step_time_s])
    assert strong.loc[2, "strong-scaling efficiency"] == pytest.approx(one.step_time_s / two.step_time_s / 2)
    days = 1e12 / (8 * 128) * two.step_time_s / 86400
    assert strong.loc[2, "days to train 1e+12 tokens"] == pytest.approx(days)
    assert strong.loc[2, "USD to train 1e+12 tokens"] == pytest.approx(days * 24 * 2 * 2.5)
    text = (out / "report.md").read_text()
    assert "<section id='strong'>" in (out / "report.html").read_text()
    assert "scaling: smoke_full weak and strong at global batch 8" in text
    assert "tiny_llama, FULL_SHARD bf16_mixed, global batch 8 sync_each: 1 node trains" in text


@pytest.mark.slow
def test_auto_micro_batch_launches_once_where_it_fits_and_backs_off_from_an_injected_oom(
        tmp_path: Path) -> None:
    """Both start at 8 (max). bf16: fits, one launch, no trials. fp32: OOM injected at 8 and 4, so its own
    run at 8 fails, trials at 4 and 2, and the run again at 2; the search is in its summary."""
    args = [*ONE_NODE, "axes.precision=[fp32,bf16_mixed]", "axes.micro_batch=[auto]",
            "micro_batch_search.max=8", "micro_batch_search.steps=2"]
    rules = "[{match: {micro_batch: [8, 4], precision: fp32}, fault: oom, step: 1}]"
    proc = sweep(tmp_path, *args, rules=rules)
    assert proc.returncode == 0, proc.stderr[-2000:]
    frame = table(tmp_path).set_index("precision")
    assert (frame.status == "ok").all() and frame.micro_batch.to_dict() == {"fp32": 2, "bf16_mixed": 8}
    searches = {p: [(t["micro_batch"], t["status"]) for t in json.loads(frame.extra[p])["micro_batch_search"]]
                for p in frame.index}
    assert searches == {"fp32": [(8, "oom"), (4, "oom"), (2, "ok")], "bf16_mixed": [(8, "ok")]}
    fp32, bf16 = Path(frame.run_dir["fp32"]), Path(frame.run_dir["bf16_mixed"])
    assert fp32 != bf16 and "mbauto" in fp32.name
    assert sorted(p.name for p in (fp32 / "search").iterdir()) == ["mb2", "mb4"]
    assert [a["attempt"] for a in rundir.read_ledger(fp32)] == [1, 2]  # at 8 (oom), then at 2
    assert not (bf16 / "search").exists() and [a["attempt"] for a in rundir.read_ledger(bf16)] == [1]
    assert frame.tokens_per_s["fp32"] > 0  # the real run (3 steps), not the 2-step trial
    assert json.loads((fp32 / rundir.SUMMARY_JSON).read_text())["steps"] == 3
    assert "skipped 2" in sweep(tmp_path, *args, rules=rules).stdout  # resume finds both done


@pytest.mark.slow  # 18 s on 2 cores: a 5 s collective timeout, two dumps and their analysis
def test_a_hung_collective_names_the_rank_that_never_came(tmp_path: Path) -> None:
    """Rank 1 of a 2-rank gloo FSDP2 run sleeps inside step 1 (after its forward); rank 0 waits in the
    backward's first collective until gloo times it out (launcher.collective_timeout_s), dumps its flight
    recorder and fails; torchrun stops rank 1, which dumps on SIGTERM. The summary names rank 1, its host,
    the collective it never reached and the rank that waited, from torch's analysis of the two dumps."""
    from trainer.flight import analyze
    proc = sweep(tmp_path, *ONE_NODE, "axes.precision=[bf16_mixed]", "launcher.collective_timeout_s=5",
                 "launcher.timeout_s=90", rules="[{match: {}, fault: hang, step: 1, rank: 1}]")
    assert proc.returncode == 1, proc.stderr[-2000:]
    run = table(tmp_path).iloc[0]
    assert run.status == "nccl_error", run.error
    host = next(r["host"] for r in rundir.read_records(Path(run.run_dir)) if r["kind"] == "meta")
    assert run.error.startswith(f"flight recorder: rank 1 ({host}) never reached gloo:all_gather #"), \
        run.error
    assert f"that rank 0 ({host}) waited in" in run.error and "Timed out waiting 5000ms" in run.error
    found = json.loads(run.extra)["flight_recorder"]
    assert found["dumps"] == [0, 1] and found["collective"]["missing_ranks"] == [1]
    seq = found["collective"]["seq"]
    attempt = Path(run.run_dir) / "attempt-1"
    dumps = sorted(attempt.glob("nccl_trace_rank_*"))
    assert [d.name for d in dumps] == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    # A truncated and a corrupt dump: said so, and no lagging rank is guessed from what is left.
    damages = (("truncated", lambda b: b[:len(b) // 2]), ("corrupt", lambda b: b"\x80junk" + b[5:]))
    for name, damage in damages:
        damaged = tmp_path / name
        damaged.mkdir()
        (damaged / dumps[0].name).write_bytes(dumps[0].read_bytes())
        (damaged / dumps[1].name).write_bytes(damage(dumps[1].read_bytes()))
        result = analyze(damaged, "nccl_trace_rank_", 2)
        assert result["dumps"] == [0] and list(result["unreadable"]) == ["1"], result
        assert "collective" not in result  # rank 0's dump alone cannot show who missed #seq
    # A missing dump: analysed from the rest, and said.
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / dumps[0].name).write_bytes(dumps[0].read_bytes())
    assert analyze(alone, "nccl_trace_rank_", 2)["missing_dumps"] == [1]
    assert seq > 1
