"""A model of PyTorch's CUDA caching allocator, replayed over a trace's allocation events.

The traced program runs on the meta device, so no real allocator sees it. Replaying its
allocation/free sequence through this model gives what ``torch.cuda.max_memory_reserved`` would
report. The rules follow ``c10/cuda/CUDACachingAllocator.cpp`` with default settings:

* every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
* requests up to 1 MiB (``kSmallSize``) come from the small pool, carved from 2 MiB segments;
* larger requests come from the large pool: below 10 MiB (``kMinLargeAlloc``) a new segment is
  20 MiB (``kLargeBuffer``), above it the request rounded up to 2 MiB (``kRoundLarge``);
* a request takes the smallest free block of its pool that fits (best fit), and the block is
  split when the remainder is at least 512 bytes (small pool) or more than 1 MiB (large pool);
* a freed block merges with free neighbours of its segment; segments are never returned
  (no ``empty_cache``), so reserved memory only grows.

Pure Python, no torch: it is tested against these rounding cases directly.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "LARGE_BUFFER",
    "MIN_BLOCK_SIZE",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "SMALL_BUFFER",
    "SMALL_SIZE",
    "AllocatorStats",
    "CachingAllocator",
    "replay",
    "round_size",
    "segment_size",
]

MIN_BLOCK_SIZE = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """Bytes a request of ``nbytes`` really takes (``round_size`` in the allocator)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def segment_size(rounded: int) -> int:
    """Size of the new segment (``cudaMalloc``) made for a rounded request no block fits."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class AllocatorStats:
    allocated_bytes: int = 0
    reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    n_segments: int = 0


@dataclass
class CachingAllocator:
    """Best-fit allocator over two pools; ``malloc`` returns a handle for ``free``."""

    stats: AllocatorStats = field(default_factory=AllocatorStats)

    def __post_init__(self) -> None:
        # Free blocks per pool, kept sorted by (size, segment, offset) for best fit.
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._by_key: dict[tuple[int, int, int], _Block] = {}
        self._seg_small: dict[int, bool] = {}

    # -- free-list helpers
    @staticmethod
    def _key(b: _Block) -> tuple[int, int, int]:
        return (b.size, b.segment, b.offset)

    def _insert_free(self, b: _Block) -> None:
        k = self._key(b)
        bisect.insort(self._free[self._seg_small[b.segment]], k)
        self._by_key[k] = b

    def _remove_free(self, b: _Block) -> None:
        k = self._key(b)
        lst = self._free[self._seg_small[b.segment]]
        i = bisect.bisect_left(lst, k)
        del lst[i]
        del self._by_key[k]

    # -- API
    def malloc(self, nbytes: int) -> _Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size, -1, -1))
        if i < len(lst):
            block = self._by_key[lst[i]]
            self._remove_free(block)
        else:
            seg = self.stats.n_segments
            self.stats.n_segments += 1
            self._seg_small[seg] = small
            block = _Block(segment=seg, offset=0, size=segment_size(size))
            self.stats.reserved_bytes += block.size
            self.stats.peak_reserved_bytes = max(
                self.stats.peak_reserved_bytes, self.stats.reserved_bytes
            )
        remaining = block.size - size
        if (small and remaining >= MIN_BLOCK_SIZE) or (not small and remaining > SMALL_SIZE):
            rest = _Block(block.segment, block.offset + size, remaining, True, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.free = False
        self.stats.allocated_bytes += block.size
        self.stats.peak_allocated_bytes = max(
            self.stats.peak_allocated_bytes, self.stats.allocated_bytes
        )
        return block

    def free(self, block: _Block) -> None:
        if block.free:
            raise ValueError("double free of an allocator block")
        self.stats.allocated_bytes -= block.size
        block.free = True
        for nb in (block.prev, block.next):
            if nb is not None and nb.free:
                self._remove_free(nb)
                if nb is block.prev:
                    nb.size += block.size
                    nb.next = block.next
                    if block.next is not None:
                        block.next.prev = nb
                    block = nb
                else:
                    block.size += nb.size
                    block.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = block
        self._insert_free(block)


def replay(events: Iterable[tuple[int, int, int]]) -> tuple[AllocatorStats, list[int], list[int]]:
    """Replay ``(op, handle, nbytes)`` events (op 1 = alloc, 0 = free) through the model.

    Returns the final stats and, per event, the allocated and reserved bytes after it, so a
    caller can find when each peak happened.
    """
    alloc = CachingAllocator()
    live: dict[int, _Block] = {}
    allocated: list[int] = []
    reserved: list[int] = []
    for op, handle, nbytes in events:
        if op:
            live[handle] = alloc.malloc(nbytes)
        else:
            blk = live.pop(handle, None)
            if blk is not None:
                alloc.free(blk)
        allocated.append(alloc.stats.allocated_bytes)
        reserved.append(alloc.stats.reserved_bytes)
    return alloc.stats, allocated, reserved
