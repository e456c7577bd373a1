"""`python -m trainer.memory`: a planned run's per-GPU peak memory, measured before anything launches.

The run's own model and parallelization (`trainer.parallel.parallelize`: Float8 linears, activation
checkpointing, wrap policy, offload policy, sharding strategy and the mesh of nodes x gpus_per_node) and its
optimizer run training steps on fake tensors (shapes and devices, no storage) over a fake process group of
the run's world size, and torch's FSDPMemTracker follows every tensor rank 0 holds. Nothing is allocated:
Llama 2 70B on 128 ranks measures on a laptop. A change to the worker changes the measurement by itself.

Reads RunSpec dicts, one JSON object per line, on stdin; writes one `memory` metric record per spec on stdout
(bench/predict/memory.py runs this command and caches what it prints; the orchestration never imports torch).

Where the measured step differs from the run on its GPUs (the planner's headroom covers what is not here):
- the device is the CPU: FSDP2 on a CUDA mesh needs CUDA streams, which a CPU build of torch lacks. Model,
  FSDP2 and optimizer take the same code path and allocate the same tensors on both (SDPA: one output and
  its log-sum-exp saved, no T x T matrix). What the caching allocator adds (CUDA context, NCCL buffers,
  fragmentation) is not a tensor and is the planner's headroom;
- compile=true is measured eager: fake tensors are not compiled;
- fp16_mixed runs without its loss scaler: unscaling works in place on the gradients, and the decision to
  skip a step reads a value, which a fake tensor does not have;
- AdamW's state is created before the tracked step, so the tracked step is a steady one: the window the
  worker's own peak counters cover. For a brought model that is a whole step counted by torch's
  FlopCounterMode (FLOPs per token, recompute included); counting the tracked step would change what the
  tracker sees.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from bench.core.records import format_record
from bench.core.schema import RunSpec

GIB = 2**30
TOTAL = "Total"
# FSDPMemTracker's categories as the plan and report name them.
CATEGORIES = {"Sharded Param": "params", "Unsharded Param": "params", "Buffer": "params",
              "Sharded Grad": "grads", "Unsharded Grad": "grads", "OptState": "optimizer",
              "Activation": "activations", "Temp": "temporaries", "All Gather": "temporaries",
              "Reduce Scatter": "temporaries", "Inputs": "temporaries"}
# What CPUOffloadPolicy keeps in host memory: the sharded parameters, their gradients, AdamW's state.
OFFLOADED = ("Sharded Param", "Sharded Grad", "OptState")


def _count_cpu_attention() -> None:
    """FlopCounterMode knows SDPA's GPU kernels; the measurement runs on the CPU, whose flash kernel it does
    not know (and would count as 0). The same shapes do the same matmuls: count them as torch counts SDPA."""
    from torch.utils import flop_counter as fc
    aten = torch.ops.aten
    if aten._scaled_dot_product_flash_attention_for_cpu in fc.flop_registry:
        return
    for cpu, gpu in ((aten._scaled_dot_product_flash_attention_for_cpu,
                      aten._scaled_dot_product_flash_attention),
                     (aten._scaled_dot_product_flash_attention_for_cpu_backward,
                      aten._scaled_dot_product_flash_attention_backward)):
        fc.register_flop_formula(cpu, get_raw=True)(fc.flop_registry[gpu])  # the GPU kernel's, as registered


def _named(snapshot: dict[Any, int]) -> dict[str, int]:
    """A tracker snapshot keyed by category name (the tracker keys by enum member)."""
    return {str(getattr(k, "value", k)): v for k, v in snapshot.items()}


@dataclass
class Peak:
    device: int = 0  # bytes rank 0's GPU held at its peak
    host: int = 0  # bytes of offloaded state (offload=cpu) at their peak
    snapshot: dict[str, int] = field(default_factory=dict)  # the tracker's categories at the GPU's peak


class _OffloadPeaks(TorchDispatchMode):
    """Under offload part of what the tracker counts lives in host memory, so the GPU's peak is the largest
    (total - offloaded) over the step, which need not fall where the total peaks: read after every
    operator."""

    def __init__(self, tracker: Any) -> None:
        super().__init__()
        self.tracker, self.peak = tracker, Peak()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local operators, which come back here one by one
        out = func(*args, **(kwargs or {}))
        for snapshot in self.tracker.get_tracker_snapshot().values():  # one device: the CPU
            named = _named(snapshot)
            host = sum(named.get(c, 0) for c in OFFLOADED)
            self.peak.host = max(self.peak.host, host)
            if named.get(TOTAL, 0) - host > self.peak.device:
                self.peak.device, self.peak.snapshot = named[TOTAL] - host, named
        return out


def _categories(snapshot: dict[str, int], offloaded: bool) -> dict[str, float]:
    """GiB per category of what the GPU held at its peak."""
    out: dict[str, float] = {}
    for name, nbytes in snapshot.items():
        if name in CATEGORIES and not (offloaded and name in OFFLOADED):
            out[CATEGORIES[name]] = out.get(CATEGORIES[name], 0.0) + nbytes / GIB
    return out


def _create_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """AdamW's state as a steady step finds it, from one step on zero gradients: cheaper than a whole
    training step, and the state is all that step would leave behind."""
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def counted_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """One training step under torch's FlopCounterMode: FLOPs per token of rank 0's batch, model (three
    forwards: a backward is two, recompute aside) and hardware (forward + backward, activation
    checkpointing's recompute included), and the seconds it took. It leaves AdamW's state behind, as a
    steady step finds it. Never under the memory tracker: the counter's hooks change what it sees."""
    from torch.utils.flop_counter import FlopCounterMode

    from trainer.parallel import backward_and_step
    _count_cpu_attention()
    started, counter = time.perf_counter(), FlopCounterMode(display=False)
    with counter:
        loss = model(**batch).loss
        forward = counter.get_total_flops()
        backward_and_step(loss, optimizer, None)
    tokens = batch["input_ids"].numel()
    return {"flops_per_token": 3 * forward / tokens, "hw_flops_per_token": counter.get_total_flops() / tokens,
            "count_s": time.perf_counter() - started}


def track_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
               offloaded: bool, scaler: Any = None) -> Peak:
    """One training step under FSDPMemTracker: this rank's peak on its GPU and of offloaded state. The
    optimizer must already hold its state (a steady step), real or fake tensors alike."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from trainer.parallel import backward_and_step
    tracker = FSDPMemTracker(mod=model, optm=optimizer)
    tracker.track_inputs(tuple(batch.values()))
    watch = _OffloadPeaks(tracker) if offloaded else contextlib.nullcontext()
    with tracker, watch:
        backward_and_step(model(**batch).loss, optimizer, scaler)
    if offloaded:
        return watch.peak
    (snapshot,) = (_named(s) for s in tracker.get_tracker_snapshot("peak").values())
    return Peak(device=snapshot[TOTAL], snapshot=snapshot)  # all on the GPU: the tracker's peak is its peak


def measure(spec: RunSpec, count_flops: bool | None = None) -> dict[str, Any]:
    """One steady training step of the spec on fake tensors: rank 0's peak per GPU and on the host (GiB).
    For a brought model (count_flops: any model) the step before it, which creates AdamW's state, runs
    under FlopCounterMode: FLOPs per token. A preset skips it (a cheap optimizer step creates the state;
    counting costs 30-40% of a measurement of Llama 2 7B-70B) and has the formula the tests check."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    from trainer.data import synthetic_batch
    from trainer.parallel import build_optimizer, parallelize
    arch, device, started = spec.arch, torch.device("cpu"), time.perf_counter()
    count = bool(spec.model_config) if count_flops is None else count_flops
    flops: dict[str, float] = {}
    dist.init_process_group("fake", rank=0, world_size=spec.world_size, store=FakeStore())
    try:
        model = parallelize(replace(spec, compile=False), arch, device).model
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device=device)
            model.train()
            optimizer = build_optimizer(model, lr=1e-4)
            batch = synthetic_batch(vocab=arch.vocab, micro_batch=spec.micro_batch, seq_len=spec.seq_len,
                                    seed=spec.seed, dp_rank=0, step=0, device=device,
                                    encoder_decoder=arch.family == "t5")
            if count:
                flops = counted_step(model, optimizer, batch)  # leaves AdamW's state behind
            else:
                _create_optimizer_state(model, optimizer)
            peak = track_step(model, optimizer, batch, offloaded=spec.offload == "cpu")
    finally:
        dist.destroy_process_group()
    return {"peak_gib": peak.device / GIB, "host_gib": peak.host / GIB,
            "categories": _categories(peak.snapshot, spec.offload == "cpu"), **flops,
            "compile_measured_eager": spec.compile, "seconds": time.perf_counter() - started,
            "torch": torch.__version__}


def main() -> int:
    """Each stdin line a RunSpec dict; each answer a `memory` record (or one with `error`), in order."""
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = RunSpec.from_dict(json.loads(line))
        try:
            result = measure(spec)
        except Exception as e:  # one configuration that cannot be measured never stops the others
            result = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
        print(format_record("memory", run_id=spec.run_id, **result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
