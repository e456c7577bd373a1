"""One training run in an initialised process group: the Trainer builds the model (trainer/parallel.py),
trains its steps (the timed window: one optimizer step and the device sync that ends it), records the
traced steps after them (trainer/trace_record.py) and summarises the run; the test faults' hooks sit here too.
The process around it (arguments, process group, statuses, exit codes) is trainer/main.py's.
"""
from __future__ import annotations

import math
import os
import platform
import resource
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.core.flops import hardware_flops_per_token, model_flops_per_token
from bench.core.hardware import peak_tflops
from bench.core.records import Emitter, node_name, trace_path
from trainer.clock import ComputeClock, steady_compute_s, timed_modules
from trainer.config import TrainArgs
from trainer.flight import collectives_between
from trainer.metrics import summarize_steps

GIB = 2**30


class NanLoss(RuntimeError):
    """A loss that is not finite: the run ends nan_loss."""


def offload_threads() -> int:
    """Host threads of one rank whose optimizer runs on the CPU (offload=cpu): the cores this process may
    use, shared evenly among the node's ranks."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_stats(device: torch.device) -> dict[str, float]:
    """This process's memory now, in GiB: its host RSS peak and, on a GPU, the allocator's figures."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    if device.type != "cuda":
        return {"mem_rss_gib": rss}
    return {"mem_alloc_gib": torch.cuda.memory_allocated(device) / GIB,
            "mem_peak_alloc_gib": torch.cuda.max_memory_allocated(device) / GIB,
            "mem_peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
            "mem_rss_gib": rss}


def _versions(device: torch.device) -> dict[str, Any]:
    import transformers
    info: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                            "python": platform.python_version(), "host": socket.gethostname(),
                            # torchrun's elastic restarts of this worker (0 unless --max-restarts allows some)
                            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    if device.type == "cuda":
        info["cuda"] = torch.version.cuda
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["device_name"] = torch.cuda.get_device_name(device)
    else:
        info["device_name"] = "cpu"
    return info


class Trainer:
    """Holds the pieces of one run: setup, train, trace and summary, which trainer/main.py train_run calls
    in that order."""

    def __init__(self, args: TrainArgs, device: torch.device, emit: Emitter) -> None:
        self.args, self.spec, self.device, self.emit = args, args.spec, device, emit
        self.rank = dist.get_rank()
        self.arch = self.spec.arch
        self.losses: list[float] = []
        self.step_times: list[float] = []
        self.last_step_ns = (0, 0)  # the last step's window in wall-clock time: its collectives are counted
        self.end_memory: dict[str, float] | None = None  # at the last timed step, before any traced one
        self.restore: list[Callable[[], None]] = []  # undoes the test faults' patches (a series' next run)
        self.meter: Any = None  # the NVML sampler whose energy counter train() reads around the timed steps

    def setup(self) -> None:
        from trainer.model import materialize
        from trainer.parallel import build_optimizer, grad_scaler, parallelize
        spec = self.spec
        self.built = parallelize(spec, self.arch, self.device, self.args.attn_impl)
        self.model = self.built.model
        materialize(self.model, self.device, spec.seed,
                    param_device=torch.device("cpu") if spec.offload == "cpu" else None)
        if spec.offload == "cpu" and self.device.type == "cuda":  # the optimizer steps on the host: its
            torch.set_num_threads(offload_threads())  # share of the node's cores, not OMP_NUM_THREADS=1
        self.model.train()
        self.optimizer = build_optimizer(self.model, self.args.lr)
        self.scaler = grad_scaler(spec.precision, self.device)
        # each rank's compute without its waits, where there are peers to wait for (a straggler's mark)
        several = dist.get_world_size() > 1
        self.clock = ComputeClock(timed_modules(self.model), self.device) if several else None
        self._install_slow_faults()

    def _install_slow_faults(self) -> None:
        """Test hooks that slow every step from outside the model: slow_collective sleeps before each
        collective of one kind FSDP2 issues (torch.distributed's functions, which FSDP2 looks up per
        call); slow_compute makes this rank compute longer in each block's forward (matmuls, after
        FSDP's pre-forward)."""
        a = self.args
        if a.fault not in ("slow_collective", "slow_compute") or a.fault_rank not in (-1, self.rank):
            return
        if a.fault == "slow_compute":
            from trainer.model import transformer_blocks
            for parent, _, i in transformer_blocks(self.model):
                parent[i].register_forward_pre_hook(lambda *_: _busy(a.fault_seconds))
            return
        name = {"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single",
                "all_reduce": "all_reduce"}[a.fault_collective]
        original = getattr(dist, name)

        def delayed(*args: Any, **kwargs: Any) -> Any:
            time.sleep(a.fault_seconds)
            return original(*args, **kwargs)
        setattr(dist, name, delayed)
        self.restore.append(lambda: setattr(dist, name, original))

    def meta(self) -> dict[str, Any]:
        local_numel = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                          for p in self.model.parameters())
        mesh = self.built.mesh
        return {"spec": self.spec.to_dict(), "world_size": dist.get_world_size(),
                "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
                "group_rank": int(os.environ.get("GROUP_RANK", 0)), "device": str(self.device),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "mesh_shape": list(mesh.shape), "mesh_dim_names": list(mesh.dim_names),
                "shard_group": mesh.shard_group, "replicate_group": mesh.replicate_group,
                "reshard_after_forward": mesh.reshard_after_forward,
                "local_param_numel": local_numel, "grad_accum": self.spec.grad_accum,
                "checkpointed_blocks": self.built.checkpointed_blocks,
                "float8_linears": self.built.float8_linears, "compiled_blocks": self.built.compiled_blocks,
                "param_device": str(next(self.model.parameters()).device), "backend": dist.get_backend(),
                "offload_policy": _offload_policy(self.model), "cpu_threads": torch.get_num_threads(),
                **_versions(self.device)}

    def batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of a step: its contiguous share of the step's global batch, in order
        (the same sequences however the global batch is split into ranks and micro-batches)."""
        from trainer.data import rank_batches
        return rank_batches(self.spec, self.arch, self.rank, step, self.device)

    def step(self, micro_batches: list[dict[str, torch.Tensor]], step: int) -> torch.Tensor:
        """One optimizer step, and only that: the timed window. Each micro-batch's loss counts 1/n of the
        step's (the mean over the global batch however it is split), its gradients synced as the spec's
        accumulation mode says. Returns this rank's mean loss, detached (no collective and no host sync
        beyond the step's own)."""
        from trainer.parallel import accumulate, backward, optimizer_step
        n, losses = len(micro_batches), []
        for k, batch in enumerate(micro_batches):
            accumulate(self.model, self.spec.accumulation, last=k == n - 1)
            loss = self.model(**batch).loss
            if self.args.fault == "nan" and step == self.args.fault_step:
                loss = loss * float("nan")
            if k == 0:
                self._fault(step, "hang")  # inside the step: the other ranks wait in the backward
            backward(loss / n, self.scaler)
            losses.append(loss.detach())
        optimizer_step(self.optimizer, self.scaler)
        return torch.stack(losses).mean()

    def _fault(self, step: int, kind: str) -> None:
        if self.args.fault != kind or step != self.args.fault_step:
            return
        if self.args.fault_rank not in (-1, self.rank):
            return
        if kind == "oom":
            raise torch.OutOfMemoryError(f"injected out of memory at step {step} (test fault)")
        if kind == "hang":
            time.sleep(10**6)
        if kind == "crash":
            raise RuntimeError(f"injected crash at step {step} (test fault)")

    def train(self) -> None:
        """The batch is built and the fault hooks run outside the clock (but hang, which never ends); the
        window holds the step and the device sync that ends it. Losses stay on the device and are averaged
        over ranks once at the end (one all-reduce, for loss parity and NaN detection): a NaN run costs at
        most the rest of a short benchmark run, and no step pays a collective or a host sync for
        bookkeeping. Peak memory counters restart with the steady state, so they describe the timed steps."""
        local_losses = []
        for step in range(self.spec.steps):
            if step == self.spec.warmup_steps and self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            batches = self.batches(step)
            self._fault(step, "oom")
            _sync(self.device)
            if step == self.spec.warmup_steps and self.meter is not None:
                self.meter.mark()  # the GPU's energy counter as the timed steps begin
            if self.clock:
                self.clock.step()
            t0, t0_ns = time.perf_counter(), time.time_ns()
            loss = self.step(batches, step)
            _sync(self.device)
            elapsed, self.last_step_ns = time.perf_counter() - t0, (t0_ns, time.time_ns())
            self._fault(step, "crash")
            self.step_times.append(elapsed)
            local_losses.append(loss)
            if self.rank == 0 and self.args.instrument:  # after the clock; the device is already synced
                self.emit("step", step=step, time_s=elapsed, warmup=step < self.spec.warmup_steps,
                          tokens=self.tokens_per_step, samples=self.spec.sequences_per_step,
                          loss_rank0=loss.item(), **memory_stats(self.device))
        if self.meter is not None:
            self.meter.mark()  # ... and after the last one's sync: its joules are the timed steps'
        self.end_memory = memory_stats(self.device)
        self.losses = self.mean_losses(local_losses)
        bad = [i for i, v in enumerate(self.losses) if not math.isfinite(v)]
        if bad:
            raise NanLoss(f"loss is {self.losses[bad[0]]} at step {bad[0]}")

    def trace(self) -> None:
        """`trace_steps` more steps after the timed ones, recorded with torch.profiler on the ranks
        `trace_ranks` names (trainer/trace_record.py), and one `trace` record per recording rank: the file,
        its size, what recording and splitting cost, and the step split (or why there is none)."""
        from trainer import trace_record, trace_split, trace_waits
        args = self.args
        if args.trace_steps <= 0:
            return
        local = int(os.environ.get("LOCAL_RANK", "0"))
        recording = args.trace_ranks == "all" or local == 0
        path = None
        if recording:
            # no shared run dir (Kubernetes): the pod's own /tmp, the split still in the trace record
            where = args.run_dir or Path(tempfile.mkdtemp(prefix="fsdpbench-trace-"))
            path = trace_path(where, self.rank)

        def run_step(step: int) -> None:
            batches = self.batches(step)
            _sync(self.device)
            self.step(batches, step)
            _sync(self.device)
        began = time.monotonic()
        first = self.spec.steps
        times, unwritten = trace_record.record(run_step, range(first, first + args.trace_steps), path,
                                               self.device.type == "cuda",
                                               {"rank": self.rank, "run_id": self.spec.run_id})
        recorded = time.monotonic()

        def exchange(mine: Any) -> list[Any]:
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
            return everyone
        mesh = self.built.mesh  # each collective's waits are read across its own process group
        result, error = trace_split.analyse(None if unwritten else path, exchange, self.rank,
                                            trace_waits.fsdp_groups(mesh.shard_group, mesh.replicate_group))
        error = unwritten or error
        if recording:
            size = path.stat().st_size if path is not None and path.exists() else None
            if path is not None and args.run_dir is None:  # nowhere to keep it: the split is in the record
                shutil.rmtree(path.parent.parent, ignore_errors=True)
            self.emit("trace", node=node_name(), file=str(path), bytes=size, steps=args.trace_steps,
                      step_times_s=times, record_s=recorded - began, analyse_s=time.monotonic() - recorded,
                      split=result, error=error)

    def mean_losses(self, local_losses: list[torch.Tensor]) -> list[float]:
        """Every step's loss averaged over ranks, in one all-reduce (SUM: gloo has no AVG)."""
        stacked = torch.stack(local_losses).float()
        dist.all_reduce(stacked)
        return (stacked / dist.get_world_size()).tolist()

    @property
    def tokens_per_step(self) -> int:
        return self.spec.sequences_per_step * self.spec.seq_len

    def summary(self, nvml: dict[str, Any]) -> dict[str, Any]:
        spec = self.spec
        device_name = _versions(self.device)["device_name"]
        stats = summarize_steps(
            self.step_times, warmup_steps=spec.warmup_steps, tokens_per_step=self.tokens_per_step,
            samples_per_step=spec.sequences_per_step, world_size=spec.world_size,
            model_flops_per_token=model_flops_per_token(self.arch, spec.seq_len),
            hw_flops_per_token=hardware_flops_per_token(self.arch, spec.seq_len,
                                                        spec.activation_checkpointing),
            peak_tflops=peak_tflops(device_name, spec.precision) if self.device.type == "cuda" else None)
        if spec.compile:  # what the warm-up took beyond steady steps: compilation, outside the window
            warm = self.step_times[:spec.warmup_steps]
            stats["compile_s"] = sum(warm) - len(warm) * stats["step_time_s"]
        if self.device.type == "cuda" and stats.get("mfu") is None:
            stats["mfu_note"] = (f"no peak TFLOPS known for {device_name!r}: MFU not computed "
                                 "(add the GPU to bench/core/hardware.py with its datasheet)")
        per_rank: list[dict[str, Any]] = [{}] * dist.get_world_size()
        compute = steady_compute_s(self.clock.per_step_s(), spec.warmup_steps) if self.clock else None
        memory = self.end_memory or memory_stats(self.device)
        dist.all_gather_object(per_rank, {**memory, **nvml, "rank": self.rank, "node": node_name(),
                                          "compute_s": compute})
        out: dict[str, Any] = {"status": "ok", **stats, "world_size": dist.get_world_size(),
                               "backend": dist.get_backend(),
                               "loss_first": self.losses[0], "loss_last": self.losses[-1],
                               "losses": self.losses, "step_times_s": self.step_times,
                               "device_name": device_name, "torch_version": torch.__version__,
                               "host": socket.gethostname(), "per_rank": per_rank}
        if self.rank == 0:  # the one summary: what the recorder saw in the last step
            out["collectives_per_step"] = collectives_between(*self.last_step_ns)
        for key in ("mem_peak_alloc_gib", "mem_peak_reserved_gib", "mem_rss_gib", "nvml_mem_used_gib"):
            values = [r[key] for r in per_rank if r.get(key) is not None]
            out[key] = max(values) if values else None
        for key in ("nvml_util_pct", "nvml_power_w"):
            values = [r[key] for r in per_rank if r.get(key) is not None]
            out[key] = sum(values) / len(values) if values else None
        from trainer.nvml import run_energy  # the GPUs' joules per token over the timed steps
        out.update(run_energy(per_rank, self.tokens_per_step * stats["steps_timed"]))
        return out


def _busy(seconds: float) -> None:
    """Compute for `seconds` (small matmuls): a slower rank's extra compute, as the profiler sees compute."""
    a, end = torch.ones(256, 256), time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.mm(a, a).clamp_(-1, 1)


def _offload_policy(model: torch.nn.Module) -> str | None:
    """The offload policy FSDP2 really applied to the root's parameters (its param group's, a private
    attribute: None if a torch version moves it), so a run can be checked against what it built."""
    group = getattr(getattr(model, "_get_fsdp_state", lambda: None)(), "_fsdp_param_group", None)
    policy = getattr(group, "offload_policy", None)
    return type(policy).__name__ if policy is not None else None
