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
  its log-sum-exp saved, no T x T matrix), except where CUDA picks another attention kernel (gpu_attention).
  What the caching allocator adds (cuBLAS's workspaces, CUDA context, NCCL buffers, fragmentation) is
  the planner's (bench/predict/memory.py);
- compile=true is measured eager: fake tensors are not compiled;
- fp16_mixed runs without its loss scaler: unscaling works in place on the gradients, and the decision to
  skip a step reads a value, which a fake tensor does not have;
- AdamW's state is created before the tracked step, so the tracked step is a steady one: the window the
  worker's own peak counters cover. For a brought model that is a whole step counted by torch's
  FlopCounterMode (FLOPs per token, recompute included); counting the tracked step would change what the
  tracker sees.

A deep model of identical blocks is measured at two shallow depths, and each place's peak is carried
on a straight line to the model's own depth (trainer/depth.py).
"""
from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from bench.core.warm import run_warm

if __name__ == "__main__":
    run_warm("trainer.memory")  # in a warm process, where its environment names one (bench/core/warm.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from bench.core.models import ModelArch  # noqa: E402
from bench.core.records import error_line, format_record  # noqa: E402
from bench.core.schema import RunSpec  # noqa: E402
from trainer.census import count_cpu_attention, ensure  # noqa: E402
from trainer.depth import Peak, at_depth, extrapolate, highest, on_line, pattern, places, shallow_depths  # noqa: E402
from trainer.model import CAUSAL_SDPA, attention_impl  # noqa: E402

GIB = 2**30
TOTAL = "Total"
# FSDPMemTracker's categories as the plan and report name them.
CATEGORIES = {"Sharded Param": "params", "Unsharded Param": "params", "Buffer": "params",
              "Sharded Grad": "grads", "Unsharded Grad": "grads", "OptState": "optimizer",
              "Activation": "activations", "Temp": "temporaries", "All Gather": "temporaries",
              "Reduce Scatter": "temporaries", "Inputs": "temporaries"}
# What CPUOffloadPolicy keeps in host memory: the sharded parameters, their gradients, AdamW's state.
OFFLOADED = ("Sharded Param", "Sharded Grad", "OptState")


def _name(key: Any) -> str:
    """A tracker snapshot's key as its category's name (the tracker keys by enum member, and "Total")."""
    return str(getattr(key, "value", key))


def _named(snapshot: dict[Any, int]) -> dict[str, int]:
    """A tracker snapshot keyed by category name."""
    return {_name(k): v for k, v in snapshot.items()}


class _PlacePeaks(TorchDispatchMode):
    """Rank 0's peak at each place of the step (pass and position: before the pass's first block, in a
    block as places() names it, the optimizer step), read from the tracker's current figures after every
    operator (the moments the tracker's own peak is taken at). Under offload part of what the tracker counts
    lives in host memory, so the GPU's peak is the largest (total - offloaded), which need not fall where
    the total peaks."""

    def __init__(self, tracker: Any, offloaded: bool, period: int) -> None:
        super().__init__()
        self.tracker, self.offloaded, self.period = tracker, offloaded, period
        self.peaks: dict[str, Peak] = {}
        self.enter("forward")

    def enter(self, stage: str) -> None:
        self.stage, self.at = stage, (f"{stage} before",)

    def in_block(self, stack: str, index: int, depth: int) -> None:
        """Block `index` of a stack (T5: the encoder's or the decoder's) of `depth` blocks runs."""
        self.at = tuple(f"{self.stage} {stack} {p}" for p in places(index, depth, self.period))

    def _current(self) -> Any:
        """The tracker's current figures per device, read in place: get_tracker_snapshot() deep-copies
        them, after every operator a sixth of a measurement's time."""
        current = getattr(self.tracker, "_curr_mem_snap", None)
        return (self.tracker.get_tracker_snapshot() if current is None else current).values()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local operators, which come back here one by one
        out = func(*args, **(kwargs or {}))
        for snapshot in self._current():  # one device: the CPU
            host = sum(v for k, v in snapshot.items() if _name(k) in OFFLOADED) if self.offloaded else 0
            device = snapshot.get(TOTAL, 0) - host
            for place in self.at:
                peak = self.peaks.setdefault(place, Peak())
                peak.host = max(peak.host, host)
                if device > peak.device:
                    peak.device, peak.snapshot = device, _named(snapshot)  # a copy, which the peak keeps
        return out


def _follow_blocks(model: torch.nn.Module, watch: _PlacePeaks) -> list[Any]:
    """Tell `watch` which block runs: as its forward starts (a recompute too) and as its backward starts
    (the gradient of its output hidden states is ready). Returns the hooks' handles."""
    from torch.utils._pytree import tree_flatten

    from trainer.model import transformer_blocks
    handles: list[Any] = []

    def on_output(block: tuple[str, int, int]) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            hidden = tree_flatten(output)[0][0]  # not T5's position bias, which every block passes on
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                handles.append(hidden.register_hook(lambda grad: watch.in_block(*block)))
        return hook

    for parent, stack, i in transformer_blocks(model):
        block = (stack, i, len(parent))
        handles.append(parent[i].register_forward_pre_hook(lambda *_, b=block: watch.in_block(*b),
                                                           prepend=True))
        handles.append(parent[i].register_forward_hook(on_output(block)))
    return handles


def _categories(snapshot: dict[str, int], offloaded: bool) -> dict[str, float]:
    """GiB per category of what the GPU held at its peak."""
    out: dict[str, float] = {}
    for name, nbytes in snapshot.items():
        if name in CATEGORIES and not (offloaded and name in OFFLOADED):
            out[CATEGORIES[name]] = out.get(CATEGORIES[name], 0.0) + nbytes / GIB
    return out


def _create_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """AdamW's state as a steady step finds it, created by AdamW's own lazy initialization (`_init_group`,
    which a step calls first) without the update's arithmetic: on fake tensors that arithmetic is a fifth
    of a measurement, and the state is all a step would leave behind. An optimizer without it steps once
    on zero gradients."""
    _create_reduced_gradients(model)
    init = getattr(optimizer, "_init_group", None)
    try:
        for group in optimizer.param_groups:
            init(group, [], [], [], [], [], [])  # type: ignore[misc]
    except TypeError:  # not Adam's signature (or none): the step itself
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
    count_cpu_attention()
    started, counter = time.perf_counter(), FlopCounterMode(display=False)
    with counter:
        loss = model(**batch).loss
        forward = counter.get_total_flops()
        backward_and_step(loss, optimizer, None)
    tokens = batch["input_ids"].numel()
    return {"flops_per_token": 3 * forward / tokens, "hw_flops_per_token": counter.get_total_flops() / tokens,
            "count_s": time.perf_counter() - started}


def _shard_tracker() -> type:
    """FSDPMemTracker counting only the ops that run on shards. DTensor works out an op's output metadata by
    running the op on fake tensors (ShardingPropagator._propagate_tensor_meta_non_cached): never memory on
    the GPU. torch 2.13's tracker does not see those; 2.11's counts them, and at AdamW's foreach step they
    are four lists the size of the parameters: Llama 3.2 1B at micro batch 2 measured 36.8 GiB on torch
    2.11 where an H200 allocated 23.1 (benchmarks/evidence/NVIDIA-H200_*); 2.13 measures 23.0. Here the
    tracker looks away while DTensor propagates, so every torch version measures what 2.13 does."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY as TRACKER_TOTAL
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    propagate = ShardingPropagator._propagate_tensor_meta_non_cached

    class ShardTracker(FSDPMemTracker):
        _propagating = 0

        def __enter__(self) -> ShardTracker:
            tracker = self

            def quietly(prop: ShardingPropagator, *args: Any, **kwargs: Any) -> Any:
                tracker._propagating += 1
                try:
                    return propagate(prop, *args, **kwargs)
                finally:
                    tracker._propagating -= 1

            ShardingPropagator._propagate_tensor_meta_non_cached = quietly
            super().__enter__()
            return self

        def __exit__(self, *args: Any) -> None:
            ShardingPropagator._propagate_tensor_meta_non_cached = propagate
            super().__exit__(*args)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if self._propagating and not any(t is DTensor for t in types):
                return func(*args, **(kwargs or {}))  # metadata for DTensor, not memory
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            """The step's peak per device, after every operator; not each module's (the tracker's own walk
            over every module it tracks, at every operator: a fifth of a measurement), which nothing here
            reads (_PlacePeaks keeps each place's peak). A torch whose tracker keeps other fields does it
            whole."""
            peak, snap = getattr(self, "_peak_mem", None), getattr(self, "_peak_mem_snap", None)
            if peak is None or snap is None:
                return super()._update_peak_stats(peak_state)
            for dev, current in self._curr_mem_snap.items():
                if peak.get(dev, 0) < current[TRACKER_TOTAL]:
                    peak[dev] = current[TRACKER_TOTAL]
                    snap[dev] = copy.deepcopy(current)

    return ShardTracker


def track_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               batches: list[dict[str, torch.Tensor]], offloaded: bool, scaler: Any = None, period: int = 1,
               accumulation: str = "sync_each", held: list[dict[str, torch.Tensor]] | None = None
               ) -> dict[str, Peak]:
    """One training step of one or more micro-batches (accumulated as the spec's mode says) under
    FSDPMemTracker: this rank's peak on its GPU and of offloaded state at each place of the step (highest()
    gives the step's; a place's peak is the higher of its micro-batches'). The optimizer must already hold
    its state (a steady step), real or fake tensors alike. `held`: micro-batches whose inputs the step holds
    without stepping them (settles_in_one)."""
    from trainer.parallel import accumulate, backward, optimizer_step
    tracker = _shard_tracker()(mod=model, optm=optimizer)
    tracker.track_inputs(tuple(t for batch in (held or []) + batches for t in batch.values()))
    watch = _PlacePeaks(tracker, offloaded, period)
    handles = _follow_blocks(model, watch)
    try:
        with tracker, watch:
            for k, batch in enumerate(batches):
                accumulate(model, accumulation, last=k == len(batches) - 1)
                tracker.reset_mod_stats()  # per-module statistics, which refuse a module's second call
                watch.enter("forward")
                loss = model(**batch).loss
                watch.enter("backward")
                backward(loss / len(batches), scaler)
                del loss  # not held into the next micro-batch
            watch.enter("step")
            optimizer_step(optimizer, scaler)
    finally:
        for handle in handles:
            handle.remove()
    return watch.peaks


def micro_batches(spec: RunSpec) -> int:
    """Micro-batches a measured step runs: two where the run accumulates (the second finds what the first
    left: unsharded gradients under sync_once, gathered parameters under keep_gathered; every later one
    finds the same), else one."""
    return min(spec.grad_accum, 2)


def settles_in_one(spec: RunSpec) -> bool:
    """Whether one micro-batch stands for an accumulating step's two: under sync_each all the first leaves
    the second is its reduced, sharded gradients, so the second, which peaks highest, is stepped alone on
    gradients created beforehand, the first's inputs still held: the same peak at every place, to the byte
    (trainer/test_memory.py), at half the cost."""
    return spec.accumulation == "sync_each" and micro_batches(spec) > 1


def _create_reduced_gradients(model: torch.nn.Module) -> None:
    """What a sync_each micro-batch leaves the next: each parameter's gradient, sharded as the parameter."""
    for param in model.parameters():
        param.grad = torch.zeros_like(param)


def gpu_attention(spec: RunSpec, arch: ModelArch, cuda: bool) -> contextlib.AbstractContextManager:
    """The SDPA kernel a run on a CUDA GPU (cuda) takes, where the CPU's differs. fp32 attention over
    grouped KV heads without a mask: CUDA's flash kernel takes no fp32 and its memory-efficient one no
    grouped heads, so SDPA falls back to its math path, which saves each block's T x T probabilities for
    the backward (the CPU's flash kernel takes fp32 and saves none). Measured on an H200
    (benchmarks/evidence/, torch 2.11): Llama 3.2 1B fp32 at seq 2048, micro batch 2, without AC held
    17.2 GiB more than the flash path predicts; the math path predicts it to 0.01%."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    grouped = arch.kv_heads < arch.heads
    if cuda and spec.precision == "fp32" and grouped and attention_impl(arch, spec.seq_len) == CAUSAL_SDPA:
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


@contextlib.contextmanager
def fake_rank(world_size: int) -> Iterator[None]:
    """Rank 0 of a fake process group of world_size: FSDP2 shards as across that many ranks, and every
    collective returns at once."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def step_at(spec: RunSpec, arch: ModelArch, count: bool, cuda: bool = False,
            shortcut: bool = True) -> tuple[dict[str, Peak], dict[str, float]]:
    """Each place's peak of one steady training step of the spec with the model `arch` on fake tensors, and
    (count) the FLOPs per token of the step before it, which creates AdamW's state. `shortcut`: a step that
    settles_in_one steps one micro-batch (False: every micro-batch, the check of it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainer.data import rank_batches
    from trainer.parallel import build_optimizer, parallelize
    device, flops = torch.device("cpu"), {}
    with fake_rank(spec.world_size):
        model = parallelize(replace(spec, compile=False), arch, device).model
        with FakeTensorMode(allow_non_fake_inputs=True), gpu_attention(spec, arch, cuda):
            model.to_empty(device=device)
            model.train()
            optimizer = build_optimizer(model, lr=1e-4)
            batches = rank_batches(spec, arch, rank=0, step=0, device=device, count=micro_batches(spec))
            if count:
                flops = counted_step(model, optimizer, batches[0])  # leaves AdamW's state behind
            else:
                _create_optimizer_state(model, optimizer)
            held: list[dict[str, torch.Tensor]] = []
            if shortcut and settles_in_one(spec):
                _create_reduced_gradients(model)
                held, batches = batches[:-1], batches[-1:]
            return track_step(model, optimizer, batches, offloaded=spec.offload == "cpu",
                              period=pattern(spec), accumulation=spec.accumulation, held=held), flops


def measure(spec: RunSpec, count_flops: bool | None = None, whole: bool = False,
            cuda: bool = False) -> dict[str, Any]:
    """One steady training step of the spec on fake tensors: rank 0's peak per GPU and on the host (GiB),
    from two shallow models where the blocks allow (whole: the model as it is). For a brought model
    (count_flops: any model) the step before it, which creates AdamW's state, runs under FlopCounterMode:
    FLOPs per token. A preset skips it (a cheap optimizer step creates the state) and has the formula the
    tests check."""
    started, count = time.perf_counter(), bool(spec.model_config) if count_flops is None else count_flops
    depths = None if whole else shallow_depths(spec)
    if depths is None:
        peaks, flops = step_at(spec, spec.arch, count, cuda)
    else:
        (a, flops_a), (b, flops) = (step_at(spec, at_depth(spec.arch, d), count, cuda) for d in depths)
        peaks = extrapolate((a, b), depths, spec.arch.layers)
        flops = {k: flops_a[k] + v if k == "count_s" else on_line(flops_a[k], v, depths, spec.arch.layers)
                 for k, v in flops.items()}
    peak = highest(peaks)
    return {"peak_gib": peak.device / GIB, "host_gib": peak.host / GIB,
            "categories": _categories(peak.snapshot, spec.offload == "cpu"), **flops,
            "blocks_measured": list(depths or [spec.arch.blocks]), "compile_measured_eager": spec.compile,
            "seconds": time.perf_counter() - started, "torch": torch.__version__}


def main(argv: list[str]) -> int:
    """Each stdin line a RunSpec dict; each answer a `memory` record (or one with `error`), in order.
    --whole steps every model whole (the check of the shallow measurement); --cuda measures the runs as a
    CUDA GPU runs them (gpu_attention), the planner's choice where its cluster names a GPU."""
    if set(argv) - {"--whole", "--cuda"}:
        print("usage: python -m trainer.memory [--whole] [--cuda] < specs.jsonl", file=sys.stderr)
        return 2
    whole, cuda = "--whole" in argv, "--cuda" in argv
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = RunSpec.from_dict(json.loads(line))
        try:
            ensure(spec.model_config)  # a brought family with no formula: counted from the model itself
            result = measure(spec, whole=whole, cuda=cuda)
        except Exception as e:  # one configuration that cannot be measured never stops the others
            result = {"error": error_line(e)}
        print(format_record("memory", run_id=spec.run_id, **result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
