"""The CPU sampler's projections over oneDNN-packed weights (`gpu_runtime.onednn_linear`). Imports no Django.

A lean plan already packs its q|k|v and gate|up stacks where packing pays (`lean_plan`, shared
with the trainer, whose forward runs them too). For decoding, the sampler packs every matmul of
its plans: the stacks of small models too (whose plain stacks stay for training), the o and down
projections, which training runs plainly over the model's own weights (at a training batch's
hundreds of rows sgemm is as fast, and the copy would only cost memory there), and the LM head.
Why: speed (a decode step's few rows ran o and down 2-2.5x faster packed) and batch invariance
(a row's product over a packed weight is bitwise the same whatever rows share the call, which
sgemm's is not: `onednn_linear`), with which `lean_decoder.forward(starts=...)` gives each row the
hidden states, and so the logits and seeded tokens, it has alone. On small models (the 1.2 M-parameter
tiny one) that costs speed instead, about 0.4-0.6 ms a decode step (docs/performance.md). The copies:
o, down and the head once more (on the 25.7 M-parameter model, 35 MB and the head's vocab x hidden).
They must have no live LoRA terms (the sampler's merged plans).
`packed_plan(plan)` returns (a `PackedPlan`, None) or (plan unchanged, reason).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import Tensor

from gpu_runtime import lean_decoder, onednn_linear
from gpu_runtime.lean_plan import Plan, Projection, Stacked, cached_per_tensor

__all__ = ["PackedLinear", "PackedPlan", "lm_logits", "packed_plan", "packing_problem"]

# Packed weights per weight tensor (`lean_plan.cached_per_tensor`), so the plans the sampler rebuilds
# after adapter changes reuse the base model's packed weights.
_packed_weights: dict[int, tuple] = {}


def packing_problem(plan: Plan) -> str | None:
    """Why `plan`'s matmuls cannot all run packed (so rows are independent of their batch only up
    to float rounding), or None when they can."""
    stacks = [stack for layer in plan.layers for stack in (layer.qkv, layer.gate_up)]
    weights = [part.weight for stack in stacks for part in stack.parts]
    weights += [p.weight for layer in plan.layers for p in (layer.o, layer.down)] + [plan.lm_head]
    problem = onednn_linear.packing_problem(weights, stacked=all(stack.fused for stack in stacks), min_elements=0)
    if problem is not None:
        return problem
    projections = [part for stack in stacks for part in stack.parts]
    projections += [p for layer in plan.layers for p in (layer.o, layer.down)]
    if any(projection.loras for projection in projections):
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


@dataclass(frozen=True)
class PackedPlan(Plan):
    """A plan whose every matmul runs over packed weights, the LM head (`head`) included."""

    head: PackedLinear | None = None


def _packed(weight: Tensor) -> Tensor:
    if weight.is_inference():  # an adapter's merged weight, made for this plan alone: nothing to share
        return onednn_linear.pack(weight)
    return cached_per_tensor(_packed_weights, weight, [weight], lambda: onednn_linear.pack(weight))


def _pack(projection: Projection) -> PackedLinear:
    return PackedLinear(projection, _packed(projection.weight))


def _packed_stack(stack: Stacked) -> Stacked:
    """`stack` over a packed copy of its plain stacked weight (a small model's; kept for training)."""
    if stack.packed is not None:
        return stack
    return dataclasses.replace(stack, weight=None, packed=_packed(stack.weight))


def packed_plan(plan: Plan) -> tuple[Plan, str | None]:
    """(`plan` with every matmul packed, None), or (`plan` unchanged, why not)."""
    problem = packing_problem(plan)
    if problem is not None:
        return plan, problem
    layers = tuple(
        dataclasses.replace(layer, qkv=_packed_stack(layer.qkv), gate_up=_packed_stack(layer.gate_up),
                            o=_pack(layer.o), down=_pack(layer.down))
        for layer in plan.layers
    )
    fields = {field.name: getattr(plan, field.name) for field in dataclasses.fields(Plan)}
    head = _pack(Projection(plan.lm_head, plan.lm_head_bias, ()))
    return PackedPlan(**dict(fields, layers=layers), head=head), None


def lm_logits(plan: Plan, hidden: Tensor) -> Tensor:
    """`lean_decoder.lm_logits`, over the packed head where `plan` has one."""
    if isinstance(plan, PackedPlan):
        return plan.head(lean_decoder.rms_norm(hidden, plan.final_norm, plan.eps))
    return lean_decoder.lm_logits(plan, hidden)
