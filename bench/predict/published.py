"""Published FSDP throughput rows: what bench/predict/perf.py's constants were fitted to (CALIBRATION_ROWS)
and what checks them without having been fitted (CHECK_ROWS: llm-foundry's whole table, read from
data/llm_foundry_benchmarks.md, and torchtitan's Float8 rows). Each row cites its source. The multi-node rows
collected for issue 77 are data, benchmarks/published/fsdp/rows.yaml, read by
bench/predict/published_fsdp.py.

A row is a run as this harness would describe it, on the publisher's hardware and network. Where the
publisher's setup differs from ours, the row says how it was mapped:
- IBM's fms-fsdp reduces gradients in bf16 (its bfSixteen policy): precision bf16_pure, whose gathers and
  reductions are both 2 bytes, as theirs;
- torchtitan's "selective op" AC recomputes every second matmul: half a forward pass, as layer-level
  `selective` (every second block) recomputes;
- llm-foundry's MPT models (GELU MLP of 4 d, learned position embeddings) as Llama-family architectures of
  the same matmul FLOPs (a SwiGLU MLP of 8d/3), vocab 50368, sizes from its scripts/train/yamls/pretrain;
  its amp_bf16 as bf16_mixed, bf16 PURE as bf16_pure, amp_fp8 (TransformerEngine) as fp8_tensorwise,
  activation checkpointing True as full; its H100 network is not stated (taken as 3200 Gb/s per node); its
  training stack as a perf.Stack (FOUNDRY_2023, FOUNDRY_FLASH2: from the commits that published each table);
- torchtitan's H100s are the 96 GB HBM2e part at 500 W (2.4 TB/s); they compute MFU against the SXM peak.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.core.fabric import ScaleOut, gpu_node
from bench.core.hardware import GPUS, GpuSpec
from bench.core.models import ModelArch, get_arch
from bench.core.schema import RunSpec
from bench.predict.comm import Network
from bench.predict.network import network_for, published
from bench.predict.perf import Stack

IBM = ("PyTorch blog, \"Maximizing training throughput using PyTorch FSDP\" (IBM and Meta, 2024-03-13), "
       "Table 1; sharding per foundation-model-stack/fms-fsdp README")
FMS = "foundation-model-stack/fms-fsdp README, throughput table (128 A100)"
TT_A100 = "pytorch/torchtitan docs/performance.md @4d88a8a (64 A100 80GB)"
TT_H100 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3"
AWS = ("AWS ML blog, \"Scale LLMs with PyTorch 2.0 FSDP on Amazon EKS - Part 2\" (2024-04): 87% scaling "
       "efficiency at 16 p5.48xlarge nodes; the configuration is not stated: taken as this harness's "
       "p5_scaling (Llama 2 7B, FULL_SHARD, bf16, full AC, micro batch 1, seq 4096)")
FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md @4952183"
FOUNDRY_TABLE = Path(__file__).parent / "data" / "llm_foundry_benchmarks.md"

CODELLAMA_34B = ModelArch("codellama_34b", "llama", 8192, 22016, 48, 64, 8, 128, 32000, False, 16384)
H100_96GB_500W = GpuSpec("H100-96GB-500W", 96, GPUS["H100-SXM"].peak_tflops,
                         "torchtitan's Grand Teton H100: 96 GB HBM2e, 2.4 TB/s, 500 W", hbm_tbs=2.4,
                         intra_busbw_gbs=GPUS["H100-SXM"].intra_busbw_gbs, family="H100",
                         compute_capability=90)


def _mpt(name: str, d: int, layers: int, heads: int) -> ModelArch:
    return ModelArch(name, "llama", d, round(8 * d / 3), layers, heads, heads, d // heads, 50368, True, 65536)


MPT = {f"mpt_{size}": _mpt(f"mpt_{size}", d, layers, heads) for size, d, layers, heads in [
    ("125m", 768, 12, 12), ("350m", 1024, 24, 16), ("760m", 1536, 24, 12), ("1b", 2048, 24, 16),
    ("3b", 2560, 32, 20), ("7b", 4096, 32, 32), ("13b", 5120, 40, 40), ("30b", 7168, 48, 56),
    ("70b", 8192, 80, 64)]}  # d_model, n_layers, n_heads of llm-foundry's yamls/pretrain/mpt-<size>.yaml


@dataclass(frozen=True)
class PublishedRow:
    source: str
    arch: ModelArch
    gpu: GpuSpec
    spec: RunSpec  # model is the arch's name only where it is a preset; the arch is what counts
    network: Network
    tokens_per_s_per_gpu: float | None = None
    scaling_efficiency: float | None = None  # against base_nodes, where that is what was published
    base_nodes: int = 1
    # the publisher's training stack, where it is not one perf's constants describe
    stack: Stack | None = None

    @property
    def label(self) -> str:
        s = self.spec
        return (f"{self.arch.name} {self.gpu.name} {s.nodes}x{s.gpus_per_node} {s.sharding} {s.precision} "
                f"AC {s.activation_checkpointing} mb {s.micro_batch} seq {s.seq_len}"
                f"{' compile' if s.compile else ''}")


def _row(source: str, arch: ModelArch | str, gpu: str | GpuSpec, nodes: int, sharding: str, ac: str, mb: int,
         seq: int, node_gbps: float, tokens: float | None = None, *, precision: str = "bf16_mixed",
         compile: bool = False, efficiency: float | None = None, stack: Stack | None = None,
         global_batch: int = 0, accumulation: str = "sync_each") -> PublishedRow:
    arch = get_arch(arch) if isinstance(arch, str) else arch
    spec = RunSpec(model="tiny_llama", nodes=nodes, gpus_per_node=8, sharding=sharding, precision=precision,
                   activation_checkpointing=ac, micro_batch=mb, seq_len=seq, compile=compile,
                   global_batch=global_batch, accumulation=accumulation)
    spec_gpu = GPUS[gpu] if isinstance(gpu, str) else gpu
    return PublishedRow(source, arch, spec_gpu, spec, rdma_network(spec_gpu, nodes, node_gbps), tokens,
                        efficiency, stack=stack)


def rdma_network(gpu: GpuSpec, nodes: int, node_gbps: float, transport: str = "roce") -> Network:
    """A published row's network where its publisher states a node's RDMA line rate alone: 8 adapters sharing
    it (one per GPU, as HGX nodes have them) on the GPU's board. RoCE where the link layer is stated so or
    known (llm-foundry's A100 tables name it; IBM's Vela cluster, the fms-fsdp rows, is RoCE: its rows in
    benchmarks/published/fsdp say so) and where it is not stated (torchtitan's "backend RDMA network",
    llm-foundry's H100 tables): an assumption, whose sensitivity benchmarks/evidence/README.md gives."""
    fabric = gpu_node(gpu.name, 8, gpu.compute_capability or 90, ScaleOut(transport, 8, node_gbps / 8, True))
    return network_for(fabric, 0, nodes)


A100, H100 = "A100-SXM4-80GB", "H100-SXM"
FP = "bf16_pure"  # fms-fsdp: bf16 gathers and bf16 gradient reduction
CALIBRATION_ROWS: list[PublishedRow] = [
    # A100 80GB, 128 GPUs, 400 Gb/s per node; H100 80GB, 96 GPUs, 800 Gb/s per node; seq 4096
    _row(IBM, "llama2_7b", A100, 16, "HYBRID_SHARD", "none", 2, 4096, 400, 3700, precision=FP),
    _row(IBM, "llama2_13b", A100, 16, "HYBRID_SHARD", "selective", 2, 4096, 400, 1800, precision=FP),
    _row(IBM, CODELLAMA_34B, A100, 16, "FULL_SHARD", "full", 2, 4096, 400, 700, precision=FP),
    _row(IBM, "llama2_70b", A100, 16, "FULL_SHARD", "full", 2, 4096, 400, 370, precision=FP),
    _row(IBM, "llama2_7b", H100, 12, "HYBRID_SHARD", "none", 2, 4096, 800, 7500, precision=FP),
    _row(IBM, "llama2_13b", H100, 12, "HYBRID_SHARD", "selective", 2, 4096, 800, 3800, precision=FP),
    _row(IBM, CODELLAMA_34B, H100, 12, "FULL_SHARD", "full", 2, 4096, 800, 1550, precision=FP),
    _row(IBM, "llama2_70b", H100, 12, "FULL_SHARD", "full", 2, 4096, 800, 800, precision=FP),
    _row(FMS, "llama2_7b", A100, 16, "HYBRID_SHARD", "none", 2, 4096, 400, 3760, precision=FP),
    _row(FMS, "llama2_13b", A100, 16, "HYBRID_SHARD", "none", 1, 4096, 400, 1700, precision=FP),
    _row(FMS, CODELLAMA_34B, A100, 16, "FULL_SHARD", "full", 8, 4096, 400, 772, precision=FP),
    _row(FMS, "llama2_70b", A100, 16, "FULL_SHARD", "full", 6, 4096, 400, 380, precision=FP),
    # torchtitan on 64 A100 (network not stated: taken as llm-foundry's A100 cluster, 1600 Gb/s)
    _row(TT_A100, "llama3_1_8b", A100, 8, "FULL_SHARD", "selective", 1, 8192, 1600, 2904),
    _row(TT_A100, "llama3_1_8b", A100, 8, "FULL_SHARD", "selective", 1, 8192, 1600, 2973),  # "op" SAC
    _row(TT_A100, "llama3_1_70b", A100, 8, "FULL_SHARD", "full", 1, 8192, 1600, 331),
    _row(TT_A100, "llama2_13b", A100, 8, "FULL_SHARD", "none", 2, 4096, 1600, 2162),
    _row(TT_A100, "llama2_13b", A100, 8, "FULL_SHARD", "selective", 2, 4096, 1600, 1914),
    _row(TT_A100, "llama2_13b", A100, 8, "FULL_SHARD", "selective", 2, 4096, 1600, 1904),  # "op" SAC
    _row(TT_A100, "llama2_70b", A100, 8, "FULL_SHARD", "selective", 1, 4096, 1600, 355),  # "op" SAC
    _row(TT_A100, "llama2_70b", A100, 8, "FULL_SHARD", "full", 2, 4096, 1600, 353),
    # torchtitan on H100 96GB (400 Gb/s per GPU: 3200 per node); "selective op" AC, local batch 2, seq 8192
    _row(TT_H100, "llama3_1_8b", H100_96GB_500W, 1, "FULL_SHARD", "selective", 2, 8192, 3200, 5762),
    _row(TT_H100, "llama3_1_8b", H100_96GB_500W, 16, "FULL_SHARD", "selective", 2, 8192, 3200, 5605),
    _row(TT_H100, "llama3_1_8b", H100_96GB_500W, 1, "FULL_SHARD", "selective", 2, 8192, 3200, 6667,
         compile=True),
    _row(TT_H100, "llama3_1_8b", H100_96GB_500W, 16, "FULL_SHARD", "selective", 2, 8192, 3200, 6514,
         compile=True),
]
_p5 = RunSpec(model="llama2_7b", nodes=16, gpus_per_node=8, activation_checkpointing="full", micro_batch=1,
              seq_len=4096, efa_per_node=32, cluster="p5.48xlarge")
CALIBRATION_ROWS.append(PublishedRow(AWS, get_arch("llama2_7b"), GPUS[H100], _p5,
                                     published("p5.48xlarge", 32, 16), scaling_efficiency=0.87, base_nodes=1))

# llm-foundry's training stacks, from the commits that published its tables (mosaicml/llm-foundry, history of
# scripts/train/benchmarking/README.md): the A100 tables (300cc5c58, 2023-05) and the H100 BF16 and FP8 tables
# (b2a43a147, 2023-10) ran torch 1.13.1 images with `pip install .[gpu]` (flash-attn 1.0.x) and
# submit_benchmarks.py's attn_impl triton (flash-attn 1.x's Triton kernel, written for the A100); the
# large-scale H100 table (5e85bd62d, 2024-01) ran `.[gpu-flash2]` (flash-attn 2.4.2, torch 2.1), attn_impl
# flash but for 13b and 30b (triton), per its sweep.py. Their figures come from sources, never from the table:
# - traffic: an MPT block (llmfoundry/models/layers/blocks.py: low_precision_layernorm, one bf16 kernel per
#   norm; one attention kernel; no biases) moves about 44 bytes per hidden unit and forward pass (LayerNorm 4,
#   attention in and out 8, two residual adds 12, LayerNorm 4, GELU over 4d 16); Hugging Face's eager Llama
#   about 160 (an fp32 RMSNorm of five operators per norm, rotary, a SiLU-gated MLP);
# - attention: FlashAttention-1 reaches "only 25-40% of the theoretical maximum FLOPs/s" of an A100 (the
#   midpoint taken) and FlashAttention-2 "around 2x" its speed (Dao, FlashAttention-2, arXiv 2307.08691,
#   abstract); FlashAttention-2 reaches "only 35% utilization on H100" (Shah et al., FlashAttention-3, arXiv
#   2407.08608, abstract), so a FlashAttention-1 class kernel half of that on an H100 (neither uses Hopper's
#   new instructions).
FOUNDRY_TRAFFIC = 44 / 160
# Its loss, per logit (traffic.loss_bytes; at b2a43a1, the commit that published the A100 and 2023 H100
# tables):
# - flash-attn's fused cross entropy (ComposerMPTCausalLM's default loss_fn, fused_crossentropy) reads the
#   16-bit logits in its forward, reads them again and writes their gradient in its backward: 6;
# - Composer computes the model's train metrics on every micro-batch's logits (Trainer._train_microbatch ->
#   _eval_train_metrics, under the autocast context; use_train_metrics defaults to True): LanguageCrossEntropy
#   and LanguagePerplexity, its subclass, each a torch cross entropy: log_softmax in the logits' dtype
#   (read 2, write 2; cross_entropy passes the input's dtype), then nll_loss, on CUDA autocast's fp32 list,
#   which casts the log-probabilities to fp32 first (read 2, write 4): 10 each.
FOUNDRY_LOSS_BYTES = 6 + 2 * 10
FOUNDRY_2023 = Stack("llm-foundry: MPT blocks, FlashAttention-1 class kernel (flash-attn 1.x, triton)",
                     FOUNDRY_TRAFFIC, {"A100": 0.325, "H100": 0.35 / 2}, FOUNDRY_LOSS_BYTES)
FOUNDRY_FLASH2 = Stack("llm-foundry: MPT blocks, flash-attn 2.4.2", FOUNDRY_TRAFFIC, {"H100": 0.35},
                       FOUNDRY_LOSS_BYTES)
FOUNDRY_LARGE_TRITON = ("mpt_13b", "mpt_30b")  # the large-scale sweep's attn_impl triton models


def foundry_stack(section: str, model: str) -> Stack:
    """The stack one row of llm-foundry's table ran: by its table, and in the large-scale table by model."""
    if section.startswith("H100 80GB BF16 (Large Scale") and model not in FOUNDRY_LARGE_TRITON:
        return FOUNDRY_FLASH2
    return FOUNDRY_2023


# Composer, llm-foundry's trainer, skips gradient sync between micro-batches (its DDP sync strategy's
# no_sync) only for a DistributedDataParallel model: ddp_sync_context (composer/distributed/
# dist_strategy.py) returns at once for any other module, FSDP's included, so an FSDP run reduces its
# gradients every micro-batch: this harness's sync_each (a step's FLOPs are the same under either)
FOUNDRY_ACCUMULATION = "sync_each"
FOUNDRY_GPUS = {"h100_80gb": (H100, 3200), "a100_80gb": (A100, 1600), "a100_40gb": ("A100-SXM4-40GB", 1600)}
FOUNDRY_PRECISION = {"amp_bf16": "bf16_mixed", "bf16": "bf16_pure", "amp_fp8": "fp8_tensorwise"}


@dataclass(frozen=True)
class FoundryRow:
    """One row of llm-foundry's table as published, beside the run it maps to."""

    row: PublishedRow
    mfu: float  # their MFU, as a fraction
    num_params: int  # their NumParams (learned position embeddings of seq_len x d_model included)
    section: str


def foundry_table(path: Path = FOUNDRY_TABLE) -> list[FoundryRow]:
    """Every row of llm-foundry's published benchmark tables (data/llm_foundry_benchmarks.md)."""
    out, section = [], ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or f"mpt_{cells[0]}" not in MPT:
            continue
        size, seq, gpus, gpu, mfu, _, _, mb, accum, global_batch, _, _, tokens, _, precision, _, sharding, \
            ac, _, n = cells
        name, network = FOUNDRY_GPUS[gpu]
        assert int(mb) * int(accum) * int(gpus) == int(global_batch), line  # the table's own arithmetic
        row = _row(FOUNDRY, MPT[f"mpt_{size}"], name, int(gpus) // 8, sharding,
                   "full" if ac == "True" else "none", int(mb), int(seq), network, float(tokens),
                   precision=FOUNDRY_PRECISION[precision], stack=foundry_stack(section, f"mpt_{size}"),
                   global_batch=int(global_batch), accumulation=FOUNDRY_ACCUMULATION)
        out.append(FoundryRow(row, float(mfu) / 100, int(n), section))
    return out


def foundry_rows() -> list[PublishedRow]:
    return [r.row for r in foundry_table()]


CHECK_ROWS: list[PublishedRow] = foundry_rows() + [  # never fitted to
    # torchtitan's Float8 rows check the FP8 matmul and 1-byte gather terms, which nothing was fitted to
    _row(TT_H100, "llama3_1_8b", H100_96GB_500W, 1, "FULL_SHARD", "selective", 2, 8192, 3200, 8532,
         precision="fp8_tensorwise", compile=True),
    _row(TT_H100, "llama3_1_8b", H100_96GB_500W, 16, "FULL_SHARD", "selective", 2, 8192, 3200, 8380,
         precision="fp8_tensorwise", compile=True),
]


# ---------------------------------------------------------------- published multi-node FSDP rows (issue 77)
# benchmarks/published/fsdp/rows.yaml: one entry per collected row, mapped to this harness's axes; the README
# beside it says the schema and every mapping rule. Found from the project's root as bench/launchers/base.py
# PROJECT_ROOT finds it (bench reads the file and imports nothing of benchmarks).
