"""The sampler's lean KV cache: appends in place into spare columns, row surgery as before."""

from __future__ import annotations

import torch

from gpu_runtime import kv_cache


def _kv(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 2, columns, 4, generator=generator),
            torch.randn(rows, 2, columns, 4, generator=generator))


def test_appends_equal_concatenation_and_copy_a_logarithmic_number_of_times():
    keys, values = _kv(3, 5, 0)
    layer = kv_cache.KVLayer(keys, values)
    buffers = {layer._keys.data_ptr()}
    for step in range(300):
        new_keys, new_values = _kv(3, 1, step + 1)
        keys, values = torch.cat([keys, new_keys], 2), torch.cat([values, new_values], 2)
        seen_keys, seen_values = layer.append(new_keys, new_values)
        buffers.add(layer._keys.data_ptr())
        assert torch.equal(seen_keys, keys) and torch.equal(seen_values, values)
    assert layer.length == 305
    assert len(buffers) <= 7  # 5 -> 6+16 -> 23+... : doubling, not a copy per step


def test_row_surgery_keeps_the_filled_columns_of_the_chosen_rows():
    keys, values = _kv(4, 6, 0)
    cache = kv_cache.LeanCache([(keys, values)])
    grown_keys, grown_values = _kv(4, 1, 1)
    cache.layers[0].append(grown_keys, grown_values)  # now a view of a buffer with spare columns
    keys, values = torch.cat([keys, grown_keys], 2), torch.cat([values, grown_values], 2)
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[2, :3] = 0  # row 2 is left-padded by three columns
    mask[3, :2] = 0
    kept = kv_cache.keep_rows(cache, mask, [3, 2])
    assert kept.shape == (2, 5)  # the two leading columns are padding for both kept rows
    assert torch.equal(cache.layers[0].keys, keys[[3, 2]][:, :, 2:])
    assert torch.equal(cache.layers[0].values, values[[3, 2]][:, :, 2:])

    other_keys, other_values = _kv(1, 8, 2)
    other = kv_cache.LeanCache([(other_keys, other_values)])
    joined = kv_cache.append_rows(cache, kept, other, torch.ones(1, 8, dtype=torch.long))
    assert joined.tolist()[:2] == [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]]
    layer = cache.layers[0]
    assert layer.keys.shape == (3, 2, 8, 4) and torch.equal(layer.keys[2], other_keys[0])
    assert torch.equal(layer.keys[:2, :, 3:], keys[[3, 2]][:, :, 2:])
    assert not layer.keys[:2, :, :3].any()  # padding columns hold zeros: masked, and finite

    new_keys, new_values = _kv(3, 1, 3)
    seen_keys, _ = layer.append(new_keys, new_values)
    assert seen_keys.shape == (3, 2, 9, 4) and torch.equal(seen_keys[:, :, -1:], new_keys)
