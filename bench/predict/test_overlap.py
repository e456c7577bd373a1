"""FSDP2's overlap unit by unit (bench/predict/overlap.py): timelines worked out by hand from the rules of its
docstring, and the properties a step model must keep."""
from __future__ import annotations

import pytest

from bench.predict.overlap import ALL_REDUCE, GATHER_BWD, GATHER_FWD, REDUCE, Unit, micro_batch


def test_a_timeline_worked_by_hand() -> None:
    """Four blocks (forward 1, backward 2, gathers 0.5, reduce-scatters 1, contention 0.2) and a root
    (forward 0.5, backward 1, gathers 2, reduce-scatter 4): forward, the root's and the first block's gathers
    exposed (2.5); backward, the root's gather again while the output layer waits (6.5 -> 8.5; the layer's
    forward ended at 7.0: 1.5 exposed), the blocks' gathers and reduce-scatters hidden but for the last
    block's reduce-scatter queue behind compute, and the root's reduce-scatter (4) and the wait for the last
    block's (1) after the compute ends: 5 exposed."""
    blocks = [Unit(1.0, 2.0, gather=0.5, regather=0.5, reduce=1.0, share=0.2) for _ in range(4)]
    root = Unit(0.5, 1.0, gather=2.0, regather=2.0, reduce=4.0)
    done = micro_batch(root, blocks)
    assert done.exposed == pytest.approx({GATHER_FWD: 2.5, GATHER_BWD: 1.5, REDUCE: 5.0, ALL_REDUCE: 0.0})
    assert done.total == pytest.approx(2 + 4 * 0.5 + 2 + 4 * 0.5 + 4 * 1 + 4)
    assert done.hidden == pytest.approx(done.total - 9.0)
    assert done.contention == pytest.approx(0.2 * 6.5)  # the blocks' collectives beside the compute


def test_collectives_longer_than_their_compute_show_by_the_difference_and_faster_ones_hide() -> None:
    """With gathers 1.5 beside a 1.0 forward, each later block waits 0.5; halve the gathers and only the
    first shows."""
    slow = micro_batch(Unit(0.0, 0.0), [Unit(1.0, 2.0, gather=1.5) for _ in range(8)])
    fast = micro_batch(Unit(0.0, 0.0), [Unit(1.0, 2.0, gather=0.75) for _ in range(8)])
    assert slow.exposed[GATHER_FWD] == pytest.approx(1.5 + 7 * 0.5)
    assert fast.exposed[GATHER_FWD] == pytest.approx(0.75)


def test_hybrid_shards_all_reduce_runs_beside_the_next_units_and_only_the_last_shows() -> None:
    """The all-reduce runs on its own queue: a block's (0.5) hides behind the next block's backward; the
    root's, after the last reduce-scatter, is the step's end."""
    blocks = [Unit(1.0, 2.0, reduce=0.5, all_reduce=0.5) for _ in range(4)]
    done = micro_batch(Unit(0.0, 0.0, reduce=0.5, all_reduce=1.0), blocks)
    assert done.exposed[ALL_REDUCE] == pytest.approx(1.0)
    assert done.exposed[REDUCE] == pytest.approx(0.5 + 0.5)  # the last block's and the root's


def test_no_collective_is_no_exposure_and_nothing_contends() -> None:
    done = micro_batch(Unit(0.3, 0.6), [Unit(1.0, 2.0, share=0.5) for _ in range(3)])
    assert done.exposed == dict.fromkeys((GATHER_FWD, GATHER_BWD, REDUCE, ALL_REDUCE), 0.0)
    assert done.total == done.hidden == done.contention == 0.0
