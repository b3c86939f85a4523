"""Chunked prefill: which static graph (chunk size) processes which rows of a prompt.

Guarantee: :func:`plan_chunks` returns, for any length >= 1 and any set of chunk sizes containing
at least one size, chunks whose real rows add up to exactly the length, each chunk's real rows
between 1 and its size, and of all such sequences one with the least cost ``rows computed
(sizes summed, padding included) + call_cost x calls`` (dynamic programming over the remaining
length; ties go to fewer calls, then to larger chunks first). Only the last chunk is padded: the
padding of an earlier chunk would leave a gap in the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

#: What one graph call costs, counted in rows: a call reads every weight once, which is what a
#: decode step costs (it is memory-bound), and a row of a chunk costs roughly that divided by this.
DEFAULT_CALL_COST = 8


def check_sizes(sizes: Sequence[int], capacity: int) -> tuple[int, ...]:
    """The chunk sizes, sorted and checked against the cache capacity."""
    if not sizes:
        raise ValueError("prefill_chunks: at least one chunk size is needed")
    for size in sizes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"prefill_chunks: {size!r} is not a positive integer")
        if size > capacity:
            raise ValueError(f"prefill_chunks: a chunk of {size} rows exceeds the cache capacity of {capacity} tokens")
    return tuple(sorted(set(sizes)))


def plan_chunks(length: int, sizes: Sequence[int], call_cost: int = DEFAULT_CALL_COST) -> list[tuple[int, int]]:
    """``[(chunk size, real rows), ...]`` covering ``length`` rows (module guarantee)."""
    if length < 1:
        raise ValueError(f"plan_chunks: length must be at least 1, got {length}")
    ordered = sorted(set(sizes), reverse=True)
    # best[r] = (cost, calls, first chunk size) of covering r remaining rows with full chunks then
    # one final chunk that may be padded.
    best: list[tuple[int, int, int]] = [(0, 0, 0)] * (length + 1)
    for remaining in range(1, length + 1):
        options = []
        for size in ordered:
            if size >= remaining:  # the last chunk: padded up to its size
                options.append((size + call_cost, 1, -size))
            else:
                cost, calls, _ = best[remaining - size]
                options.append((cost + size + call_cost, calls + 1, -size))
        cost, calls, neg_size = min(options)
        best[remaining] = (cost, calls, -neg_size)
    chunks, remaining = [], length
    while remaining > 0:
        size = best[remaining][2]
        rows = min(size, remaining)
        chunks.append((size, rows))
        remaining -= rows
    return chunks
