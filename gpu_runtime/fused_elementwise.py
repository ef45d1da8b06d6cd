"""SwiGLU and rotary embedding as autograd functions with hand-written backwards. Imports no Django.

Why: at long completions the training step's elementwise passes over [tokens x intermediate]
tensors cost as much as a third of its matmul time on the CPU (docs/performance.md). Composed
from torch ops, autograd adds passes the maths does not need:
- SwiGLU reads gate and up as two halves of one projection output (`split`); the split's
  backward concatenates the two gradients into a fresh [tokens x 2*intermediate] tensor, one
  more pass over the largest activation of the layer. Here both gradients are written straight
  into the halves of one buffer, and under no_grad the product is taken in place.
- RMSNorm under autograd decomposes into about ten passes (squares, mean, reciprocal root,
  products, and as many again in the backward) and keeps their intermediates. Here the forward
  is torch's fused kernel, which also returns the reciprocal root, and the backward is two
  products, one row sum and one fused multiply-add; only the input and the per-row root are kept.
- Rotary embedding as `x*cos + cat(-x2, x1)*sin` makes a negated half, a concatenation, two
  products and a sum, and its backward zero-fills and adds per-slice gradients. Here the forward
  and the backward are one product and two fused multiply-adds on the halves each.
Results equal the composed ops up to float rounding (tests/gpu_runtime/test_fused_elementwise.py).
Plain torch ops, so they run on any device and dtype; the Triton kernels live in `kernels/`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["rms_norm", "rotary", "swiglu"]


def _needs_grad(*tensors: Tensor) -> bool:
    """Whether autograd will want a backward. The sampler's decode steps do not: there the plain
    ops run, without an autograd function's per-call cost (measurable on small models)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up, where gate|up are the two halves of `gate_up`'s last axis."""

    @staticmethod
    def forward(ctx, gate_up: Tensor, width: int) -> Tensor:
        gate, up = gate_up.split(width, dim=-1)
        activated = F.silu(gate)
        ctx.width = width
        ctx.save_for_backward(gate_up, activated)
        return activated * up

    @staticmethod
    @once_differentiable  # the backwards write into their own buffers: no second derivative
    def backward(ctx, grad: Tensor):
        gate_up, activated = ctx.saved_tensors
        gate, up = gate_up.split(ctx.width, dim=-1)
        grad_gate_up = torch.empty_like(gate_up, memory_format=torch.contiguous_format)
        grad_gate, grad_up = grad_gate_up.split(ctx.width, dim=-1)
        torch.mul(grad, activated, out=grad_up)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_gate)
        return grad_gate_up, None


def swiglu(gate_up: Tensor, width: int) -> Tensor:
    """silu(gate_up[..., :width]) * gate_up[..., width:] (the MLP activation of Llama-family models)."""
    if gate_up.shape[-1] != 2 * width:
        raise ValueError(f"gate_up's last axis is {gate_up.shape[-1]}, not twice the width {width}")
    if not _needs_grad(gate_up):  # nothing to keep for a backward: one buffer, reused
        gate, up = gate_up.split(width, dim=-1)
        return F.silu(gate).mul_(up)
    return _SwiGLU.apply(gate_up, width)


class _Rotary(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1) over the last axis."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, sign=1.0)

    @staticmethod
    @once_differentiable  # the backwards write into their own buffers: no second derivative
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        # The rotation's transpose: d x1 = g1*cos1 + g2*sin2, d x2 = g2*cos2 - g1*sin1.
        return _rotate(grad, cos, sin, sign=-1.0), None, None


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, sign: float) -> Tensor:
    """sign +1: (x1*cos1 - x2*sin1, x2*cos2 + x1*sin2); sign -1: (x1*cos1 + x2*sin2, x2*cos2 - x1*sin1)."""
    half = x.shape[-1] // 2
    out = x * cos
    x1, x2 = x[..., :half], x[..., half:]
    sin1, sin2 = sin[..., :half], sin[..., half:]
    if sign > 0:
        out[..., :half].addcmul_(x2, sin1, value=-1.0)
        out[..., half:].addcmul_(x1, sin2)
    else:
        out[..., :half].addcmul_(x2, sin2)
        out[..., half:].addcmul_(x1, sin1, value=-1.0)
    return out


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding of `x` (..., head_dim) with `cos`/`sin` broadcasting to it.

    Gradients flow to `x` only: a model's rotary tables are constants. Tables that require grad
    (nothing in Kiln builds them so) take the composed ops, which differentiate them too."""
    if x.shape[-1] % 2:
        raise ValueError(f"rotary embedding needs an even head dimension, not {x.shape[-1]}")
    if cos.requires_grad or sin.requires_grad:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    if not _needs_grad(x):
        return _rotate(x, cos, sin, sign=1.0)
    return _Rotary.apply(x, cos, sin)


class _RMSNorm(torch.autograd.Function):
    """x * rstd * weight with rstd = 1 / sqrt(mean(x^2 over the last axis) + eps)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        out, rstd = _normalised(x, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    @once_differentiable  # the backwards write into their own buffers: no second derivative
    def backward(ctx, grad: Tensor):
        x, rstd, weight = ctx.saved_tensors
        # With n = x * rstd and u = grad * weight: dx = rstd * (u - n * mean(u * n)), written as
        # u * rstd - x * (rstd^3 * sum(u * x) / size) so that n is never materialised.
        weighted = grad * weight
        grad_x = torch.mul(weighted, x)
        coefficient = grad_x.sum(-1, keepdim=True).mul_(rstd.pow(3)).div_(x.shape[-1])
        torch.mul(weighted, rstd, out=grad_x)
        grad_x.addcmul_(x, coefficient, value=-1.0)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * x * rstd).sum_to_size(weight.shape)
        return grad_x, grad_weight, None


def _normalised(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm of x, its per-row reciprocal root) from torch's fused kernel."""
    if weight.dim() == 1:  # the fused kernel applies a weight of the normalised axis itself
        return torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)
    # A weight over several trailing axes (Qwen3's stacked per-head q/k norms).
    out, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], None, eps)
    return out.mul_(weight), rstd


FUSED_RMS_NORM = hasattr(torch.ops.aten, "_fused_rms_norm")


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of float32 `x` over its last axis; `weight` (float32) broadcasts over the trailing
    axes it covers. Reduced precision keeps its own recipe (`lean_decoder.rms_norm`), and a torch
    without the fused kernel (`FUSED_RMS_NORM` false) the composed ops."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not FUSED_RMS_NORM:
        raise TypeError("the fused rms_norm takes float32 input and weight, on a torch with _fused_rms_norm")
    if not _needs_grad(x, weight):
        return _normalised(x, weight, eps)[0]
    return _RMSNorm.apply(x, weight, eps)
