"""What a study ran on and what differs between two (analysis/system.py), on hand-made run summaries with
known systems, the GPU topology from real `nvidia-smi topo -m` captures (analysis/testdata/README.md), and
the report's system section, MFU denominator and energy, broken input included."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import system
from analysis.load import load
from analysis.report import build, pages
from bench.core import rundir
from bench.core.schema import RunSpec, RunSummary

TESTDATA = Path(__file__).parent / "testdata"
H100 = "NVIDIA H100 80GB HBM3"
P5 = {"instance_type": "p5.48xlarge", "gpu_model": H100, "gpu_count": 8, "gpu_driver": "550.54.15",
      "cuda_driver": "12.4", "cuda_runtime": "12.1", "nccl": "2.21.5", "libfabric": "1.22.0amzn5.0",
      "aws_ofi_nccl": "1.14.0", "rdma_devices": [f"rdmap{k}s0" for k in range(32)], "torch": "2.5.1",
      "git_rev": "91abd9f5fbdc01d7270a0bf530dbf6d00ce954dd", "git_dirty": False, "host": "ip-10-0-0-1",
      "slurm_job_id": "4242", "container_image": {"missing": "the launcher named no container image"}}


@pytest.mark.parametrize("name,want", [
    ("topo_h100_nccl1264.txt", "8 GPUs NV18; 10 NICs, nearest PIX"),
    ("topo_4xh100_nccl1617.txt", "4 GPUs NV6; 4 NICs, nearest PIX"),
    ("topo_8x4090_gpuallocator17.txt", "8 GPUs SYS; 2 NICs, nearest PHB/SYS")])
def test_a_real_topology_matrix_in_one_line(name: str, want: str) -> None:
    assert system.topology_summary((TESTDATA / name).read_text()) == want


def test_mixed_links_are_counted_by_pair() -> None:
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\tSYS\nGPU1\tNV4\t X \tSYS\nGPU2\tSYS\tSYS\t X \n"
    assert system.topology_summary(text) == "3 GPUs NV4 x1, SYS x2"


def node(name: str, env: dict[str, str] | None = None, **facts) -> dict:
    return {"node": name, "source": "trainer",
            "facts": {**P5, "host": name, **facts, "env": {"NCCL_DEBUG": "INFO", **(env or {})}}}


def write(sweep: Path, nodes: int, entries: list[dict], tokens_per_s: float = 1000.0, **spec_kw) -> None:
    spec = RunSpec(**{"model": "llama2_7b", "gpus_per_node": 8, "cluster": "p5.48xlarge", "nodes": nodes,
                      **spec_kw})
    d = rundir.run_dir(sweep, spec)
    rundir.write_spec(d, spec)
    rundir.write_summary(d, RunSummary(run_id=spec.run_id, sweep=sweep.name, status="ok", spec=spec,
                                       run_dir=str(d), tokens_per_s=tokens_per_s, step_time_s=1.0,
                                       extra={"system": entries}))


def sixteen(sweep: Path, odd: dict[str, str] | None = None, env: dict[str, str] | None = None) -> None:
    """A 16-node study: runs at 8 and 16 nodes; nodes 7 and 9 (of 16) with `odd` facts where given."""
    names = [f"p5-{k:02d}" for k in range(16)]
    entries = [node(n, env, **(odd if odd and n in ("p5-07", "p5-09") else {})) for n in names]
    write(sweep, 8, entries[:8])
    write(sweep, 16, entries, tokens_per_s=1800.0)


def test_a_study_of_one_system_is_one_row(tmp_path: Path) -> None:
    sixteen(tmp_path / "study")
    [(sweep, records)] = system.system_records(load(tmp_path / "study").frame).items()
    table = system.system_table(records)
    assert len(table) == 1 and table["nodes"][0].startswith("16 (p5-00, p5-01, p5-02, p5-03 and 12 more)")
    row = table.iloc[0]
    assert row["GPU"] == f"8 x {H100}" and row["NCCL"] == "2.21.5" and row["RDMA devices"] == "32 rdmap"
    assert row["runs"] == 2 and "image" not in table  # no node named an image: the column is left out
    assert system.spans(sweep, records) is None


def test_a_study_that_spans_systems_says_which_nodes_differ_and_how(tmp_path: Path) -> None:
    sixteen(tmp_path / "study", odd={"nccl": "2.23.4", "gpu_driver": "570.86.10"})
    [(sweep, records)] = system.system_records(load(tmp_path / "study").frame).items()
    assert len(system.system_table(records)) == 2
    assert system.spans(sweep, records) == (
        "study spans 2 systems: 2 of 16 nodes differ (p5-07, p5-09: driver 570.86.10 where the rest have "
        "550.54.15; NCCL 2.23.4 where the rest have 2.21.5): its scaling efficiency mixes machines")


def test_a_node_whose_driver_changed_between_runs_is_in_two_systems(tmp_path: Path) -> None:
    """Nodes keep their names across runs: one upgraded between the 8- and the 16-node run is named."""
    names = [f"p5-{k:02d}" for k in range(16)]
    write(tmp_path / "study", 8, [node(n) for n in names[:8]])
    write(tmp_path / "study", 16, [node(n, **({"gpu_driver": "570.86.10"} if n == "p5-03" else {}))
                                   for n in names], tokens_per_s=1800.0)
    [(sweep, records)] = system.system_records(load(tmp_path / "study").frame).items()
    assert [(s.nodes[:2], len(s.runs)) for s in records.systems()] == [(["p5-00", "p5-01"], 2),
                                                                        (["p5-03"], 1)]
    assert system.spans(sweep, records).startswith(
        "study spans 2 systems: 1 of 16 nodes differ (p5-03: driver 570.86.10 where the rest have 550.54.15)")


def test_two_studies_differ_in_what_changed_and_nothing_else(tmp_path: Path) -> None:
    sixteen(tmp_path / "a" / "before")
    sixteen(tmp_path / "b" / "after", odd={"nccl": "2.23.4"},
            env={"FI_EFA_USE_DEVICE_RDMA": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/fsx/r/run9/nccl_trace_"})
    a, b = (system.system_records(load(tmp_path / side).frame) for side in ("a", "b"))
    assert system.differences(a, b) == [
        "NCCL 2.21.5 -> 2.21.5 (14 of 16 nodes), 2.23.4 (2 of 16 nodes)",
        "FI_EFA_USE_DEVICE_RDMA unset -> 1",  # the flight recorder's path, set per run, is no difference
        "B (after): 2 nodes of 16 differ (p5-07, p5-09)"]
    sixteen(tmp_path / "c" / "upgraded", odd={"nccl": "2.23.4"})
    whole = system.system_records(load(tmp_path / "c").frame)
    whole["upgraded"].entries = [e for e in whole["upgraded"].entries if e.node in ("p5-07", "p5-09")]
    assert system.differences(a, whole)[0] == "NCCL 2.21.5 -> 2.23.4"
    assert system.differences(a, a) == []
    before = {"old": system.SystemRecords(runs_without=2)}  # a baseline from before runs recorded systems
    assert system.differences(before, a) == [] and system.unrecorded(a, a) == []
    assert system.unrecorded(before, a) == [
        "A: no system records (runs from before they were written, or none readable): nothing to compare"]
    assert system.unrecorded(before, before) == ["no system records on either side"]


def test_the_environment_table_counts_runs_and_hides_per_run_paths(tmp_path: Path) -> None:
    sixteen(tmp_path / "study", env={"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/fsx/r/x/nccl_trace_rank_"})
    [(_, records)] = system.system_records(load(tmp_path / "study").frame).items()
    table = system.env_table(records).set_index("variable")
    assert table.loc["NCCL_DEBUG", "value"] == "INFO" and table.loc["NCCL_DEBUG", "runs"] == 2
    assert table.loc["TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "value"] == "(set per run or node by the launcher)"


def test_the_report_shows_the_systems_and_warns_first_when_a_study_spans_them(tmp_path: Path) -> None:
    sixteen(tmp_path / "study", odd={"nccl": "2.23.4"})
    out = tmp_path / "report"
    shown = pages(load(tmp_path / "study"), out)
    assert shown["answer"].body[0] == ("study spans 2 systems: 2 of 16 nodes differ (p5-07, p5-09: NCCL "
                                       "2.23.4 where the rest have 2.21.5): its scaling efficiency mixes "
                                       "machines")
    table = shown["system_study"].body
    assert list(table["nodes"]) == ["14 (p5-00, p5-01, p5-02, p5-03 and 10 more)", "2 (p5-07, p5-09)"]
    assert list(table["NCCL"]) == ["2.21.5", "2.23.4"]
    assert "spans 2 systems" in (out / "report.html").read_text()
    nodes = pd.read_csv(out / "system.csv")
    assert len(nodes) == 16 and set(nodes["nccl"]) == {"2.21.5", "2.23.4"}
    assert nodes["container_image"][0] == "missing: the launcher named no container image"


def test_unreadable_records_and_garbled_extras_leave_the_report_whole(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    write(sweep, 1, [node("p5-00"), {"node": None, "unreadable": 'cut short or garbled: {"v":1,"kind":"sys'}])
    write(sweep, 2, [{"node": "p5-01", "unreadable": "the worker wrote OSError: boom"}, "not an entry"])
    write(sweep, 4, [node("p5-02", gpu_topology=(TESTDATA / "topo_h100_nccl1264.txt").read_text())])
    out = tmp_path / "report"
    build(load(sweep), out)
    md = (out / "report.md").read_text()
    assert "study: 3 system record(s) unreadable, their nodes' facts unknown (run " in md
    assert "8 GPUs NV18; 10 NICs, nearest PIX" in md  # p5-02's topology, beside p5-00's none
    row = RunSummary(run_id="r1", sweep="study", status="ok", spec=RunSpec()).to_row()
    garbled = system.system_records(pd.DataFrame([{**row, "extra": "{not json"},
                                                  {**row, "extra": '"a string"'}]))
    assert garbled["study"].runs_without == 2 and not garbled["study"].nodes


def test_the_mfu_denominator_and_the_energy_to_train_are_on_the_page(tmp_path: Path) -> None:
    """MFU 0.40 of an H100 run in bf16 was divided by 989.4 dense TFLOPS; 0.2 J/token over 1e9 tokens is
    55.6 kWh of GPU energy, $6.67 at 0.12 USD/kWh."""
    sweep = tmp_path / "study"
    for nodes, energy in ((1, 0.2), (2, 0.25)):
        spec = RunSpec(model="llama2_7b", gpus_per_node=8, cluster="p5.48xlarge", nodes=nodes)
        d = rundir.run_dir(sweep, spec)
        rundir.write_spec(d, spec)
        rundir.write_summary(d, RunSummary(
            run_id=spec.run_id, sweep="study", status="ok", spec=spec, tokens_per_s=1000.0 * nodes,
            step_time_s=1.0, mfu=0.40, peak_tflops_per_gpu=989.4, device_name=H100,
            energy_j_per_token=energy, energy_source="NVML energy counter"))
    (sweep / rundir.SWEEP_CONFIG).write_text(yaml.safe_dump(
        {"cluster": {"name": "p5.48xlarge", "price_per_hour": 98.32, "energy_price": 0.12},
         "study": {"train_tokens": 1e9}}))
    out = tmp_path / "report"
    build(load(sweep), out)
    md = (out / "report.md").read_text()
    assert "MFU is model TFLOPS/GPU over the GPU's dense peak (no 2:4 sparsity; bench/core/hardware.py): " \
           "989.4 TFLOPS bf16 (H100-SXM)" in md
    headline = pd.read_csv(out / "headline.csv")
    assert set(headline["MFU of (dense peak TFLOPS/GPU)"]) == {"989.4 dense bf16 (H100-SXM)"}
    weak = pd.read_csv(out / "weak.csv").set_index("nodes")
    assert weak.loc[1, "GPU kWh to train 1e+09 tokens"] == pytest.approx(1e9 * 0.2 / 3.6e6)
    assert weak.loc[2, "energy USD to train 1e+09 tokens"] == pytest.approx(1e9 * 0.25 / 3.6e6 * 0.12)
    cost = pd.read_csv(out / "cost.csv").set_index("nodes")
    assert cost.loc[1, "GPU J/token"] == 0.2 and cost.loc[1, "energy price (USD/kWh)"] == 0.12
    assert cost.loc[1, "energy USD to train 1e+09 tokens"] == pytest.approx(1e9 * 0.2 / 3.6e6 * 0.12)
