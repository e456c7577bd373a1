"""fp16 with FSDP2: the trainer's ShardedGradScaler unscales before the optimizer step and skips the step on
every rank when any rank's gradient shard holds an inf (2 real gloo ranks, fully_shard, fp16 compute)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = '''
import json, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from bench.core.records import exit_now

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)

def local(model):
    return [p.to_local().detach().clone() for p in model.parameters()]

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.linspace(-1, 1, 32).reshape(4, 8)
scaled, opt = build()
scaler = ShardedGradScaler(device="cpu", init_scale=1024.0)  # what trainer/parallel.py grad_scaler makes
steps = []
for step in range(2):
    before = local(scaled)
    scaler.scale(scaled(x).float().sum()).backward()
    if step == 0 and rank == 1:  # an inf in one rank's gradient shard only
        grad = next(p.grad.to_local() for p in scaled.parameters() if p.grad.to_local().numel())
        grad.view(-1)[0] = float("inf")
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    steps.append({"delta": [(a - b).tolist() for a, b in zip(local(scaled), before)],
                  "scale": scaler.get_scale()})
plain, opt = build()  # the same first update without a scaler
before = local(plain)
plain(x).float().sum().backward()
opt.step()
reference = [(a - b).tolist() for a, b in zip(local(plain), before)]
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:  # not stdout: ranks' lines interleave
    json.dump({"rank": rank, "steps": steps, "reference": reference}, f)
dist.destroy_process_group()
exit_now(0)  # as the workers end: gloo's threads can abort an interpreter teardown (SIGABRT)
'''


def _flat(deltas: list) -> list[float]:
    out: list[float] = []
    for d in deltas:
        out.extend(_flat(d) if isinstance(d, list) else [d])
    return out


def test_sharded_grad_scaler_unscales_and_skips_inf_steps_on_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the worker imports bench.core from this checkout
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", f"--log-dir={tmp_path / 'torchelastic'}", str(script),
                           str(tmp_path)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        skipped, applied = r["steps"]
        # both ranks
        assert all(v == 0 for v in _flat(skipped["delta"])), f"rank {r['rank']} stepped on an inf"
        assert skipped["scale"] == 512.0 and applied["scale"] == 512.0  # halved once, on the inf step only
        got, want = _flat(applied["delta"]), _flat(r["reference"])
        assert any(abs(w) > 1e-4 for w in want)
        # unscaled: the update is the plain step's (a scaled one would be 512x larger)
        assert all(abs(g - w) <= 1e-3 * max(1.0, abs(w)) for g, w in zip(got, want)), (got, want)
