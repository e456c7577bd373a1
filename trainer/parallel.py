"""FSDP2 (fully_shard) with the four classic strategies, activation checkpointing and wrap policies.

Strategy -> FSDP2 (docs/architecture.md): FULL_SHARD = 1-D mesh, reshard_after_forward=True; SHARD_GRAD_OP = 1-D
mesh, False; HYBRID_SHARD = 2-D mesh (replicate across nodes x shard within a node), True; NO_SHARD =
2-D mesh (replicate=world x shard=1): every rank holds whole parameters and gradients are all-reduced,
i.e. DDP semantics. No strategy falls back to another: a mesh that cannot be built is an error.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers import PreTrainedModel

from bench.flops import checkpointed_blocks
from bench.schema import RunSpec
from trainer.model import transformer_blocks

DTYPES = {"fp32": torch.float32, "bf16_mixed": torch.float32, "fp16_mixed": torch.float32,
          "bf16_pure": torch.bfloat16}


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
    if precision == "bf16_mixed":
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
    """Wrap the blocks chosen by bench.flops.checkpointed_blocks; returns how many were wrapped."""
    blocks = transformer_blocks(model)
    chosen = checkpointed_blocks(ac, len(blocks))
    extra = {"context_fn": _selective_op_context} if ac == "selective_op" else {}
    for k in chosen:
        parent, _, i = blocks[k]
        parent[i] = checkpoint_wrapper(parent[i], preserve_rng_state=False, **extra)
    return len(chosen)


def apply_fsdp(model: PreTrainedModel, spec: RunSpec, mesh: DeviceMesh, reshard: bool) -> None:
    """fully_shard every block (transformer_block policy) and then the root."""
    policy = mp_policy(spec.precision)
    if spec.wrap_policy == "transformer_block":
        for parent, _, i in transformer_blocks(model):
            fully_shard(parent[i], mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
