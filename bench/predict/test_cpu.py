"""The CPU a local study ran on, as its priors read it (bench/predict/cpu.py), and the device model kept
apart from the GPU's: gpu.py, the modules it prices collectives with and perf.py's step name no CPU;
devices.py alone picks the device."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench.core import system
from bench.core.hardware import GPUS
from bench.core.schema import RunSpec, RunSummary
from bench.predict.comm import Network
from bench.predict.cpu import CPU, PRIOR_GHZ, CpuFacts, CpuModel, recorded, this_cpu
from bench.predict.devices import LocalMachine, device_model
from bench.predict.gpu import GpuModel
from bench.predict.perf import CALIBRATION, predict

AVX512 = CpuFacts(frozenset({"avx2", "avx512f", "avx512_bf16"}), 2600.0, 2)
READER = CpuFacts(frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16"}), 3000.0, 16)


def _run(device: str, *facts: dict[str, object]) -> RunSummary:
    spec = RunSpec(model="tiny_llama", nodes=len(facts) or 1, gpus_per_node=2)
    system_ = [{"node": f"node{i}", "source": "trainer", "facts": f} for i, f in enumerate(facts)]
    return RunSummary(run_id=spec.run_id, sweep="s", status="ok", spec=spec, device_name=device,
                      extra={"system": system_} if facts else {})


def test_a_studys_cpu_is_what_its_runs_recorded_the_slowest_node_setting_the_pace() -> None:
    """Two nodes of one run: the units both have, the lower clock, the fewer usable cores; a fact none
    recorded (the clock, before cpu_mhz was recorded) is the reader's; a GPU run's host is not the CPU."""
    fast = {"cpu_isa": "avx2 avx512f avx512_bf16", "cpu_mhz": 3000.0, "cpus_usable": 4, "cpu_count": 8}
    slow = {"cpu_isa": "avx2 avx512f", "cpu_mhz": 2600.0, "cpus_usable": 2, "cpu_count": 2}
    gpu_host = {"cpu_isa": "avx2", "cpu_mhz": 1000.0, "cpus_usable": 96}
    assert recorded([_run("cpu", fast, slow), _run("NVIDIA H100 80GB HBM3", gpu_host)], READER) == \
        CpuFacts(frozenset({"avx2", "avx512f"}), 2600.0, 2)
    older = {"cpu_count": 2, "cpus_usable": 2, "cpu_isa": {"missing": "no 'flags' in /proc/cpuinfo"}}
    assert recorded([_run("cpu", older)], READER) == CpuFacts(READER.isa, READER.mhz, 2)
    none_of = {"cpu_isa": "none of " + " ".join(system.CPU_ISA_FLAGS), "cpus_usable": True}
    assert recorded([_run("cpu", none_of)], READER) == CpuFacts(frozenset(), READER.mhz, READER.cores)
    assert recorded([_run("cpu")], READER) == READER  # no record at all: the reader's


def test_this_machines_cpu_is_what_a_run_here_records() -> None:
    """A plan's new local runs are predicted at the CPU their records will name: the same reading."""
    assert this_cpu() == recorded([_run("cpu", system.cpu_facts())], CpuFacts())


@pytest.mark.parametrize(("cpu", "peak", "bf16", "fp16"), [
    (AVX512, 16 * 2 * 2 * 2.6e9, True, False),
    (CpuFacts(frozenset({"avx2"}), 2445.0, 2), 8 * 2 * 2 * 2.445e9, False, False),
    (CpuFacts(frozenset({"asimd", "sve", "bf16"}), None, 64), 8 * 2 * 2 * PRIOR_GHZ * 1e9, False, False),
    (CpuFacts(frozenset({"avx512f", "amx_bf16", "amx_fp16"}), 2000.0, 8), 16 * 2 * 2 * 2e9, True, True),
])
def test_a_cpus_peak_and_16_bit_units_follow_its_recorded_vector_units_and_clock(
        cpu: CpuFacts, peak: float, bf16: bool, fp16: bool) -> None:
    assert cpu.peak_flops() == pytest.approx(peak, rel=1e-12)
    assert [cpu.runs_natively(d) for d in ("bf16", "fp16", "fp32")] == [bf16, fp16, False]
    assert CpuFacts.from_json(cpu.to_json()) == cpu


def test_a_cpu_prediction_reads_the_cpu_it_is_given_and_never_the_readers() -> None:
    """The facts are passed in: without them a CPU prediction is refused (no silent read of the machine that
    runs it); with them, a study of one CPU predicts the same wherever read, another CPU otherwise."""
    spec = RunSpec(model="tiny_llama", nodes=1, gpus_per_node=2, precision="fp16_mixed")
    loopback = Network(None, "loopback")
    with pytest.raises(ValueError, match="needs the machine they are on"):
        predict(spec, CPU, loopback)
    ran_on = predict(spec, CPU, loopback, local=LocalMachine(AVX512))
    other = predict(spec, CPU, loopback, local=LocalMachine(READER))
    assert other.tokens_per_s_per_gpu > 2 * ran_on.tokens_per_s_per_gpu  # fp16 units, a faster clock
    assert predict(spec, CPU, loopback, local=LocalMachine(AVX512)) == ran_on
    assert isinstance(device_model(CPU, CALIBRATION, LocalMachine(AVX512)), CpuModel)
    assert isinstance(device_model(GPUS["H100-SXM"], CALIBRATION), GpuModel)


PREDICT = Path(__file__).resolve().parent


CPU_NAMES = ("CPU", "CpuModel", "CpuFacts", "this_cpu", "recorded", "cpu_share", "cpu_turns")


def _cpu_mentions(path: Path) -> list[tuple[str, int]]:
    """Where a module's code (docstrings aside) names the CPU: the string "cpu", the CPU device, an import of
    the cpu module or of anything in it, a name of its (CPU_NAMES); as (the enclosing function, line)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inside = child.name if isinstance(child, (ast.FunctionDef, ast.ClassDef)) else where
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                continue  # a docstring
            named = (isinstance(child, ast.Constant) and child.value == "cpu"
                     or isinstance(child, ast.Name) and child.id in CPU_NAMES
                     or isinstance(child, ast.Attribute) and child.attr in CPU_NAMES
                     or isinstance(child, ast.ImportFrom) and child.module == "bench.predict.cpu"
                     or isinstance(child, ast.alias) and child.name in ("bench.predict.cpu", "cpu"))
            if named:
                found.append((where, child.lineno))
            visit(child, inside)
    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_the_gpu_path_holds_no_cpu_branch(tmp_path: Path) -> None:
    """The GPU's model (gpu.py, and the collectives, NCCL's model and FSDP2's overlap it prices them with)
    and the step every device runs (perf.py) name no CPU, not even the CPU's facts they are handed;
    devices.py, where a prediction's device is chosen (a local run that does not fit this machine's GPUs is
    sent to its cores, at the CPU its LocalMachine knows), does."""
    gpu_path = ("gpu.py", "comm.py", "collective.py", "nccl_graph.py", "overlap.py", "network.py", "perf.py")
    for path in gpu_path:
        assert _cpu_mentions(PREDICT / path) == [], path
    assert {where for where, _ in _cpu_mentions(PREDICT / "devices.py")} == {
        "<module>", "__init__", "cpu", "device_model", "local_device"}
    handed = tmp_path / "handed.py"  # a step handed the CPU's facts names it, though it branches on nothing
    handed.write_text("from bench.predict.cpu import CpuFacts\n\n\ndef step(facts: CpuFacts) -> None:\n"
                      "    return None\n")
    assert _cpu_mentions(handed) == [("<module>", 1), ("step", 4)]
