"""The key/value cache of one generation: fixed capacity, allocated once, written in place.

Plain data a C++ loop could own as well: per layer a key tensor [1, KV, D, C] (transposed, so
scores need no transpose) and a value tensor [1, KV, C, D], one additive mask [1, 1, 1, C] that
every graph reads, and the number of rows filled. A chunk's new rows are written at the filled
position (:meth:`KVCache.append`), touching only those rows -- the bytes moved per decode step are
the new rows' bytes -- and the mask opens exactly the rows written. Rows beyond the filled length
are never read unmasked; they start at zero so that a masked score or weight stays finite.
"""

from __future__ import annotations

import numpy as np
import tvm

from .config import DecoderConfig
from .graph_io import MASKED, key_cache_shape, value_cache_shape


def host_tensor(shape: tuple[int, ...], dtype: str, device: tvm.runtime.Device) -> tuple[tvm.runtime.Tensor, np.ndarray]:
    """A zeroed tensor the graphs can bind without a copy (64-byte aligned) and a numpy view of it."""
    tensor = tvm.runtime.empty(shape, dtype, device)
    view = np.from_dlpack(tensor)
    view[...] = 0
    return tensor, view


class KVCache:
    """Every layer's cache, the mask over it and the filled length (module docstring)."""

    def __init__(self, cfg: DecoderConfig, capacity: int, device: tvm.runtime.Device):
        self.capacity = capacity
        #: Rows holding a token's keys and values (the next chunk's first position).
        self.filled = 0
        #: Per layer (keys, values) as tensors the graphs bind, and as numpy views the loop writes.
        self.tensors: list[tuple[tvm.runtime.Tensor, tvm.runtime.Tensor]] = []
        self._views: list[tuple[np.ndarray, np.ndarray]] = []
        for _ in range(cfg.num_layers):
            keys, key_view = host_tensor(key_cache_shape(cfg, capacity), "float32", device)
            values, value_view = host_tensor(value_cache_shape(cfg, capacity), "float32", device)
            self.tensors.append((keys, values))
            self._views.append((key_view, value_view))
        self.mask, self._mask_view = host_tensor((1, 1, 1, capacity), "float32", device)
        self._mask_view[...] = MASKED
        #: Bytes written into the cache since the session began (the new rows only).
        self.bytes_written = 0
        #: Bytes of every layer's keys and values.
        self.nbytes = sum(_nbytes(k) + _nbytes(v) for k, v in self.tensors)

    def reset(self) -> None:
        """Empty the cache for a new prompt (the rows stay allocated; the mask closes them)."""
        self._mask_view[...] = MASKED
        self.filled = 0

    def truncate(self, length: int) -> None:
        """Forget every row from ``length`` on (the mask closes them): generation goes on from the first
        ``length`` tokens, e.g. again after a prompt prefilled once."""
        if not 0 <= length <= self.filled:
            raise ValueError(f"KV cache: cannot keep {length} rows of the {self.filled} filled")
        self._mask_view[..., length:self.filled] = MASKED
        self.filled = length

    def room(self) -> int:
        return self.capacity - self.filled

    def append(self, new_rows: list[tuple[np.ndarray, np.ndarray]], count: int) -> None:
        """Write the first ``count`` rows of each layer's (new keys [1, KV, D, n], new values
        [1, KV, n, D]) at the filled position and open them in the mask."""
        start, end = self.filled, self.filled + count
        if count < 1 or end > self.capacity:
            raise ValueError(f"KV cache: {count} rows at position {start} do not fit its capacity of {self.capacity}")
        for (keys, values), (new_keys, new_values) in zip(self._views, new_rows):
            keys[:, :, :, start:end] = new_keys[:, :, :, :count]
            values[:, :, start:end, :] = new_values[:, :, :count, :]
            self.bytes_written += (new_keys.itemsize + new_values.itemsize) * count * keys.shape[1] * keys.shape[2]
        self._mask_view[..., start:end] = 0.0
        self.filled = end


def _nbytes(tensor: tvm.runtime.Tensor) -> int:
    return int(np.prod(tensor.shape)) * np.dtype(str(tensor.dtype)).itemsize
