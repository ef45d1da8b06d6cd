"""Fused linear log-probs (Triton, interpreted) against the full-logits torch computation.

Shapes: 37 tokens (not a multiple of the 16-token chunk) by a 301-word vocabulary (three
128-column chunks, each two 64-column blocks, the last ones partial); rows with target -100
are masked. fp32 agrees to float rounding; bf16 is compared with the bf16 torch path (the same
bf16 logits, upcast), by relative norm, since its rounding is that of bf16 matmuls.
"""

from __future__ import annotations

import pytest
import torch

from gpu_runtime.kernels.linear_logprobs import linear_logprobs, reference_linear_logprobs

N, H, V = 37, 24, 301
CHUNKS = dict(token_chunk=16, vocab_chunk=128, block=64)


def inputs(dtype, *, weight_grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(N, H, generator=g) * 0.5).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.5).to(dtype).requires_grad_(weight_grad)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[[0, 17, 36]] = -100  # masked rows: log-prob 0, no gradient
    targets[5] = V - 1  # a target in the last, partial block
    return hidden, weight, targets


def run(fn, hidden, weight, targets, **kwargs):
    """Forward both outputs, then backward through a mix of them (both upstream gradients non-zero)."""
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_(weight.requires_grad)
    logprobs, lse = fn(hidden, weight, targets, **kwargs)
    upstream = torch.linspace(-1.0, 1.0, N)
    (logprobs * upstream).sum().add((lse * 0.25).sum()).backward()
    return logprobs.detach(), lse.detach(), hidden.grad, weight.grad


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fp32_forward_and_gradients_match_the_full_logits(temperature):
    hidden, weight, targets = inputs(torch.float32)
    got = run(linear_logprobs, hidden, weight, targets, temperature=temperature, **CHUNKS)
    want = run(reference_linear_logprobs, hidden, weight, targets, temperature=temperature)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)
    assert (got[0][targets < 0] == 0).all()


def test_bf16_matches_the_bf16_torch_path():
    hidden, weight, targets = inputs(torch.bfloat16)
    got = run(linear_logprobs, hidden, weight, targets, **CHUNKS)
    want = run(reference_linear_logprobs, hidden, weight, targets)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0], atol=3e-2, rtol=0)  # a few bf16 ulps of the logits
    torch.testing.assert_close(got[1], want[1], atol=3e-2, rtol=0)
    assert rel(got[2], want[2]) < 2e-2 and rel(got[3], want[3]) < 2e-2
    # And both stay close to the exact (fp32) values.
    exact = run(reference_linear_logprobs, hidden.float(), weight.float(), targets)
    assert rel(got[0], exact[0]) < 1e-2 and rel(got[2], exact[2]) < 2e-2


def test_a_frozen_weight_gets_no_gradient_and_one_chunk_equals_many():
    hidden, weight, targets = inputs(torch.float32, weight_grad=False, seed=1)
    chunked = run(linear_logprobs, hidden, weight, targets, **CHUNKS)
    whole = run(linear_logprobs, hidden, weight, targets)  # default chunks: a single tile
    assert chunked[3] is None and whole[3] is None
    for g, w in zip(chunked[:3], whole[:3], strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


def test_batched_shape_and_the_lm_head_wrapper(loaded):
    from gpu_runtime import lean_decoder
    from gpu_runtime.kernels.lm_head import fused_lm_logprobs

    plan = lean_decoder.plan_for(loaded.model)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 5, plan.lm_head.shape[1], generator=g)
    targets = torch.randint(0, plan.lm_head.shape[0], (2, 5), generator=g)
    got = fused_lm_logprobs(plan, hidden, targets)
    assert got.shape == (2, 5)
    torch.testing.assert_close(got, lean_decoder.lm_logprobs(plan, hidden, targets), atol=2e-5, rtol=1e-5)
    # Per-row sampling temperatures divide the logits on both paths (the fused one scales the
    # normed hidden state instead), and they change the values.
    temperature = torch.tensor([0.7, 1.3])[:, None, None]
    tempered = fused_lm_logprobs(plan, hidden, targets, temperature=temperature)
    want = lean_decoder.lm_logprobs(plan, hidden, targets, temperature)
    torch.testing.assert_close(tempered, want, atol=2e-5, rtol=1e-5)
    logits = lean_decoder.lm_logits(plan, hidden) / temperature
    exact = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(want, exact, atol=2e-5, rtol=1e-5)
    assert (tempered - got).abs().max() > 1e-3
