"""The CPU sampler's projections over oneDNN-packed weights (`gpu_runtime.onednn_linear`). Imports no Django.

A lean plan already packs its q|k|v and gate|up stacks where packing applies (`lean_plan`, shared
with the trainer, whose forward runs them too). For decoding, the sampler also packs the o and
down projections, which training runs plainly over the model's own weights (at a training batch's
hundreds of rows sgemm is as fast, and the copy would only cost memory there): a decode step's few
rows ran them 2-2.5x faster packed. That is one more copy of those two projections (on the
25.7 M-parameter model, 35 MB). They must have no live LoRA terms (the sampler's merged plans).
`packed_plan(plan)` returns (plan, None) packed or (plan unchanged, reason).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import Tensor

from gpu_runtime import onednn_linear
from gpu_runtime.lean_plan import Plan, Projection, cached_per_tensor

__all__ = ["PackedLinear", "packed_plan", "packing_problem"]

# Packed weights per weight tensor (`lean_plan.cached_per_tensor`), so the plans the sampler rebuilds
# after adapter changes reuse the base model's packed weights.
_packed_weights: dict[int, tuple] = {}


def packing_problem(plan: Plan) -> str | None:
    """Why `plan`'s projections are not all packed, or None when they are packable."""
    if plan.packing_problem is not None:
        return plan.packing_problem
    if any(layer.o.loras or layer.down.loras for layer in plan.layers):
        return "LoRA terms are not folded into the weights"
    return None


@dataclass(frozen=True)
class PackedLinear:
    """`plain` (a Projection without LoRA terms) with its weight packed for oneDNN."""

    plain: Projection
    packed: Tensor

    @property
    def weight(self) -> Tensor:
        return self.plain.weight

    def __call__(self, x: Tensor) -> Tensor:
        return onednn_linear.linear(x, self.packed, self.plain.bias, (self.plain.weight,))


def _pack(projection: Projection) -> PackedLinear:
    weight = projection.weight
    return PackedLinear(projection, cached_per_tensor(_packed_weights, weight, [weight],
                                                      lambda: onednn_linear.pack(weight)))


def packed_plan(plan: Plan) -> tuple[Plan, str | None]:
    """(`plan` with its o and down projections packed too, None), or (`plan` unchanged, why not)."""
    problem = packing_problem(plan)
    if problem is not None:
        return plan, problem
    layers = tuple(dataclasses.replace(layer, o=_pack(layer.o), down=_pack(layer.down)) for layer in plan.layers)
    return dataclasses.replace(plan, layers=layers), None
