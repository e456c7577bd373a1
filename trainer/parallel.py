"""FSDP2 (fully_shard) with the four classic strategies, activation checkpointing, wrap policies, and the
H100-era options: Float8 linears (torchao), regional torch.compile and CPU offload.

Order, as torchtitan applies them: Float8 conversion -> activation checkpointing -> compile each block ->
fully_shard (the compiled block is what FSDP wraps, so its hooks run outside the compiled graph).

Strategy -> FSDP2 (docs/worker.md, "FSDP2 mapping"): FULL_SHARD = 1-D mesh, reshard_after_forward=True;
SHARD_GRAD_OP = 1-D mesh, False; HYBRID_SHARD = 2-D mesh (replicate across nodes x shard within a node),
True; NO_SHARD = 2-D mesh (replicate=world x shard=1): every rank holds whole parameters and gradients are
all-reduced, i.e. DDP semantics. No strategy falls back to another: a mesh that cannot be built is an error.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from bench.core.flops import checkpointed_blocks
from bench.core.models import ModelArch
from bench.core.schema import RunSpec
from trainer.model import PreTrainedModel, build_meta_model, transformer_blocks  # transformers, as model.py

DTYPES = {"fp32": torch.float32, "bf16_mixed": torch.float32, "fp16_mixed": torch.float32,
          "bf16_pure": torch.bfloat16, "fp8_tensorwise": torch.float32}


@dataclass(frozen=True)
class MeshInfo:
    """What was built, echoed in the meta record so tests and users can check it."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    shard_group: list[int]  # global ranks this rank shards parameters with
    replicate_group: list[int]  # global ranks holding the same shard
    reshard_after_forward: bool


def build_mesh(spec: RunSpec, device_type: str) -> tuple[DeviceMesh, bool]:
    """The device mesh and reshard_after_forward flag of the spec's strategy."""
    world = spec.world_size
    if spec.sharding == "HYBRID_SHARD":
        return init_device_mesh(device_type, (spec.nodes, spec.gpus_per_node),
                                mesh_dim_names=("replicate", "shard")), True
    if spec.sharding == "NO_SHARD":
        return init_device_mesh(device_type, (world, 1), mesh_dim_names=("replicate", "shard")), False
    mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    return mesh, spec.sharding == "FULL_SHARD"


def mesh_info(mesh: DeviceMesh, reshard: bool) -> MeshInfo:
    names = tuple(mesh.mesh_dim_names or ())
    shard = mesh["shard"] if len(names) > 1 else mesh
    rep = [int(r) for r in mesh["replicate"].mesh.flatten()] if "replicate" in names else [mesh.get_rank()]
    return MeshInfo(shape=tuple(mesh.shape), dim_names=names,
                    shard_group=[int(r) for r in shard.mesh.flatten()], replicate_group=rep,
                    reshard_after_forward=reshard)


def mp_policy(precision: str) -> MixedPrecisionPolicy:
    """Mixed precision keeps fp32 master weights and reduces gradients in fp32."""
    if precision in ("bf16_mixed", "fp8_tensorwise"):  # Float8 linears cast their BF16 inputs themselves
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision == "fp16_mixed":
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # fp32 and bf16_pure compute in the parameters' own dtype


# selective_op: the outputs of these ops are saved; everything else in a block is recomputed (norms,
# activations, elementwise products: no matmul FLOPs). As torchtitan's op-level selective AC, without its
# every-other-matmul variant.
_SAVED_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
              torch.ops.aten.baddbmm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
              torch.ops.aten._scaled_dot_product_flash_attention.default,
              torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_op_context():
    return create_selective_checkpoint_contexts(_save_matmuls)


def apply_activation_checkpointing(model: PreTrainedModel, ac: str) -> int:
    """Wrap the blocks chosen by bench.core.flops.checkpointed_blocks; returns how many were wrapped."""
    blocks = transformer_blocks(model)
    chosen = checkpointed_blocks(ac, len(blocks))
    extra = {"context_fn": _selective_op_context} if ac == "selective_op" else {}
    for k in chosen:
        parent, _, i = blocks[k]
        parent[i] = checkpoint_wrapper(parent[i], preserve_rng_state=False, **extra)
    return len(chosen)


def float8_filter(module: torch.nn.Module, fqn: str) -> bool:
    """Which linears become Float8: those inside transformer blocks whose dimensions _scaled_mm takes
    (multiples of 16). The output projection (lm_head) stays in BF16, as torchtitan keeps it, and
    embeddings are not linears."""
    return (isinstance(module, torch.nn.Linear) and "lm_head" not in fqn
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert_float8(model: PreTrainedModel, device: torch.device) -> int:
    """torchao's Float8 training (tensorwise dynamic scaling) with FSDP2 float8 all-gather; returns how
    many linears were converted. Off CUDA, torchao's emulation runs the float8 casts with matmuls in
    higher precision (the CPU tests); on a GPU without FP8 tensor cores it is an error, never emulated."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise RuntimeError(f"fp8_tensorwise needs FP8 tensor cores (compute capability 8.9+: H100, H200, L4, "
                           f"B200); {torch.cuda.get_device_name(device)} is sm_{major}{minor}")
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=device.type != "cuda")
    convert_to_float8_training(model, config=config, module_filter_fn=float8_filter)
    converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    if not converted:  # never a bf16 run labelled fp8
        raise RuntimeError("fp8_tensorwise: no linear inside a block has dimensions that are multiples of 16")
    return converted


def compile_blocks(model: PreTrainedModel) -> int:
    """torch.compile each transformer block in place of itself (regional compilation: identical blocks
    share one compiled graph, the embedding and loss stay eager); returns how many."""
    blocks = transformer_blocks(model)
    for parent, _, i in blocks:
        parent[i] = torch.compile(parent[i])
    return len(blocks)


def offload_policy(offload: str, device: torch.device) -> OffloadPolicy:
    """offload=cpu: parameters, gradients and optimizer state live in host memory (pinned on CUDA, for
    asynchronous copies); the optimizer steps on the CPU."""
    if offload == "cpu":
        return CPUOffloadPolicy(pin_memory=device.type == "cuda")
    return OffloadPolicy()


def apply_fsdp(model: PreTrainedModel, spec: RunSpec, mesh: DeviceMesh, reshard: bool,
               device: torch.device) -> None:
    """fully_shard every block (transformer_block policy) and then the root."""
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard, "mp_policy": mp_policy(spec.precision),
              "offload_policy": offload_policy(spec.offload, device)}
    if spec.wrap_policy == "transformer_block":
        for parent, _, i in transformer_blocks(model):
            fully_shard(parent[i], **kwargs)
    fully_shard(model, **kwargs)


@dataclass(frozen=True)
class Parallelized:
    """The sharded model on the meta device, and what was built (echoed in the meta record)."""

    model: PreTrainedModel
    mesh: MeshInfo
    float8_linears: int
    checkpointed_blocks: int
    compiled_blocks: int


def parallelize(spec: RunSpec, arch: ModelArch, device: torch.device,
                attn_impl: str = "sdpa") -> Parallelized:
    """The worker's model for a spec, in the order above, still on the meta device. The trainer and the
    memory measurement (trainer/memory.py) both build through here, so the prediction follows any change."""
    model = build_meta_model(arch, DTYPES[spec.precision], attn_impl, spec.seq_len)
    n_fp8 = convert_float8(model, device) if spec.precision == "fp8_tensorwise" else 0
    n_ckpt = apply_activation_checkpointing(model, spec.activation_checkpointing)
    n_compiled = compile_blocks(model) if spec.compile else 0
    mesh, reshard = build_mesh(spec, device.type)
    apply_fsdp(model, spec, mesh, reshard, device)
    return Parallelized(model, mesh_info(mesh, reshard), n_fp8, n_ckpt, n_compiled)


def build_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW over the sharded parameters, foreach: torch's own default on a GPU (torchtitan defaults to
    fused); trainer/memory.py's measurements and the GPU evidence were taken with it."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=True)


def grad_scaler(precision: str, device: torch.device):
    """fp16 needs loss scaling; ShardedGradScaler skips a step on every rank if any rank saw inf."""
    if precision != "fp16_mixed":
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    # the scaler's one-element scale meets DTensor gradients, which DTensor replicates as it should, with
    # a UserWarning in every run's log that reads as a fault: not one
    warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1", category=UserWarning)
    return ShardedGradScaler(device=device.type)


def backward(loss: torch.Tensor, scaler) -> None:
    """The backward pass (of the scaled loss under fp16)."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def optimizer_step(optimizer: torch.optim.Optimizer, scaler) -> None:
    """The optimizer step (skipped by fp16's scaler on inf) and zeroing of the gradients."""
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def accumulate(model: torch.nn.Module, accumulation: str, last: bool) -> None:
    """Before each micro-batch of a step: what FSDP2 does with this micro-batch's gradients and parameters
    (bench.core.schema.ACCUMULATIONS). On the last micro-batch every mode syncs as the default does, so the
    optimizer always steps on the whole step's reduced, sharded gradients. sync_each sets nothing."""
    if accumulation == "sync_once":  # no reduce-scatter (nor HSDP all-reduce): unsharded gradients build up
        model.set_requires_gradient_sync(last)
    elif accumulation == "allreduce_once":  # HSDP: reduce-scatter within a node each time, across nodes once
        model.set_requires_all_reduce(last)
    elif accumulation == "keep_gathered":  # the next forward finds its parameters gathered
        model.set_reshard_after_backward(last)


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler) -> None:
    """Backward, optimizer step and zeroing of the gradients: the rest of one training step."""
    backward(loss, scaler)
    optimizer_step(optimizer, scaler)
