"""Causal attention in query chunks with a hand-written backward: the CPU trainer's attention. Imports no Django.

The CPU flash kernel behind `scaled_dot_product_attention` runs its backward at about a third of the
matmul rate, and with the shared-prefix layout's mask it cannot skip the masked blocks. Here the
queries go in chunks: chunk i attends only the keys up to its own last position, so the masked
upper triangle is computed once per chunk's diagonal block instead of in full; every product is one
batched matmul over the query heads that share a key head; the softmax probabilities are kept for
the backward, which is then four matmuls and two elementwise passes a chunk.

The mask is causal aligned to the end ("lower right"): query j of T sees keys 0 .. S - T + j, which
is plain causal attention when S == T and the shared-prefix layout (every completion token sees the
whole prompt, then causal within its own row) when S > T. Every query sees at least one key, so no
row of the softmax is empty.

Keeping the probabilities costs batch x heads x queries x (about half the keys) floats a layer,
which is why `lean_decoder` takes this path only below a budget of kept scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Queries a chunk: at least this many, at most eight chunks a call. Smaller chunks skip more of the
# masked triangle but make smaller, slower matmuls.
MIN_CHUNK = 32


def chunk_size(queries: int) -> int:
    return max(MIN_CHUNK, -(-queries // 8))


def kept_scores(batch: int, heads: int, queries: int, keys: int) -> int:
    """How many probabilities `causal_attention` keeps for the backward."""
    return batch * heads * sum(count * visible for _, count, visible in _chunks(queries, keys))


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """q (B, H, T, D) over k, v (B, KV, S, D), S >= T, H a multiple of KV -> (B, H, T, D), laid out
    as a transposed (B, T, H, D), so that joining the heads for the output projection is a view."""
    return _CausalAttention.apply(q, k, v, scale)


def _by_position(x: Tensor, kv_heads: int) -> Tensor:
    """(B, H, T, D) -> (B*KV, T*group, D) contiguous: for each key head, its query heads' rows side
    by side at each position, so that a chunk of positions is one contiguous block of rows."""
    batch, heads, length, dim = x.shape
    group = heads // kv_heads
    x = x.reshape(batch, kv_heads, group, length, dim).transpose(2, 3)
    return x.reshape(batch * kv_heads, length * group, dim)


def _chunks(queries: int, keys: int):
    """(first query, query count, visible keys) per chunk."""
    chunk, offset = chunk_size(queries), keys - queries
    for start in range(0, queries, chunk):
        count = min(chunk, queries - start)
        yield start, count, offset + start + count


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        batch, heads, queries, dim = q.shape
        kv_heads, keys = k.shape[1], k.shape[2]
        group = heads // kv_heads
        rows_q = _by_position(q, kv_heads)
        flat_k = k.reshape(batch * kv_heads, keys, dim)
        flat_v = v.reshape(batch * kv_heads, keys, dim)
        out = torch.empty_like(rows_q)
        kept = []
        for start, count, visible in _chunks(queries, keys):
            rows = slice(start * group, (start + count) * group)
            scores = torch.bmm(rows_q[:, rows], flat_k[:, :visible].transpose(1, 2))
            # Only the chunk's diagonal block has masked keys: query j sees keys up to visible-count+j.
            diagonal = scores.view(-1, count, group, visible)[..., visible - count :]
            diagonal.masked_fill_(_upper(count, q.device).unsqueeze(1), float("-inf"))
            probs = torch.softmax(scores.mul_(scale), dim=-1)
            torch.bmm(probs, flat_v[:, :visible], out=out[:, rows])
            kept.append(probs)
        # (B*KV, T*group, D) -> (B, T, H, D), returned as its (B, H, T, D) transpose.
        out = out.view(batch, kv_heads, queries, group, dim).permute(0, 2, 1, 3, 4)
        out = out.reshape(batch, queries, heads, dim).transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, *kept)
        ctx.scale = scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, *kept = ctx.saved_tensors
        scale = ctx.scale
        batch, heads, queries, dim = q.shape
        kv_heads, keys = k.shape[1], k.shape[2]
        group = heads // kv_heads
        rows_q = _by_position(q, kv_heads)
        rows_grad = _by_position(grad_out, kv_heads)
        flat_k = k.reshape(batch * kv_heads, keys, dim)
        flat_v = v.reshape(batch * kv_heads, keys, dim)
        # Softmax backward: dS = P * (dP - rowsum(dO * O)); the row sums come from the output once.
        row_dot = _by_position((grad_out * out).sum(-1, keepdim=True), kv_heads)
        grad_q = torch.empty_like(rows_q)
        grad_k = torch.zeros_like(flat_k)
        grad_v = torch.zeros_like(flat_v)
        for (start, count, visible), probs in zip(_chunks(queries, keys), kept, strict=True):
            rows = slice(start * group, (start + count) * group)
            chunk_grad = rows_grad[:, rows]
            # Into fresh tensors, then added: a bmm into a slice of the key axis runs batch by batch.
            grad_v[:, :visible] += torch.bmm(probs.transpose(1, 2), chunk_grad)
            grad_scores = torch.bmm(chunk_grad, flat_v[:, :visible].transpose(1, 2))
            grad_scores = grad_scores.sub_(row_dot[:, rows]).mul_(probs)
            torch.bmm(grad_scores, flat_k[:, :visible], out=grad_q[:, rows])
            grad_k[:, :visible] += torch.bmm(grad_scores.transpose(1, 2), rows_q[:, rows])
        grad_q = grad_q.mul_(scale).view(batch, kv_heads, queries, group, dim).transpose(2, 3)
        return (
            grad_q.reshape(batch, heads, queries, dim),
            grad_k.mul_(scale).view(batch, kv_heads, keys, dim),
            grad_v.view(batch, kv_heads, keys, dim),
            None,
        )


def _upper(size: int, device) -> Tensor:
    """(size, size) bool, True strictly above the diagonal: the keys a diagonal block hides."""
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)
