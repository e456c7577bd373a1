"""The published multi-node FSDP rows (benchmarks/published/fsdp/rows.yaml) as bench/predict/published.py
fsdp_rows reads them: every row loads into the run it maps to, and a row the schema does not allow is refused
with one line naming it. No prediction is made here: these rows are set aside before anything is fitted."""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.core.fabric import FABRICS
from bench.core.models import PRESETS, count_params
from bench.core.schema import RunSpec
from bench.core.yaml_text import safe_load
from bench.predict.network import network_for, published
from bench.predict.perf import predict
from bench.predict.published import CALIBRATION_ROWS, CHECK_ROWS, FOUNDRY_2023, MPT, PublishedRow
from bench.predict.published_fsdp import FSDP_ROWS, FsdpRowError, PublishedFsdpRow, fsdp_counts, fsdp_rows

README = FSDP_ROWS.parent / "README.md"


@pytest.fixture(scope="module")
def rows() -> dict[str, PublishedFsdpRow]:
    return {r.id: r for r in fsdp_rows()}


@functools.cache
def _raw_rows() -> list[dict[str, Any]]:
    return safe_load(FSDP_ROWS.read_text())


def raw_rows() -> list[dict[str, Any]]:
    """The file as YAML reads it, a fresh copy for each caller to edit (read once)."""
    return copy.deepcopy(_raw_rows())


def test_every_row_of_the_file_loads_as_the_run_it_names(rows: dict[str, PublishedFsdpRow]) -> None:
    raw = raw_rows()
    assert [r["id"] for r in raw] == list(rows) and len(rows) == 484
    trainy = rows["trainy_h200_llama31_8b_fp8_4n"]
    assert trainy.arch is PRESETS["llama3_1_8b"] and trainy.gpu is not None and trainy.gpu.name == "H200"
    assert trainy.spec == RunSpec(model="llama3_1_8b", nodes=4, gpus_per_node=8, precision="fp8_tensorwise",
                                  activation_checkpointing="selective", compile=True, micro_batch=2,
                                  seq_len=8192)
    assert trainy.tokens_per_s_per_gpu == 10938 and trainy.series == "trainy_h200_llama31_8b_fp8"
    out = trainy.fabric.scale_out if trainy.fabric else None
    assert out is not None
    assert (out.transport, out.adapters, out.gbps, out.rdma) == ("infiniband", 8, 400, True)
    t5 = rows["ibm_cloud_t5_11b_256gpu_tcp"]
    assert (t5.arch.family, t5.arch.t5_ff, t5.arch.tie_embeddings) == ("t5", "gated-gelu", False)
    assert t5.tokens_per_s_per_gpu is None and t5.scaling_efficiency == 0.9 and t5.measured_as == "efficiency"


def test_every_modelled_row_is_a_valid_run_of_its_gpu_and_architecture(
        rows: dict[str, PublishedFsdpRow]) -> None:
    modelled = [r for r in rows.values() if r.modelled]
    assert len(modelled) == fsdp_counts(list(rows.values()))["modelled rows"] > 60
    for r in modelled:
        assert r.spec is not None and r.gpu is not None and r.fabric is not None, r.id
        assert RunSpec.from_dict(r.spec.to_dict()) == r.spec, r.id  # every field re-checked
        assert (r.spec.nodes, r.spec.gpus_per_node) == (r.nodes, r.gpus_per_node), r.id
        assert r.fabric.gpus_per_node == r.gpus_per_node and r.fabric.scale_up.gpus >= 1, r.id
        assert (r.fabric.scale_out is None) == (r.nodes == 1), r.id
        if r.arch.name in PRESETS:
            assert r.spec.arch == r.arch, r.id
        assert isinstance(r.published_row, PublishedRow) and r.published_row.spec == r.spec
    for r in rows.values():
        if not r.modelled:
            assert r.why_not, r.id
            with pytest.raises(ValueError, match=r.id):
                r.published_row  # noqa: B018 - the property refuses


def test_llm_foundry_rows_are_read_with_its_stack_and_the_mpt_shapes(
        rows: dict[str, PublishedFsdpRow]) -> None:
    """The 2023 table's rows (llm-foundry@c6cfb42: '|  7b | 2048 | 8 | a100_80gb | ... | 32 | 2 | 512 | ... |
    3824 |') are the runs published.py maps the 2024 table's to, read with the stack its sweep installed."""
    r = rows["foundry2023_a100_80g_mpt_7b_s2048_8gpu"]
    assert r.arch == MPT["mpt_7b"] and r.gpu is not None and r.gpu.name == "A100-SXM4-80GB"
    assert (r.spec.micro_batch, r.spec.grad_accum, r.spec.precision, r.spec.accumulation) == (
        32, 2, "bf16_pure", "sync_each")
    assert r.tokens_per_s_per_gpu == 3824 and r.perf_stack is FOUNDRY_2023
    assert r.published_row.stack is FOUNDRY_2023
    own = predict(r.spec, r.gpu, r.network, r.arch).tokens_per_s_per_gpu
    assert predict(r.spec, r.gpu, r.network, r.arch, stack=r.perf_stack).tokens_per_s_per_gpu != own
    others = [x for x in rows.values() if x.stack != "llm-foundry-fa1"]
    assert others and all(x.perf_stack is None for x in others)


def test_a_row_is_already_used_where_and_only_where_the_project_s_own_rows_hold_it(
        rows: dict[str, PublishedFsdpRow]) -> None:
    """A collected row that CALIBRATION_ROWS or CHECK_ROWS hold (the same shape, GPU, nodes, micro batch,
    sequence and figure) is marked already_used, so that it is in no set aside and fitted once."""
    def key(arch, gpu: str, nodes: int, mb: int, seq: int, tokens: float) -> tuple:  # noqa: ANN001
        return arch.hidden, arch.layers, gpu, nodes, mb, seq, round(tokens)
    ours = {key(r.arch, r.gpu.name, r.spec.nodes, r.spec.micro_batch, r.spec.seq_len, r.tokens_per_s_per_gpu)
            for r in CALIBRATION_ROWS + CHECK_ROWS if r.tokens_per_s_per_gpu}
    checked = [r for r in rows.values() if r.modelled and r.tokens_per_s_per_gpu]
    for r in checked:
        spec = r.spec
        held = key(r.arch, r.gpu.name, r.nodes, spec.micro_batch, spec.seq_len, r.tokens_per_s_per_gpu)
        assert (held in ours) == r.already_used, r.id
    assert sum(r.already_used for r in checked) == 25  # the IBM blog's, torchtitan's and fms-fsdp's


def test_preset_models_match_the_parameter_counts_their_sources_publish(
        rows: dict[str, PublishedFsdpRow]) -> None:
    stated = [r for r in raw_rows() if r["params_b"] is not None]
    assert len(stated) > 60
    for raw in stated:
        arch = rows[raw["id"]].arch
        assert count_params(arch) == pytest.approx(raw["params_b"] * 1e9, rel=5e-3), raw["id"]
        if arch.name in PRESETS and arch.published_params:
            assert arch.published_params == pytest.approx(raw["params_b"] * 1e9, rel=5e-3), raw["id"]
    assert count_params(rows["torchao_8xh100_llama3_8b_bf16"].arch) == 8_030_261_248  # Llama 3.1 8B


def test_efficiency_bases_are_rows_of_the_same_series_on_fewer_gpus(
        rows: dict[str, PublishedFsdpRow]) -> None:
    with_base = [r for r in rows.values() if r.scaling_efficiency is not None]
    # Kempner 2 and 4 GPUs, IBM Cloud T5-3B and T5-11B twice, AWS EKS, Kempner's weak scaling 13B and 70B x 3
    assert len(with_base) == 12
    for r in with_base:
        assert r.base_spec is not None or not r.modelled, r.id
        if r.efficiency_base is not None:
            base = rows[r.efficiency_base]
            assert base.series == r.series, r.id
            assert base.nodes * base.gpus_per_node < r.nodes * r.gpus_per_node, r.id
            assert r.base_spec == base.spec and r.base_network == base.network, r.id
        elif r.base_spec is not None:
            assert r.spec is not None and r.base_spec == r.spec.at_nodes(r.base_spec.nodes), r.id
            assert r.base_spec.nodes < r.nodes and r.base_network is not None, r.id
    kempner = rows["kempner_h200_llama3_8b_mb4ga2_2gpu"]
    assert kempner.base_spec is not None and kempner.base_spec.world_size == 1


def test_the_network_is_nccl_on_the_rows_fabric_with_every_adapter_and_none_on_one_node(
        rows: dict[str, PublishedFsdpRow]) -> None:
    meta = rows["torchtitan_h100_llama31_8b_eager_128gpu"]
    assert meta.network.fabric is meta.fabric and meta.fabric is not None
    assert meta.fabric.scale_out is not None and meta.fabric.scale_out.node_gbs == 8 * 400 / 8
    assert rows["aws_p5_torchtitan_llama3_8b_bf16_4n"].network == published("p5.48xlarge", 32, 4)
    assert rows["aws_p5_torchtitan_llama3_8b_bf16_4n"].fabric is FABRICS["p5.48xlarge"]
    one = rows["torchtitan_h100_llama31_8b_eager_8gpu"]
    assert one.network == network_for(one.fabric, 0, 1) and one.network.fabric.scale_out is None
    assert one.fabric is not None and one.fabric.scale_out is None and one.fabric.scale_up.nvls
    kempner = rows["kempner_h200_llama3_8b_mb4ga2_4gpu"].fabric
    assert kempner is not None and (kempner.scale_up.kind, kempner.scale_up.nvls) == ("nvlink", False)
    assert rows["torchao_8xmi300x_llama3_8b_bf16"].fabric is None  # no GPU of the project's


def write(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rows.yaml"
    path.write_text(yaml.safe_dump(rows, sort_keys=False))
    return path


def row(name: str) -> dict[str, Any]:
    return next(r for r in raw_rows() if r["id"] == name)


KEMPNER_1, KEMPNER_2 = "kempner_h200_llama3_8b_mb4ga2_1gpu", "kempner_h200_llama3_8b_mb4ga2_2gpu"
TWO_NODES = "kempner_h200_13b_fsdp8_2n"  # an arch, a fabric mapping, no efficiency: a file of its own
BAD = {
    "an unknown field": ({"tflops": 400}, "unknown field 'tflops'"),
    "an unknown precision": ({"precision": "fp4"}, "precision='fp4' is not one of"),
    "an unknown GPU": ({"gpu": "MI300X"}, "gpu='MI300X' is not one of"),
    "an unknown fabric": ({"fabric": "p6.48xlarge"}, "fabric='p6.48xlarge' is not one of"),
    "a fabric of another node": ({"fabric": "p5.48xlarge"}, "fabric p5.48xlarge has 8 GPUs per node"),
    "a fabric's unknown field": ({"fabric": {"transport": "roce", "adapters": 4, "gbps": 400, "rdma": True,
                                             "basis": "stated", "mtu": 4096}}, "fabric: unknown field 'mtu'"),
    "an unknown transport": ({"fabric": {"transport": "omnipath", "adapters": 4, "gbps": 200, "rdma": True,
                                         "basis": "stated"}}, "transport='omnipath' is not one of"),
    "an unknown basis": ({"fabric": {"transport": "roce", "adapters": 4, "gbps": 400, "rdma": True,
                                     "basis": "rumour"}}, "basis='rumour' is not one of"),
    "an arch missing a field": ({"arch": {"name": "x", "hidden": 64}}, "arch: missing field 'intermediate'"),
    "an unknown preset": ({"arch": None, "model": "llama4"}, "model='llama4' is not one of"),
    "a global batch the ranks do not make": ({"global_batch": 100}, "global_batch 100 is not"),
    "a modelled row without its micro batch": ({"micro_batch": None}, "a modelled row needs"),
    "a row not modelled without why": ({"modelled": False}, "a row not modelled says why_not"),
    "tokens where only an efficiency is published": ({"measured_as": "efficiency"}, "tokens_per_s_per_gpu"),
    "an efficiency without its base": ({"scaling_efficiency": 0.9}, "takes exactly one of efficiency_base"),
    "a base on as many nodes": ({"scaling_efficiency": 0.9, "efficiency_base_nodes": 2}, "is not fewer"),
    "a shard group of another strategy": ({"shard_group": 4}, "shard_group is HYBRID_SHARD's field"),
    "a number as text": ({"nodes": "2"}, "nodes='2' is not a positive number"),
    "true as a number": ({"seq_len": True}, "seq_len=True is not a positive number"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_the_loader_refuses_a_row_with_a_field_or_value_the_schema_does_not_allow(tmp_path: Path,
                                                                                  case: str) -> None:
    change, message = BAD[case]
    bad = {k: v for k, v in {**row(TWO_NODES), **change}.items() if not (k == "arch" and v is None)}
    fsdp_rows(write(tmp_path, [row(TWO_NODES)]))  # as the file has it, it loads
    with pytest.raises(FsdpRowError) as e:
        fsdp_rows(write(tmp_path, [bad]))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert str(e.value).startswith(f"rows.yaml: row {TWO_NODES}: "), str(e.value)


def test_the_loader_refuses_an_efficiency_base_of_another_series_or_on_as_many_gpus(tmp_path: Path) -> None:
    fsdp_rows(write(tmp_path, [row(KEMPNER_1), row(KEMPNER_2)]))  # as the file has them, they load
    other = {**row(KEMPNER_1), "series": "elsewhere"}
    with pytest.raises(FsdpRowError, match=f"row {KEMPNER_2}: efficiency_base {KEMPNER_1} is not a row of"):
        fsdp_rows(write(tmp_path, [other, row(KEMPNER_2)]))
    four = {**row("kempner_h200_llama3_8b_mb4ga2_4gpu"), "scaling_efficiency": None, "efficiency_base": None}
    larger = {**row(KEMPNER_2), "efficiency_base": four["id"]}
    with pytest.raises(FsdpRowError, match="on fewer GPUs"):
        fsdp_rows(write(tmp_path, [four, larger]))
    with pytest.raises(FsdpRowError, match="efficiency_base 'nowhere' is no row"):
        fsdp_rows(write(tmp_path, [row(KEMPNER_1), {**row(KEMPNER_2), "efficiency_base": "nowhere"}]))
    with pytest.raises(FsdpRowError, match=f"row {KEMPNER_1}: the id is used twice"):
        fsdp_rows(write(tmp_path, [row(KEMPNER_1), row(KEMPNER_1)]))


def test_the_readme_counts_what_the_file_holds(rows: dict[str, PublishedFsdpRow]) -> None:
    text = README.read_text()
    every = fsdp_counts(list(rows.values()))
    new = fsdp_counts([r for r in rows.values() if not r.already_used])
    assert every["rows"] == 484 and new["rows"] == 458
    for what, count in every.items():
        assert f"| {what} | {count} | {new.get(what, 0)} |" in text, what


def test_the_readme_names_every_row_not_modelled(rows: dict[str, PublishedFsdpRow]) -> None:
    """Its "Rows not modelled" table: as many as the file holds, each row named by its id or by a prefix
    the table writes as `prefix_*` (N)."""
    section = README.read_text().split("## Rows not modelled (", 1)[1].split("\n## ", 1)[0]
    named = [n.removesuffix("*") for n in re.findall(r"`([^`]+)`", section)]
    unmodelled = [r.id for r in rows.values() if not r.modelled]
    assert section.startswith(f"{len(unmodelled)})")
    def listed(row_id: str) -> bool:
        return any(row_id == n or (n.endswith("_") and row_id.startswith(n)) for n in named)
    assert [i for i in unmodelled if not listed(i)] == []
