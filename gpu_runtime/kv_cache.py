"""The sampler's KV caches and their row surgery for continuous batching. Imports no Django.

`LeanCache` (the lean forward's cache: each layer's decode steps appended in place, see `KVLayer`)
or a Hugging Face DynamicCache (the transformers forward's). A cohort of requests decodes together
over one cache whose rows are left-padded to a
common length; a 2-D attention mask (1 = real token) says which columns each row may attend to,
and explicit position ids keep each row's rotary positions independent of its padding. These
helpers add rows (a freshly prefilled request), drop rows (finished requests) and drop leading
columns that have become padding for every row. Only full-attention layers (plain DynamicLayer)
are supported: a sliding-window layer would also drop columns on its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer


class KVLayer:
    """One layer's keys and values (rows, kv_heads, columns, head_dim) as views of buffers that may
    hold spare columns. A decode step writes its column into the spare in place; only a full buffer
    is copied, into one with as many spare columns as it has filled (so a long completion costs
    amortised O(1) copies per column instead of `torch.cat`'s whole cache at every step). Row surgery
    (`keep_rows`, `append_rows`) leaves exact-size tensors, as `torch.cat` and `index_select` give
    them, and the step after it copies without spare columns, as `torch.cat` did: with short
    completions rows finish at nearly every step, and spare columns would only cost."""

    __slots__ = ("_keys", "_values", "length", "_settled")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.set(keys, values)

    @property
    def keys(self) -> torch.Tensor:
        return self._keys if self._keys.shape[2] == self.length else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self._values if self._values.shape[2] == self.length else self._values[:, :, : self.length]

    def set(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._keys, self._values, self.length = keys, values, keys.shape[2]
        self._settled = False  # rows just changed: they may well change again at the next step

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add `keys`/`values` (same rows, T new columns) after the filled ones; return every filled column."""
        end = self.length + keys.shape[2]
        if end > self._keys.shape[2]:
            # Spare columns only once the rows have held for a step: right after row surgery they
            # would be allocated (and paged in) for nothing when rows keep finishing every step.
            columns = end + max(MIN_SPARE_COLUMNS, end) if self._settled else end
            self._keys, self._values = _grown(self.keys, columns), _grown(self.values, columns)
        self._settled = True
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end
        return self.keys, self.values


# A grown buffer gets at least this many spare columns (and as many as it has filled).
MIN_SPARE_COLUMNS = 16


def _grown(filled: torch.Tensor, columns: int) -> torch.Tensor:
    buffer = filled.new_empty((*filled.shape[:2], columns, filled.shape[3]))
    buffer[:, :, : filled.shape[2]] = filled
    return buffer


class LeanCache:
    """Per-layer keys/values (rows, kv_heads, columns, head_dim), laid out like DynamicCache's; the
    lean forward appends each step's keys and values (`lean_decoder.forward(cache=...)`)."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]]):
        self.layers = [KVLayer(k, v) for k, v in kv]

    @property
    def length(self) -> int:
        return self.layers[0].length


def check_supported(cache: DynamicCache) -> None:
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise TypeError(
                f"unsupported KV cache layer {type(layer).__name__}; only full attention is supported"
            )


def _left_pad(tensor: torch.Tensor, columns: int, dim: int) -> torch.Tensor:
    if columns == 0:
        return tensor
    pad = [0, 0] * (tensor.dim() - 1 - (dim % tensor.dim())) + [columns, 0]
    return F.pad(tensor, pad)


def append_rows(cache, mask: torch.Tensor, new_cache, new_mask: torch.Tensor) -> torch.Tensor:
    """Append `new_cache`'s rows to `cache` in place, left-padding whichever is shorter; return the mask."""
    length, new_length = mask.shape[1], new_mask.shape[1]
    width = max(length, new_length)
    for layer, new_layer in zip(cache.layers, new_cache.layers, strict=True):
        keys = torch.cat(
            [_left_pad(layer.keys, width - length, -2), _left_pad(new_layer.keys, width - new_length, -2)]
        )
        values = torch.cat(
            [_left_pad(layer.values, width - length, -2), _left_pad(new_layer.values, width - new_length, -2)]
        )
        _set(layer, keys, values)
    return torch.cat([_left_pad(mask, width - length, 1), _left_pad(new_mask, width - new_length, 1)])


def keep_rows(cache, mask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Keep only `rows` (in that order) and trim columns that are padding for every kept row."""
    index = torch.tensor(rows, dtype=torch.long, device=mask.device)
    mask = mask.index_select(0, index)
    real_columns = mask.any(dim=0).nonzero()
    first = int(real_columns[0]) if len(real_columns) else mask.shape[1]
    for layer in cache.layers:
        keys = layer.keys[:, :, first:].index_select(0, index.to(layer.keys.device))
        values = layer.values[:, :, first:].index_select(0, index.to(layer.values.device))
        _set(layer, keys, values)
    return mask[:, first:]


def _set(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    if isinstance(layer, KVLayer):
        layer.set(keys, values)
    else:  # a DynamicCache layer
        layer.keys, layer.values = keys, values
