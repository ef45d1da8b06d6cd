"""Causal attention in query chunks equals SDPA with the same end-aligned causal mask: values and
every gradient, over square and shared-prefix shapes, grouped query heads and ragged last chunks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpu_runtime import chunked_attention
from gpu_runtime.chunked_attention import causal_attention, chunk_size, kept_scores


def _inputs(batch, heads, kv_heads, queries, keys, dim, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_()

    return (
        make(batch, heads, queries, dim),
        make(batch, kv_heads, keys, dim),
        make(batch, kv_heads, keys, dim),
    )


def _reference(q, k, v, scale):
    queries, keys = q.shape[2], k.shape[2]
    mask = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


@pytest.mark.parametrize(
    "batch, heads, kv_heads, queries, keys, min_chunk",
    [
        (2, 4, 2, 37, 37, 32),  # square (plain causal), a ragged second chunk
        (3, 6, 3, 70, 81, 32),  # a shared prefix of 11 keys, chunks of 32, 32, 6
        (1, 2, 2, 300, 305, 32),  # one query head per key head, eight chunks, the last of 34
        (2, 8, 2, 19, 26, 4),  # four query heads per key head, chunks of 4 with a last of 3
        (1, 2, 1, 1, 9, 32),  # a single query over a past: one chunk, nothing masked
    ],
)
def test_values_and_gradients_equal_masked_sdpa(
    monkeypatch, batch, heads, kv_heads, queries, keys, min_chunk
):
    monkeypatch.setattr(chunked_attention, "MIN_CHUNK", min_chunk)
    q, k, v = _inputs(batch, heads, kv_heads, queries, keys, 16)
    grad_out = torch.randn(batch, heads, queries, 16, generator=torch.Generator().manual_seed(9))
    got = causal_attention(q, k, v, 0.25)
    expected = _reference(q, k, v, 0.25)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    got_grads = torch.autograd.grad(got, (q, k, v), grad_out)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    for name, a, b in zip("qkv", got_grads, expected_grads, strict=True):
        assert b.abs().max() > 1e-2, name  # real gradients, not zeros on both sides
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=f"d{name}")


def test_gradcheck_in_float64(monkeypatch):
    monkeypatch.setattr(chunked_attention, "MIN_CHUNK", 3)
    q, k, v = _inputs(1, 4, 2, 8, 11, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: causal_attention(a, b, c, 0.5), (q, k, v))


def test_a_query_never_sees_a_later_key():
    """Changing the last key and value moves only the last query's output; changing the first
    (a prompt key) moves every query's."""
    q, k, v = _inputs(1, 2, 1, 40, 45, 8)
    with torch.no_grad():
        base = causal_attention(q, k, v, 0.3)
        k2, v2 = k.clone(), v.clone()
        k2[:, :, -1] += 3.0
        v2[:, :, -1] -= 2.0
        moved = (causal_attention(q, k2, v2, 0.3) - base).abs().amax(dim=(0, 1, 3))
        assert (moved[:-1] == 0).all() and moved[-1] > 0
        k3 = k.clone()
        k3[:, :, 0] += 3.0
        assert ((causal_attention(q, k3, v, 0.3) - base).abs().amax(dim=(0, 1, 3)) > 0).all()


def test_the_output_joins_heads_as_a_view():
    """The output is a transposed (B, T, H, D): the output projection's reshape copies nothing."""
    q, k, v = _inputs(2, 4, 2, 33, 40, 8)
    out = causal_attention(q, k, v, 0.3)
    joined = out.transpose(1, 2).reshape(2, 33, 32)
    assert joined.data_ptr() == out.data_ptr()


def test_kept_scores_counts_the_visible_keys_of_each_chunk():
    # 70 queries over 81 keys in chunks of 32: 32 x 43 + 32 x 75 + 6 x 81 visible keys.
    assert chunk_size(70) == 32
    assert kept_scores(3, 6, 70, 81) == 3 * 6 * (32 * 43 + 32 * 75 + 6 * 81)
    # Against the full (queries x keys) scores, the masked triangle is mostly skipped.
    assert kept_scores(1, 1, 256, 284) < 0.62 * 256 * 284
