"""Linear maps over weights packed once for oneDNN, the CPU's fastest path for them. Imports no Django.

Why: MKL's sgemm, which `F.linear` calls on the CPU, streams plain row-major weights slowly at a
decode step's few rows. oneDNN's linear over weights reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, the layout inductor's CPU backend uses) did the same
work in about half the time (a 25.7 M-parameter Qwen3's projections, one thread, 1 / 8 / 32 rows:
7.0 / 15.0 / 30.8 ms with `F.linear`, 4.0 / 6.3 / 12.7 ms packed), and as fast as sgemm at a
training batch's hundreds of rows.

A packed weight is a copy, so it replaces the plain stacked copy of q|k|v and gate|up that small
models keep (`lean_plan`) rather than adding to it: the forward runs packed, and the backward
computes the input's gradient from the projections' own weights, one matmul per part
(`linear(x, packed, bias, weights)`), never the weights' gradients: lean plans hold base weights
frozen (LoRA trains), as the plain stacked copy, made under no_grad, does.
Models whose projections are under `PACK_MIN_ELEMENTS` stay on `F.linear`: their weights sit in
the CPU's caches, where oneDNN's per-call cost outweighs (the 1.2 M-parameter tiny model at one
request: 1,584 tok/s plain, 1,234 packed). `KILN_PACKED_MATMUL=0` turns packing off.
Results equal `F.linear` up to float rounding (about 1e-6 relative).

Batch invariance: a row's result over a packed weight does not depend on the other rows of the
call, bit for bit (oneDNN's matmul blocks rows without changing any row's summation order; measured
for 2 to 1,100 rows, 1, 2 and 16 threads, AVX2 and AVX-512 kernels), while MKL's sgemm picks its
kernel and blocking by the row count (a row differs between 1, 4, 16 and 128-row calls). One row
alone takes another oneDNN kernel (at 2,048+ inputs a different sum), so it runs as two. The
sampler relies on this for seeds that give the same tokens alone or in any batch (`packed_linear`).
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
from torch import Tensor

__all__ = ["PACK_MIN_ELEMENTS", "SWITCH", "linear", "onednn_problem", "pack", "packing_problem"]

SWITCH = "KILN_PACKED_MATMUL"
PACK_MIN_ELEMENTS = 4 * 1024 * 1024


@lru_cache(maxsize=1)
def onednn_problem() -> str | None:
    """Why this torch build cannot run oneDNN's packed linear, or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        packed = pack(torch.ones(3, 4))
        out = _apply(torch.ones(2, 4), packed, None, 3)
    except Exception as exc:  # noqa: BLE001 - any failure means the plain path
        return f"oneDNN's packed linear failed to run ({type(exc).__name__}: {exc})"
    if not torch.equal(out, torch.full((2, 3), 4.0)):
        return "oneDNN's packed linear gave a wrong result on a check"
    return None


def packing_problem(weights: list[Tensor], *, stacked: bool, min_elements: int | None = None) -> str | None:
    """Why a model whose projection weights are `weights` is not packed, or None when it is.
    `stacked`: its q|k|v and gate|up are stacked (a packed copy replaces that copy; a model too
    large to stack is not copied at all). `min_elements`: the size below which packing does not pay
    (default `PACK_MIN_ELEMENTS`; the sampler packs any size, for batch invariance)."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    if not stacked:
        return "a large model: its projections are not stacked, and a packed copy would double its weights"
    elements = sum(weight.numel() for weight in weights)
    least = PACK_MIN_ELEMENTS if min_elements is None else min_elements
    if elements < least:
        return f"a small model ({elements:,} projection weights, under {least:,}): its weights stay in cache"
    dtypes = {weight.dtype for weight in weights}
    devices = {weight.device.type for weight in weights}
    if devices != {"cpu"} or dtypes != {torch.float32}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return f"packing is for float32 on the CPU (this model: {names} on {', '.join(sorted(devices))})"
    return onednn_problem()


def pack(weight: Tensor) -> Tensor:
    """`weight` (out, in) reordered for oneDNN: a plain tensor even under inference_mode."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def _apply(x: Tensor, packed: Tensor, bias: Tensor | None, out_features: int) -> Tensor:
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    if flat.shape[0] == 1:  # one row as two: the kernel (and sum) of every other row count (above)
        y = torch.ops.mkldnn._linear_pointwise(torch.cat((flat, flat)), packed, bias, "none", [], "")[:1]
    else:
        y = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return y.view(*x.shape[:-1], out_features)


class _PackedLinear(torch.autograd.Function):
    """Forward over the packed weight; backward: the input's gradient from the plain weights,
    part by part (the packed layout has no transposed use)."""

    @staticmethod
    def forward(ctx, x, packed, bias, *weights):
        ctx.save_for_backward(*weights)  # the model's own tensors: saving them costs nothing
        return _apply(x, packed, bias, sum(w.shape[0] for w in weights))

    @staticmethod
    def backward(ctx, grad):
        flat = grad.reshape(-1, grad.shape[-1])
        grad_x, start = None, 0
        for weight in ctx.saved_tensors:
            part = flat[:, start : start + weight.shape[0]]
            grad_x = part @ weight if grad_x is None else grad_x.addmm_(part, weight)
            start += weight.shape[0]
        return (grad_x.view(*grad.shape[:-1], grad_x.shape[-1]), None, None, *(None for _ in ctx.saved_tensors))


def linear(x: Tensor, packed: Tensor, bias: Tensor | None, weights: tuple[Tensor, ...]) -> Tensor:
    """x @ cat(weights).T + bias, the product over `packed` (= pack(cat(weights))). Differentiable
    in `x` only; `weights` are the plain parts the backward reads."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _PackedLinear.apply(x, packed, bias, *weights)
    return _apply(x, packed, bias, sum(w.shape[0] for w in weights))
