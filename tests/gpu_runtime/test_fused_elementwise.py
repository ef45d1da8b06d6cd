"""SwiGLU and rotary autograd functions equal the composed torch ops: values and every gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpu_runtime.fused_elementwise import rms_norm, rotary, swiglu


def _composed_swiglu(gate_up, width):
    gate, up = gate_up.split(width, dim=-1)
    return F.silu(gate) * up


def _composed_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _tables(length: int, dim: int, dtype):
    """Rotary tables as transformers builds them (cos|cos, sin|sin), plus an asymmetric pair
    whose halves differ, so that a backward mixing up the halves cannot pass."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.arange(length, dtype=torch.float64)[:, None] * inv[None]
    angles = torch.cat([freqs, freqs], dim=-1)
    symmetric = angles.cos().to(dtype), angles.sin().to(dtype)
    g = torch.Generator().manual_seed(3)
    asymmetric = (
        torch.randn(length, dim, generator=g, dtype=torch.float64).to(dtype),
        torch.randn(length, dim, generator=g, dtype=torch.float64).to(dtype),
    )
    return symmetric, asymmetric


def test_swiglu_gradcheck_float64():
    gate_up = torch.randn(3, 5, 14, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: swiglu(t, 7), (gate_up,))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_swiglu_matches_composed_ops(dtype, tol):
    torch.manual_seed(0)
    # An odd width, a non-contiguous input (a slice of a wider tensor) and large gate values,
    # where silu saturates.
    wide = (torch.randn(2, 9, 2 * 37 + 5) * 6).to(dtype)
    base = wide[..., 3 : 3 + 2 * 37].detach().requires_grad_(True)
    oracle = base.detach().clone().requires_grad_(True)
    out, expected = swiglu(base, 37), _composed_swiglu(oracle, 37)
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    expected.backward(upstream)
    torch.testing.assert_close(base.grad, oracle.grad, rtol=tol, atol=tol)
    assert base.grad.shape == base.shape and base.grad.dtype == dtype


def test_swiglu_without_grad_equals_with_grad_and_leaves_the_input_alone():
    torch.manual_seed(1)
    gate_up = torch.randn(4, 10)
    kept = gate_up.clone()
    with torch.no_grad():
        out = swiglu(gate_up, 5)
    torch.testing.assert_close(out, _composed_swiglu(gate_up, 5), rtol=0, atol=0)
    assert torch.equal(gate_up, kept)  # the in-place product writes only its own buffer


def test_swiglu_rejects_a_width_that_does_not_halve_the_input():
    with pytest.raises(ValueError, match="not twice the width"):
        swiglu(torch.zeros(2, 9), 4)


def test_rotary_gradcheck_float64_with_asymmetric_tables():
    _, (cos, sin) = _tables(5, 6, torch.float64)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rotary(t, cos, sin), (x,))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("tables", ["symmetric", "asymmetric"])
def test_rotary_matches_composed_ops(dtype, tol, tables):
    torch.manual_seed(2)
    symmetric, asymmetric = _tables(7, 10, dtype)
    cos, sin = symmetric if tables == "symmetric" else asymmetric
    cos, sin = cos[None, None], sin[None, None]  # (1, 1, T, D) as the lean forward passes them
    # Laid out (B, T, H, D) and viewed as (B, H, T, D): the lean forward's transposed input.
    x = torch.randn(3, 7, 5, 10).to(dtype).transpose(1, 2).requires_grad_(True)
    oracle = x.detach().clone().requires_grad_(True)
    out, expected = rotary(x, cos, sin), _composed_rotary(oracle, cos, sin)
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    expected.backward(upstream)
    torch.testing.assert_close(x.grad, oracle.grad, rtol=tol, atol=tol)


def test_rotary_differentiates_tables_that_require_grad():
    (cos, sin), _ = _tables(4, 6, torch.float64)
    cos, sin = cos.clone().requires_grad_(True), sin.clone().requires_grad_(True)
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    rotary(x, cos, sin).sum().backward()
    assert cos.grad is not None and sin.grad is not None
    torch.testing.assert_close(cos.grad, x.detach().sum(0))


def test_rotary_rejects_an_odd_head_dimension():
    with pytest.raises(ValueError, match="even head dimension"):
        rotary(torch.zeros(2, 5), torch.ones(2, 5), torch.zeros(2, 5))


def _composed_rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("weight_shape", [(13,), (3, 13)], ids=["per-channel", "per-head"])
def test_rms_norm_matches_composed_ops_with_every_gradient(weight_shape):
    torch.manual_seed(4)
    # Rows of very different scales (and one of zeros): the reciprocal root must follow each.
    wide = torch.randn(2, 5, 3, 13 + 4) * torch.logspace(-3, 3, 5)[None, :, None, None]
    wide[1, 2] = 0.0
    x = wide[..., 2:15].detach().requires_grad_(True)  # non-contiguous, as Qwen3's q/k slices are
    weight = (torch.rand(weight_shape) + 0.5).requires_grad_(True)
    x_oracle = x.detach().clone().requires_grad_(True)
    weight_oracle = weight.detach().clone().requires_grad_(True)
    out = rms_norm(x, weight, 1e-6)
    expected = _composed_rms_norm(x_oracle, weight_oracle, 1e-6)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    expected.backward(upstream)
    torch.testing.assert_close(x.grad, x_oracle.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad, weight_oracle.grad, rtol=1e-4, atol=1e-5)


def test_rms_norm_frozen_weight_takes_no_weight_gradient():
    x = torch.randn(4, 6, requires_grad=True)
    weight = torch.rand(6) + 0.5
    rms_norm(x, weight, 1e-6).square().sum().backward()
    expected = torch.autograd.grad(_composed_rms_norm(x, weight, 1e-6).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-6)
    assert weight.grad is None


def test_rms_norm_takes_float32_only():
    with pytest.raises(TypeError, match="float32"):
        rms_norm(torch.zeros(2, 4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16), 1e-6)


def test_without_grad_the_plain_ops_give_the_same_values():
    """The no-grad path (the sampler's decode steps) skips the autograd functions: same values."""
    torch.manual_seed(5)
    (cos, sin), _ = _tables(6, 8, torch.float32)
    x = torch.randn(2, 3, 6, 8)
    norm_weight = torch.rand(6, 8) + 0.5  # over the two trailing axes, as the per-head norms are
    with torch.no_grad():
        rotated, normed = rotary(x, cos, sin), rms_norm(x, norm_weight, 1e-6)
    torch.testing.assert_close(rotated, _composed_rotary(x, cos, sin), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(normed, _composed_rms_norm(x, norm_weight, 1e-6), rtol=1e-5, atol=1e-6)
    assert rotated.grad_fn is None and normed.grad_fn is None
