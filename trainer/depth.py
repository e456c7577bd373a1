"""Where a training step's memory peaks, and a deep model's peak from two shallow ones (trainer/memory.py
measures each place; this module names the places and draws the line through them).

A deep model with identical blocks is not stepped whole. Where memory stands while a block runs is
affine in the model's depth and, within one activation checkpointing pattern, in the block's index: the
blocks below still hold their saved inputs, the ones above their gradients. So the peak over the step is
the highest of a few places, each affine in depth: before the first block of each pass, the end blocks
(which prefetch nothing or are prefetched by nobody) and the next ones of each pattern residue at either
end (the middle blocks lie between them), and the optimizer step. Those places, measured on the same
model at two shallow depths one pattern apart (selective AC's every other block is a pattern of 2),
give each place's peak and categories, and the FLOP count, at full depth by a straight line: exactly.
Llama 2 70B costs what 7 blocks cost instead of 80. T5 is stepped whole: its decoder's second block
from the bottom still feels the top block at 3 blocks deep (tested). One peak per pass (forward,
backward) is not enough: the backward's peak moves from its start (activations) to its end (gradients)
as a model deepens. benchmarks/memory_plan.py --check measures every configuration of the GPU sweeps
both ways; trainer/test_memory.py holds a deep tiny model to it under every option.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.core.flops import SELECTIVE_EVERY
from bench.core.models import ModelArch
from bench.core.schema import RunSpec
from trainer.census import config_at_depth


@dataclass
class Peak:
    device: int = 0  # bytes rank 0's GPU held at its peak
    host: int = 0  # bytes of offloaded state (offload=cpu) at their peak
    snapshot: dict[str, int] = field(default_factory=dict)  # the tracker's categories at the GPU's peak


def highest(places: dict[str, Peak]) -> Peak:
    """The step's peak: the GPU's highest place with its categories, and the host's highest."""
    top = max(places.values(), key=lambda p: p.device)
    return Peak(top.device, max(p.host for p in places.values()), top.snapshot)


def pattern(spec: RunSpec) -> int:
    """Blocks after which activation checkpointing's choice of blocks repeats."""
    return SELECTIVE_EVERY if spec.activation_checkpointing == "selective" else 1


def places(index: int, depth: int, period: int) -> tuple[str, ...]:
    """Where block `index` of `depth` stands: counted from the bottom and from the top within `period` + 1
    of either end (a block near both ends is in two places), else in the middle."""
    named = tuple(f"{end}{k}" for end, k in (("bottom", index), ("top", depth - 1 - index)) if k <= period)
    return named or ("middle",)


def shallow_depths(spec: RunSpec) -> tuple[int, int] | None:
    """The two depths that give a deep model's peak: one block pattern apart, congruent with its depth, and
    deep enough that the blocks places() counts from either end, bar the ends, are middle blocks;
    None where the model is measured whole: blocks that differ (layer_types: Gemma 2's sliding and global
    attention), too few blocks for two shallow models to cost less, or T5 (its decoder blocks' places are
    not affine from these depths: at 3B, 3 and 4 blocks put the 9-block peak 1.3% low)."""
    from trainer.model import hf_config
    arch = spec.arch
    differ = arch.counted is not None and len(set(arch.counted.block_params)) > 1
    if arch.family == "t5" or differ or len(set(getattr(hf_config(arch), "layer_types", None) or [None])) > 1:
        return None
    period = pattern(spec)
    first = period + 2 + (arch.layers - period - 2) % period  # its top and bottom places are middle blocks
    return (first, first + period) if 2 * first + period < arch.layers else None


def at_depth(arch: ModelArch, blocks: int) -> ModelArch:
    """The same model with `blocks` blocks (a brought config's num_hidden_layers and layer_types too)."""
    if not arch.config_json:
        return replace(arch, layers=blocks)
    return replace(arch, layers=blocks, config_json=config_at_depth(arch.config_json, blocks))


def on_line(x1: float, x2: float, depths: tuple[int, int], depth: int) -> float:
    """Through (depths[0], x1) and (depths[1], x2), at depth."""
    return x2 + (x2 - x1) * (depth - depths[1]) / (depths[1] - depths[0])


def extrapolate(shallow: tuple[dict[str, Peak], dict[str, Peak]], depths: tuple[int, int],
                depth: int) -> dict[str, Peak]:
    """Each place's peak and categories at `depth`, on the line through the two shallow models' (bytes).
    A place only one of them has (a middle block) lies between the places both have."""
    out = {}
    for place in shallow[0].keys() & shallow[1].keys():
        a, b = shallow[0][place], shallow[1][place]
        snapshot = {k: round(on_line(a.snapshot.get(k, 0), b.snapshot.get(k, 0), depths, depth))
                    for k in a.snapshot.keys() | b.snapshot.keys()}
        out[place] = Peak(round(on_line(a.device, b.device, depths, depth)),
                          round(on_line(a.host, b.host, depths, depth)), snapshot)
    return out
