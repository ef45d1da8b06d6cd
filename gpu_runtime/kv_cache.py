"""Row surgery on a Hugging Face DynamicCache for continuous batching. Imports no Django.

A cohort of requests decodes together over one DynamicCache whose rows are left-padded to a
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
    __slots__ = ("keys", "values")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values


class LeanCache:
    """Per-layer keys/values (rows, kv_heads, columns, head_dim), laid out like DynamicCache's."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]]):
        self.layers = [KVLayer(k, v) for k, v in kv]

    def past(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.layers]

    def replace(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            layer.keys, layer.values = k, v


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
        layer.keys = torch.cat(
            [_left_pad(layer.keys, width - length, -2), _left_pad(new_layer.keys, width - new_length, -2)]
        )
        layer.values = torch.cat(
            [_left_pad(layer.values, width - length, -2), _left_pad(new_layer.values, width - new_length, -2)]
        )
    return torch.cat([_left_pad(mask, width - length, 1), _left_pad(new_mask, width - new_length, 1)])


def keep_rows(cache, mask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Keep only `rows` (in that order) and trim columns that are padding for every kept row."""
    index = torch.tensor(rows, dtype=torch.long, device=mask.device)
    mask = mask.index_select(0, index)
    real_columns = mask.any(dim=0).nonzero()
    first = int(real_columns[0]) if len(real_columns) else mask.shape[1]
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))[:, :, first:, :]
        layer.values = layer.values.index_select(0, index.to(layer.values.device))[:, :, first:, :]
    return mask[:, first:]
