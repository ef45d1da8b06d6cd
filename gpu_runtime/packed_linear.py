"""The CPU sampler's projections with their weights pre-packed for oneDNN. Imports no Django.

Why: a decode step multiplies a few rows (one per running request) by every projection weight,
and MKL's sgemm, which `F.linear` calls on the CPU, streams plain row-major weights slowly at so
few rows. oneDNN's linear over weights reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, the layout inductor's CPU backend uses) did the same
work in about half the time (a 25.7 M-parameter Qwen3's projections, one thread, 1 / 8 / 32 rows:
7.0 / 15.0 / 30.8 ms with `F.linear`, 4.0 / 6.3 / 12.7 ms packed), and a row's result did not
depend on which other rows shared its step, where sgemm's did in the last bits.

Inference only: a packed projection has no autograd (under autograd it runs its plain map), and
LoRA terms must already be folded in (the sampler's merged plans). A packed copy is one more copy
of the weights, so only models small enough to have their q|k|v and gate|up stacked
(`lean_plan.FUSE_MAX_ELEMENTS`, a bounded copy) yet too large to stay in the CPU's caches
(`PACK_MIN_ELEMENTS`) are packed: on the 25.7 M-parameter model that is 100 MB more.
`packed_plan(plan)` returns (plan, None) packed or (plan unchanged, reason).
Results equal `F.linear` up to float rounding (about 1e-6 relative): well inside the recorded-policy
replay's tolerance (`gpu_runtime.grpo.recorded.replay_tolerance`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from gpu_runtime.lean_plan import Plan, Projection, Stacked, cached_per_tensor

__all__ = ["PackedLinear", "packed_plan", "packing_problem"]

# KILN_PACKED_MATMUL=0 turns packing off (the plain `F.linear` path, as on other devices).
SWITCH = "KILN_PACKED_MATMUL"
# Pack only models whose projection weights are at least this many elements: smaller ones sit in
# the CPU's caches, where oneDNN's per-call cost outweighs (the 1.2 M-parameter tiny model at one
# request: 1,584 tok/s plain, 1,234 packed; the 25.7 M one: 99 -> 135).
PACK_MIN_ELEMENTS = 4 * 1024 * 1024
# Packed weights per weight tensor (`lean_plan.cached_per_tensor`), so the plans the sampler rebuilds
# after adapter changes reuse the base model's packed weights.
_packed_weights: dict[int, tuple] = {}


@lru_cache(maxsize=1)
def _onednn_problem() -> str | None:
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        weight = torch.ones(3, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4), packed, None, "none", [], "")
    except Exception as exc:  # noqa: BLE001 - any failure means the plain path
        return f"oneDNN's packed linear failed to run ({type(exc).__name__}: {exc})"
    if not torch.equal(out, torch.full((2, 3), 4.0)):
        return "oneDNN's packed linear gave a wrong result on a check"
    return None


def _parts(projection: Projection | Stacked) -> tuple[Projection, ...]:
    return projection.parts if isinstance(projection, Stacked) else (projection,)


def packing_problem(plan: Plan) -> str | None:
    """Why `plan`'s projections are not packed, or None when they are packable."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    projections = [p for layer in plan.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    parts = [part for projection in projections for part in _parts(projection)]
    if any(part.loras for part in parts):
        return "LoRA terms are not folded into the weights"
    if any(projection.weight is None for projection in projections):
        return "a large model: its projections are not stacked, and a packed copy would double its weights"
    elements = sum(projection.weight.numel() for projection in projections)
    if elements < PACK_MIN_ELEMENTS:
        return f"a small model ({elements:,} projection weights, under {PACK_MIN_ELEMENTS:,}): its weights stay in cache"
    dtypes = {projection.weight.dtype for projection in projections}
    if plan.embed.device.type != "cpu" or dtypes != {torch.float32}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return f"packing is for float32 on the CPU (this plan: {names} on {plan.embed.device.type})"
    return _onednn_problem()


@dataclass(frozen=True)
class PackedLinear:
    """`plain` (a Projection or fused Stacked without LoRA terms) with its weight packed for oneDNN."""

    plain: Projection | Stacked
    packed: Tensor
    bias: Tensor | None
    out_features: int

    @property
    def weight(self) -> Tensor:
        return self.plain.weight

    def __call__(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return self.plain(x)  # no autograd through oneDNN's op
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def _packed(weight: Tensor) -> Tensor:
    """`weight` packed for oneDNN, once per weight tensor."""

    def pack():
        with torch.no_grad():
            return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)

    return cached_per_tensor(_packed_weights, weight, [weight], pack)


def _pack(projection: Projection | Stacked) -> PackedLinear:
    return PackedLinear(projection, _packed(projection.weight), projection.bias, projection.weight.shape[0])


def packed_plan(plan: Plan) -> tuple[Plan, str | None]:
    """(`plan` with every layer's projections packed, None), or (`plan` unchanged, why not)."""
    problem = packing_problem(plan)
    if problem is not None:
        return plan, problem
    layers = tuple(
        dataclasses.replace(layer, qkv=_pack(layer.qkv), o=_pack(layer.o), gate_up=_pack(layer.gate_up),
                            down=_pack(layer.down))
        for layer in plan.layers
    )
    return dataclasses.replace(plan, layers=layers), None
