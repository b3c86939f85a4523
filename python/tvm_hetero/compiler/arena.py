"""Offset planning: place every kernel entry of one device at a byte offset of one arena.

Problem: each item has a size and a closed live interval ``[start, end]`` (see memory.py); give
every item an offset such that two items whose intervals overlap have disjoint byte ranges
``[offset, offset + size)``, minimising the arena size ``max(offset + size)``. This is dynamic
storage allocation, NP-hard in general; its lower bound is the peak of bytes live at once.

Algorithm: a portfolio, keeping the smallest arena.
- Greedy placement in several orders: by size (largest first; TFLite's "greedy by size"), by
  breadth (items of the most crowded moment of their interval first), and by start time. Each item
  goes into the gap between already placed, time-overlapping items that fits it most tightly (best
  fit), or in a second pass the lowest gap that fits (first fit); with no gap, on top of them.
- The caller's storage-id plan (slots laid end to end), so the arena never costs more than the
  storage-id planner of memory.py.
- Gravity compaction of the best: items in increasing offset order each drop to the lowest offset
  free of the items already dropped. Every item ends at or below where it was (the items below it
  only moved down), so compaction never grows the arena.
The portfolio stops as soon as an arena meets the peak bound (it is then optimal).

Guarantee: the placement is safe (time-overlapping items never share a byte; checked again by
verify.py after planning), every offset is a multiple of :data:`ALIGNMENT`, and ``peak <= arena <=
min(slot plan, sum of sizes)`` with sizes rounded up to the alignment. The distance to the peak is
not bounded in general; measured figures are in docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: Byte alignment of every offset (the pool's allocation alignment; kernels may assume it).
ALIGNMENT = 64


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGNMENT`."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


Span = tuple[int, int, int]  # (size, start, end): one item, its size already aligned


def arena_size(spans: Sequence[Span], offsets: Sequence[int]) -> int:
    return max((off + s[0] for s, off in zip(spans, offsets)), default=0)


def _overlapping(
    spans: Sequence[Span], placed: list[int], offsets: list[int], i: int
) -> list[tuple[int, int]]:
    """Byte ranges of the placed items whose interval overlaps item ``i``'s, sorted."""
    _, start, end = spans[i]
    return sorted(
        (offsets[j], offsets[j] + spans[j][0]) for j in placed if spans[j][1] <= end and start <= spans[j][2]
    )


def _lowest_gap(ranges: list[tuple[int, int]], size: int, best_fit: bool) -> int:
    """Offset of the tightest (``best_fit``) or lowest gap of ``size`` bytes below/between ``ranges``,
    else the top of them."""
    top, choice, choice_gap = 0, -1, 0
    for lo, hi in ranges:
        gap = lo - top
        if gap >= size and (choice < 0 or (best_fit and gap < choice_gap)):
            choice, choice_gap = top, gap
            if not best_fit:
                break
        top = max(top, hi)
    return choice if choice >= 0 else top


def place(spans: Sequence[Span], order: Sequence[int], best_fit: bool) -> list[int]:
    """Offsets from placing items in ``order``, each into a gap (module docstring)."""
    offsets = [0] * len(spans)
    placed: list[int] = []
    for i in order:
        offsets[i] = _lowest_gap(_overlapping(spans, placed, offsets, i), spans[i][0], best_fit)
        placed.append(i)
    return offsets


def compact(spans: Sequence[Span], offsets: list[int]) -> list[int]:
    """Gravity: in increasing offset order, each item drops to the lowest free offset."""
    order = sorted(range(len(spans)), key=lambda i: (offsets[i], spans[i][1]))
    return place(spans, order, best_fit=False)


def _breadth(spans: Sequence[Span], length: int) -> list[int]:
    """Per item, the most bytes live at once during its interval."""
    live = [0] * (length + 2)
    for size, start, end in spans:  # difference array of live bytes over time
        live[start] += size
        live[end + 1] -= size
    total = 0
    for t in range(len(live)):
        total += live[t]
        live[t] = total
    return [max(live[start : end + 1]) for _, start, end in spans]


def plan_arena(spans: Sequence[Span], length: int, peak: int, slot_offsets: list[int]) -> list[int]:
    """Offsets of the smallest arena of the portfolio (module docstring).

    ``length``: the last time step; ``peak``: bytes of the aligned sizes live at once (the lower
    bound); ``slot_offsets``: a safe placement from the storage-id planner.
    """
    breadth = _breadth(spans, length)
    orders: list[Callable[[int], tuple]] = [
        lambda i: (-spans[i][0], spans[i][1] - spans[i][2], spans[i][1]),
        lambda i: (-breadth[i], -spans[i][0], spans[i][1]),
        lambda i: (spans[i][1], -spans[i][0]),
    ]
    best = slot_offsets
    if arena_size(spans, best) <= peak:
        return best
    for key in orders:
        order = sorted(range(len(spans)), key=key)
        for best_fit in (True, False):
            offsets = place(spans, order, best_fit)
            if arena_size(spans, offsets) < arena_size(spans, best):
                best = offsets
            if arena_size(spans, best) <= peak:
                return best
    compacted = compact(spans, best)
    return compacted if arena_size(spans, compacted) <= arena_size(spans, best) else best
