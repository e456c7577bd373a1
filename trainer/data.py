"""Synthetic token batches: no data preparation, deterministic per (seed, data-parallel rank, step)."""
from __future__ import annotations

import torch


def synthetic_batch(*, vocab: int, micro_batch: int, seq_len: int, seed: int, dp_rank: int, step: int,
                    device: torch.device, encoder_decoder: bool) -> dict[str, torch.Tensor]:
    """One micro batch of uniform random tokens.

    The generator is seeded from (seed, rank, step), so a rank sees the same batch under every sharding
    strategy and on every re-run. Causal LMs get labels = input_ids (the model shifts them); T5 gets an
    independent target sequence of the same length.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(((seed * 1_000_003 + dp_rank) * 1_000_003 + step) % (2**63))
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=gen)
    labels = torch.randint(0, vocab, (micro_batch, seq_len), generator=gen) if encoder_decoder else ids
    return {"input_ids": ids.to(device, non_blocking=True), "labels": labels.to(device, non_blocking=True)}
