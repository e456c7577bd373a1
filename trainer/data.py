"""Synthetic token batches: no data preparation, deterministic per (seed, step, sequence of the global
batch)."""
from __future__ import annotations

import torch

from bench.core.models import ModelArch
from bench.core.schema import RunSpec


def synthetic_batch(*, vocab: int, micro_batch: int, seq_len: int, seed: int, first: int, step: int,
                    device: torch.device, encoder_decoder: bool) -> dict[str, torch.Tensor]:
    """Sequences first .. first + micro_batch - 1 of a step's global batch, uniform random tokens.

    Each sequence has its own generator, seeded from (seed, step, its index in the global batch), so a
    global batch holds the same sequences however it is split into ranks and micro-batches (the losses of
    4 x 1, 2 x 2 and 1 x 4 agree), under every sharding strategy and on every re-run. Causal LMs get
    labels = input_ids (the model shifts them); T5 gets an independent target sequence of the same length.
    """
    gen = torch.Generator(device="cpu")
    ids, labels = [], []
    for index in range(first, first + micro_batch):
        gen.manual_seed(((seed * 1_000_003 + step) * 1_000_003 + index) % (2**63))
        ids.append(torch.randint(0, vocab, (seq_len,), generator=gen))
        labels.append(torch.randint(0, vocab, (seq_len,), generator=gen) if encoder_decoder else ids[-1])
    return {"input_ids": torch.stack(ids).to(device, non_blocking=True),
            "labels": torch.stack(labels).to(device, non_blocking=True)}


def rank_batches(spec: RunSpec, arch: ModelArch, rank: int, step: int, device: torch.device,
                 count: int | None = None) -> list[dict[str, torch.Tensor]]:
    """A rank's micro-batches of one step, in order: its contiguous share of the step's global batch
    (micro batch x accumulation steps sequences from rank x that share), the first `count` of them
    (default: all of them)."""
    share = spec.micro_batch * spec.grad_accum
    return [synthetic_batch(vocab=arch.vocab, micro_batch=spec.micro_batch, seq_len=spec.seq_len,
                            seed=spec.seed, first=rank * share + k * spec.micro_batch, step=step,
                            device=device, encoder_decoder=arch.family == "t5")
            for k in range(spec.grad_accum if count is None else count)]
