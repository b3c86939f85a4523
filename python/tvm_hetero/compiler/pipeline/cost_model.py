"""The cost model of a pipeline stage and the dynamic program that cuts the kernel order.

A stage covering kernel positions ``[a, b)`` costs::

    T_s(a, b) = sum of the kernel times measured on stage s's device
                + (bytes it receives from earlier stages + bytes it sends to later stages) / copy_bytes_per_us

Dynamic programming over the kernel order (``choose_split_points``) first finds the smallest
possible bottleneck ``B* = min over cuts of max_s T_s``, then, among the cuts whose every stage
costs at most ``B* * (1 + tolerance)``, picks the one that moves the fewest bytes across stage
boundaries (each tensor counted once per stage that receives it), ties going to the smaller
bottleneck. Guarantee: both steps are exact for this cost model over cuts of the given kernel
order (tests check them against brute force); other topological orders are not searched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: One tensor for :func:`choose_split_points`: (producer position, consumer positions, bytes).
Tensor = tuple[int, Sequence[int], int]

DEFAULT_COPY_BYTES_PER_US = 4000.0  # 4 GB/s, a conservative host memcpy


class SegmentModel:
    """Bytes a stage covering kernel positions ``[a, b)`` receives / sends, for every a < b.

    ``received[a, b]``: tensors produced before ``a`` that some kernel in ``[a, b)`` reads.
    ``sent[a, b]``: tensors produced in ``[a, b)`` that some kernel at ``b`` or later reads.
    Both are sums of rectangles in (a, b), built with a 2-D difference array in O(n^2 + uses).
    """

    def __init__(self, n: int, tensors: Sequence[Tensor]):
        self.n = n
        received = np.zeros((n + 2, n + 2))
        sent = np.zeros((n + 2, n + 2))
        for producer, consumers, nbytes in tensors:
            later = sorted({c for c in consumers if c > producer})
            if not later:
                continue
            _add_rectangle(sent, (0, producer), (producer + 1, later[-1]), nbytes)
            previous = producer
            for c in later:  # a in (previous, c]: the first reader at or after a is c, so b > c
                _add_rectangle(received, (previous + 1, c), (c + 1, n), nbytes)
                previous = c
        self.received = received.cumsum(0).cumsum(1)[: n + 1, : n + 1]
        self.sent = sent.cumsum(0).cumsum(1)[: n + 1, : n + 1]

    def stage_times(self, costs: Sequence[float], copy_bytes_per_us: float | None) -> np.ndarray:
        """``T[a, b]`` (µs) of a stage with per-kernel ``costs``; inf where ``b <= a``."""
        prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
        times = prefix[None, :] - prefix[:, None]
        if copy_bytes_per_us:
            times = times + (self.received + self.sent) / copy_bytes_per_us
        times[np.tril_indices(self.n + 1)] = np.inf
        return times


def _add_rectangle(
    diff: np.ndarray, a_range: tuple[int, int], b_range: tuple[int, int], value: float
) -> None:
    (a0, a1), (b0, b1) = a_range, b_range
    if a0 > a1 or b0 > b1:
        return
    diff[a0, b0] += value
    diff[a0, b1 + 1] -= value
    diff[a1 + 1, b0] -= value
    diff[a1 + 1, b1 + 1] += value


def choose_split_points(
    stage_costs: Sequence[Sequence[float]],
    tensors: Sequence[Tensor],
    *,
    tolerance: float = 0.02,
    copy_bytes_per_us: float | None = DEFAULT_COPY_BYTES_PER_US,
) -> list[int]:
    """Split points for ``len(stage_costs)`` stages over ``n`` kernels (see the module docstring).

    ``stage_costs[s][i]``: time of kernel ``i`` on stage ``s``'s device. ``tensors``: (producer
    position, consumer positions, bytes) of the tensors kernels pass each other. Minimises the
    bottleneck stage time; among cuts within ``tolerance`` of it, the bytes stages receive.
    """
    model = SegmentModel(len(stage_costs[0]), tensors)
    return choose(model, [model.stage_times(c, copy_bytes_per_us) for c in stage_costs], tolerance)


def choose(model: SegmentModel, times: list[np.ndarray], tolerance: float) -> list[int]:
    num_stages, n = len(times), model.n
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot cut {n} kernels into {num_stages} non-empty stages")
    # Step 1: best[s][b] = smallest bottleneck of stages 0..s covering kernels [0, b).
    best = np.full((num_stages, n + 1), np.inf)
    best[0] = times[0][0]
    for s in range(1, num_stages):
        for b in range(s + 1, n + 1):
            best[s, b] = np.min(np.maximum(best[s - 1, :b], times[s][:b, b]))
    limit = best[-1, n] * (1 + tolerance) * (1 + 1e-12)
    # Step 2: fewest received bytes with every stage within the limit; ties to the smaller bottleneck.
    score: list[list[tuple[float, float] | None]] = [[None] * (n + 1) for _ in range(num_stages)]
    came_from = np.zeros((num_stages, n + 1), dtype=int)
    for b in range(1, n + 1):
        if times[0][0, b] <= limit:
            score[0][b] = (0.0, times[0][0, b])
    for s in range(1, num_stages):
        for b in range(s + 1, n + 1):
            for a in range(s, b):
                prev, t = score[s - 1][a], times[s][a, b]
                if prev is None or t > limit:
                    continue
                candidate = (prev[0] + model.received[a, b], max(prev[1], t))
                if score[s][b] is None or candidate < score[s][b]:
                    score[s][b], came_from[s, b] = candidate, a
    points, b = [], n
    for s in range(num_stages - 1, 0, -1):
        b = int(came_from[s, b])
        points.append(b)
    return points[::-1]

