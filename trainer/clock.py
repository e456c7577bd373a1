"""Each rank's own compute time per step, without the time it waits for its peers.

Synchronous FSDP makes every rank's step as long as the slowest rank's: the others wait in the collectives.
So a straggler is found by what each rank's compute took, not by its step time. This clock times the
forward and backward of each transformer block and of the output layer between FSDP2's own hooks:

- forward: from a pre-hook that runs after FSDP's pre-forward (which waits for the all-gather) to a hook
  that runs before FSDP's post-forward;
- backward: from a gradient hook on the block's output registered after FSDP's pre-backward hook (which
  waits for the backward all-gather) to an identity autograd function on the block's inputs applied after
  FSDP's post-backward function (so the reduce-scatter it issues is outside).

Marks are CUDA events on the compute stream (what the GPU did, read once after the last step) or wall time
on the CPU, where gloo's waits block the calling thread and compute is synchronous.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Mark = Any  # a torch.cuda.Event, or a perf_counter reading


class _MarkOnBackward(torch.autograd.Function):
    """Identity whose backward marks the end of a module's backward compute (its inputs' gradients done)."""

    @staticmethod
    def forward(ctx: Any, close: Callable[[], None], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.close = close
        return tensors

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        ctx.close()
        return (None, *grads)


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors that require grad in a module's arguments or output (tuples, lists, dicts, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _grad_tensors(v)]
    return []


def _replace(value: Any, new: dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return new.get(id(value), value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_replace(v, new) for v in value)
    if isinstance(value, list):
        return [_replace(v, new) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, new) for k, v in value.items()}
    return value


class ComputeClock:
    """Install after fully_shard (its hooks must come after FSDP's); `step()` before each timed step;
    `per_step_s()` after the last, the compute seconds of each step."""

    def __init__(self, modules: list[nn.Module], device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.steps: list[list[tuple[Mark, Mark]]] = []
        for module in modules:
            self._install(module)

    def _mark(self) -> Mark:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def step(self) -> None:
        """The marks from here on belong to a new step."""
        self.steps.append([])

    def _interval(self) -> tuple[Callable[[], None], Callable[[], None]]:
        opened: list[Mark] = []

        def open_() -> None:
            opened.append(self._mark())

        def close() -> None:
            if opened and self.steps:
                self.steps[-1].append((opened.pop(), self._mark()))
        return open_, close

    def _install(self, module: nn.Module) -> None:
        forward_open, forward_close = self._interval()
        backward: dict[str, Callable[[], None]] = {}  # this forward's backward interval, opened later

        def pre_forward(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            backward["open"], close = self._interval()
            inputs = _grad_tensors((args, kwargs))
            if inputs:  # applied after FSDP's post-backward function: its backward runs before FSDP's
                new = dict(zip(map(id, inputs), _MarkOnBackward.apply(close, *inputs)))
                args, kwargs = _replace(args, new), _replace(kwargs, new)
            forward_open()
            return args, kwargs

        def post_forward(_: nn.Module, args: tuple, output: Any) -> None:
            forward_close()

        def after_fsdp_post_forward(_: nn.Module, args: tuple, output: Any) -> None:
            outputs = _grad_tensors(output)
            if outputs:  # registered after FSDP's pre-backward hook on the same tensor: runs after its wait
                opener = backward["open"]
                outputs[0].register_hook(lambda grad: opener())

        module.register_forward_pre_hook(pre_forward, with_kwargs=True)
        module.register_forward_hook(post_forward, prepend=True)
        module.register_forward_hook(after_fsdp_post_forward)

    def per_step_s(self) -> list[float]:
        """Seconds of compute in each step (reads the CUDA events: call after the last step's sync)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [sum(a.elapsed_time(b) for a, b in marks) / 1e3 for marks in self.steps]
        return [sum(b - a for a, b in marks) for marks in self.steps]


def steady_compute_s(per_step: list[float], warmup_steps: int) -> float | None:
    """The median compute seconds of the steady steps (None without any)."""
    steady = per_step[warmup_steps:]
    return statistics.median(steady) if steady else None


def timed_modules(model: nn.Module) -> list[nn.Module]:
    """What the clock times: each transformer block as FSDP wraps it (checkpointed, compiled), and the
    output layer, inside the root unit (its parameters gathered before the first block runs)."""
    from trainer.model import transformer_blocks
    head = model.get_output_embeddings()
    return [parent[i] for parent, _, i in transformer_blocks(model)] + ([head] if head is not None else [])
