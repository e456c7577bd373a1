"""The H100-era options on CPU with real torchrun processes: Float8 through torchao's emulation, CPU offload
through FSDP2's CPUOffloadPolicy, regional torch.compile through inductor (slow: it compiles)."""
from __future__ import annotations

import pytest
import torch

from bench.core.models import ModelArch, get_arch
from conftest import SERIES

# the runs of conftest.Series train on one pytest-xdist worker: where every test that reads them runs
pytestmark = pytest.mark.xdist_group("series")

COMMON = ["--model", "tiny_llama", "--nodes", "1", "--gpus-per-node", "2", "--steps", "5",
          "--warmup-steps", "1", "--seq-len", "64", "--micro-batch", "2"]


def _ok(run):
    assert run.returncode == 0 and run.summary["status"] == "ok", run.output[-3000:]
    return run


# Trained with the session's other 2-rank runs, in one process group (conftest.Series)
RUNS = {name: [*COMMON, *extra] for name, extra in {
    "bf16": ["--precision", "bf16_mixed"], "fp8": ["--precision", "fp8_tensorwise"],
    "offload": ["--precision", "bf16_mixed", "--offload", "cpu"]}.items()}
for _args in RUNS.values():
    SERIES.declare(_args, nproc=2)


def _series(name: str):
    return _ok(SERIES.result(RUNS[name], nproc=2))


@pytest.fixture(scope="module")
def bf16_run():
    return _series("bf16")


def _close(a: list[float], b: list[float], rel: float) -> bool:
    return all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b, strict=True))


def _expected_float8_linears(a: ModelArch) -> int:
    """Every linear of every block whose dimensions are multiples of 16 (what torch._scaled_mm takes),
    from the architecture alone; the output projection and the embeddings are not counted."""
    inner, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    if a.family == "llama":
        shapes = [(a.hidden, inner), (a.hidden, kv), (a.hidden, kv), (inner, a.hidden),
                  (a.hidden, a.ffn), (a.hidden, a.ffn), (a.ffn, a.hidden)]
        per_block = [shapes] * a.layers
    else:  # T5: encoder self-attention + FFN; decoder self- and cross-attention + FFN
        attn = [(a.hidden, inner)] * 3 + [(inner, a.hidden)]
        ffn = [(a.hidden, a.ffn), (a.ffn, a.hidden)]
        per_block = [attn + ffn] * a.layers + [attn + attn + ffn] * a.layers
    return sum(i % 16 == 0 and o % 16 == 0 for block in per_block for i, o in block)


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_t5", "llama3_2_1b"])
def test_float8_converts_exactly_the_block_linears(model: str) -> None:
    from trainer.model import build_meta_model
    from trainer.parallel import convert_float8
    arch = get_arch(model)
    meta = build_meta_model(arch, torch.float32)
    converted = convert_float8(meta, torch.device("cpu"))
    assert converted == _expected_float8_linears(arch) > 0
    assert type(meta.lm_head).__name__ == "Linear"  # the output projection stays in BF16


def test_float8_trains_close_to_bf16_mixed(bf16_run) -> None:
    run = _series("fp8")
    metas = run.of_kind("meta")
    assert {m["float8_linears"] for m in metas} == {_expected_float8_linears(get_arch("tiny_llama"))}
    # float8 casts of inputs, weights and gradients: the same curve within a few percent
    assert _close(run.summary["losses"], bf16_run.summary["losses"], rel=0.03)
    assert run.summary["losses"] != bf16_run.summary["losses"]  # it really ran in float8


def test_cpu_offload_keeps_the_shards_on_the_host(bf16_run) -> None:
    run = _series("offload")
    for m in run.of_kind("meta"):
        assert m["offload_policy"] == "CPUOffloadPolicy" and m["param_device"] == "cpu"
    assert {m["offload_policy"] for m in bf16_run.of_kind("meta")} == {"OffloadPolicy"}
    # the same arithmetic, only where the state lives: the same losses
    assert _close(run.summary["losses"], bf16_run.summary["losses"], rel=1e-3)


@pytest.mark.slow
def test_regional_compile_matches_eager_and_reports_compile_time(torchrun, bf16_run, tmp_path) -> None:
    # an empty inductor cache: a warm one (any earlier compile of these blocks on this machine) loads the
    # kernels instead of compiling them, and step 0 is then only a few steady steps long
    run = _ok(torchrun(["trainer", *COMMON, "--precision", "bf16_mixed", "--compile", "True"], nproc=2,
                       timeout=600, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}))
    layers = get_arch("tiny_llama").layers
    assert {m["compiled_blocks"] for m in run.of_kind("meta")} == {layers}
    s = run.summary
    assert _close(s["losses"], bf16_run.summary["losses"], rel=0.02)  # the mixed-precision tolerance
    # step 0 compiled every block: the warm-up took far longer than a steady step, and that time is
    # reported apart from the window, which holds compiled steps only
    assert s["compile_s"] > 10 * s["step_time_s"] and s["step_time_s_max"] < s["compile_s"]
    assert "compile_s" not in bf16_run.summary
