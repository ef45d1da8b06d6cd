"""Fused linear log-probs: hidden states [N, H] and the LM head [V, H] to log p(target) [N] and the
log-sum-exp [N], without the [N x V] logits. Imports torch (triton lazily); no Django.

The work runs in tiles of `token_chunk` x `vocab_chunk` logits: each tile is one matmul (cuBLAS
does that best), then a Triton kernel folds it into a running max and sum-exp per row (the
online log-sum-exp) and picks the target's logit. Backward recomputes each tile, turns it into
the logit gradient in place (`g_lse * p - g_lp * (p - onehot)`), and accumulates the hidden-state
gradient and, only when the weight requires grad, the weight gradient in float32. Peak memory is
one tile plus the fp32 accumulators, instead of the several [N x V] copies the plain path holds.

Targets below 0 mark masked rows: their log-prob is 0 and gets no gradient (their log-sum-exp is
still computed). `reference_linear_logprobs` is the plain torch computation: the fallback's
maths, and the oracle of the tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear_logprobs", "reference_linear_logprobs"]

TOKEN_CHUNK = 2048
VOCAB_CHUNK = 32768
BLOCK_V = 1024


def reference_linear_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0):
    """(log-prob [N], log-sum-exp [N]) from the full logits, in float32 (bf16 logits are upcast
    after the matmul, as the trainer's plain path does)."""
    logits = F.linear(hidden, weight).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    valid = targets >= 0
    picked = logits.gather(-1, targets.clamp(min=0)[:, None]).squeeze(-1)
    return torch.where(valid, picked - lse, torch.zeros_like(lse)), lse


def _kernels():
    from gpu_runtime.kernels import linear_logprobs_triton as k

    return k.lse_tile, k.grad_tile


def _tile(hidden: Tensor, weight: Tensor) -> Tensor:
    return torch.matmul(hidden, weight.t()).contiguous()


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, token_chunk, vocab_chunk, block):
        lse_tile, _ = _kernels()
        n, vocab = hidden.shape[0], weight.shape[0]
        inv_temp = 1.0 / temperature
        row_max = torch.full((n,), float("-inf"), dtype=torch.float32, device=hidden.device)
        row_sum = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        target_logit = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        for n0 in range(0, n, token_chunk):
            h = hidden[n0 : n0 + token_chunk]
            rows = h.shape[0]
            for v0 in range(0, vocab, vocab_chunk):
                logits = _tile(h, weight[v0 : v0 + vocab_chunk])
                lse_tile[(rows,)](
                    logits, logits.stride(0), targets[n0 : n0 + rows], row_max[n0 : n0 + rows],
                    row_sum[n0 : n0 + rows], target_logit[n0 : n0 + rows], v0, logits.shape[1], inv_temp,
                    BLOCK=block,
                )
        lse = torch.where(row_max == float("-inf"), row_max, row_max + torch.log(row_sum))
        valid = targets >= 0
        logprobs = torch.where(valid, target_logit - lse, torch.zeros_like(lse))
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.settings = (inv_temp, token_chunk, vocab_chunk, block)
        ctx.mark_non_differentiable(targets)
        return logprobs, lse

    @staticmethod
    def backward(ctx, g_lp, g_lse):
        _, grad_tile = _kernels()
        hidden, weight, targets, lse = ctx.saved_tensors
        inv_temp, token_chunk, vocab_chunk, block = ctx.settings
        n, vocab = hidden.shape[0], weight.shape[0]
        zeros = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        g_lp = zeros if g_lp is None else torch.where(targets >= 0, g_lp.float(), zeros).contiguous()
        g_lse = zeros if g_lse is None else g_lse.float().contiguous()
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        for n0 in range(0, n, token_chunk):
            h = hidden[n0 : n0 + token_chunk]
            rows = h.shape[0]
            for v0 in range(0, vocab, vocab_chunk):
                w = weight[v0 : v0 + vocab_chunk]
                dz = _tile(h, w)
                grad_tile[(rows,)](
                    dz, dz.stride(0), targets[n0 : n0 + rows], lse[n0 : n0 + rows], g_lp[n0 : n0 + rows],
                    g_lse[n0 : n0 + rows], v0, dz.shape[1], inv_temp, BLOCK=block,
                )
                if grad_h is not None:
                    grad_h[n0 : n0 + rows] += torch.matmul(dz, w).float()
                if grad_w is not None:
                    grad_w[v0 : v0 + vocab_chunk] += torch.matmul(dz.t(), h).float()
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def linear_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    token_chunk: int = TOKEN_CHUNK,
    vocab_chunk: int = VOCAB_CHUNK,
    block: int = BLOCK_V,
) -> tuple[Tensor, Tensor]:
    """(log p(targets), log-sum-exp), both float32 and shaped like `targets`, through the Triton
    tiles. `hidden` is (..., H) lined up with `targets` (...); `weight` is (V, H), no bias."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    if weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
    shape = targets.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    if not flat_hidden.is_contiguous():
        flat_hidden = flat_hidden.contiguous()
    flat_targets = targets.reshape(-1).contiguous()
    logprobs, lse = _LinearLogprobs.apply(
        flat_hidden, weight, flat_targets, float(temperature), int(token_chunk), int(vocab_chunk), int(block)
    )
    return logprobs.view(shape), lse.view(shape)
