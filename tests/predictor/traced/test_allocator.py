"""The caching-allocator model against the rounding and segment rules of CUDACachingAllocator."""

from __future__ import annotations

import pytest

from predictor.traced._allocator import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocator,
    replay,
    round_size,
    segment_size,
)

MIB = 1 << 20


@pytest.mark.parametrize(
    ("nbytes", "rounded"),
    [(1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024), (MIB + 1, MIB + 512)],
)
def test_requests_round_up_to_512_bytes(nbytes: int, rounded: int) -> None:
    assert round_size(nbytes) == rounded


@pytest.mark.parametrize(
    ("rounded", "segment"),
    [
        (512, SMALL_BUFFER),  # small pool: 2 MiB segments
        (MIB, SMALL_BUFFER),
        (MIB + 512, LARGE_BUFFER),  # 1-10 MiB: 20 MiB segments
        (10 * MIB - 512, LARGE_BUFFER),
        (10 * MIB, 10 * MIB),  # >= 10 MiB: rounded up to 2 MiB
        (11 * MIB, 12 * MIB),
    ],
)
def test_segment_sizes(rounded: int, segment: int) -> None:
    assert segment_size(rounded) == segment


def test_small_requests_share_one_segment_and_merge_back() -> None:
    a = CachingAllocator()
    x, y = a.malloc(1000), a.malloc(1000)
    assert a.stats.reserved_bytes == SMALL_BUFFER
    assert a.stats.allocated_bytes == 2048
    a.free(x)
    a.free(y)
    assert a.stats.allocated_bytes == 0
    # Merged back into one free 2 MiB block: a full-segment request reuses it.
    a.malloc(MIB)
    a.malloc(MIB)
    assert a.stats.n_segments == 1


def test_large_pool_best_fit_split_and_new_segment() -> None:
    a = CachingAllocator()
    blocks = [a.malloc(5 * MIB) for _ in range(4)]  # four fill one 20 MiB segment exactly
    assert a.stats.reserved_bytes == LARGE_BUFFER
    a.malloc(5 * MIB)
    assert a.stats.reserved_bytes == 2 * LARGE_BUFFER
    a.free(blocks[1])
    a.malloc(4 * MIB)  # best fit: the freed 5 MiB hole, split (remainder 1 MiB is not > 1 MiB)
    assert a.stats.reserved_bytes == 2 * LARGE_BUFFER
    assert a.stats.peak_allocated_bytes == 25 * MIB


def test_small_and_large_pools_never_mix() -> None:
    a = CachingAllocator()
    big = a.malloc(5 * MIB)
    a.free(big)
    a.malloc(1000)  # a small request does not carve the free 20 MiB large segment
    assert a.stats.reserved_bytes == LARGE_BUFFER + SMALL_BUFFER


def test_replay_reports_peaks_and_ignores_unknown_frees() -> None:
    stats, allocated, reserved = replay([(1, 0, 3 * MIB), (1, 1, 100), (0, 0, 0), (0, 9, 0)])
    assert stats.peak_allocated_bytes == 3 * MIB + 512
    assert allocated[-1] == 512
    assert reserved[-1] == LARGE_BUFFER + SMALL_BUFFER
