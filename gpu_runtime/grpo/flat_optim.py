"""AdamW and SGD over one flat buffer holding every LoRA tensor. Imports no Django.

Why: a LoRA adapter is dozens of small tensors (two per targeted projection per layer). Per-tensor
optimizer, norm and zeroing kernels then cost more in call overhead than in arithmetic. Here the
trainable tensors become views into one flat value buffer and their gradients views into one flat
gradient buffer (the layout DDP's `gradient_as_bucket_view` uses), so the gradient norm, zeroing
and the whole update are a few kernels over one tensor each. The peft modules keep their own
Parameter objects, so saving, loading, EMA swaps and the forward see nothing different; autograd
accumulates into the gradient views in place.

The maths is torch.optim.AdamW's (decoupled weight decay, bias-corrected moments) and plain SGD,
and `state_dict()` / `load_state_dict()` use torch's per-parameter layout (`step`, `exp_avg`,
`exp_avg_sq` per parameter index), so checkpoints read the same either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["FlatAdamW", "FlatParameters", "FlatSGD", "flat_layout_supported"]


def flat_layout_supported(params: Sequence[Tensor]) -> bool:
    """One dtype and one device for every tensor (a flat buffer cannot mix them)."""
    return bool(params) and len({(p.dtype, p.device) for p in params}) == 1 and params[0].is_floating_point()


class FlatParameters:
    """Re-home `params` (values and gradients) into two contiguous buffers, keeping their values."""

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        if not flat_layout_supported(params):
            raise ValueError("flat buffers need floating tensors of one dtype on one device")
        self.params = list(params)
        total = sum(p.numel() for p in self.params)
        first = self.params[0]
        self.values = torch.empty(total, dtype=first.dtype, device=first.device)
        self.grads = torch.zeros(total, dtype=first.dtype, device=first.device)
        self.slices: list[tuple[int, int]] = []
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                view = self.values[offset : offset + n].view_as(p)
                view.copy_(p.detach())
                p.data = view
                p.grad = self.grads[offset : offset + n].view_as(p)
                self.slices.append((offset, n))
                offset += n

    def zero_grad(self) -> None:
        self.grads.zero_()

    def grad_norm(self) -> float:
        return float(torch.linalg.vector_norm(self.grads))

    def split(self, flat: Tensor) -> list[Tensor]:
        """Per-parameter views of a buffer laid out like `values`."""
        return [flat[o : o + n].view_as(p) for (o, n), p in zip(self.slices, self.params, strict=True)]


class _FlatOptimizer:
    defaults: dict

    def __init__(self, flat: FlatParameters, defaults: dict):
        self.flat = flat
        self.defaults = dict(defaults)
        self.param_groups = [dict(self.defaults, params=flat.params)]
        self.step_count = 0

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - the views must stay
        self.flat.zero_grad()

    def grad_norm(self) -> float:
        return self.flat.grad_norm()

    @property
    def lr(self) -> float:
        return self.param_groups[0]["lr"]

    def _group_state_dict(self) -> list[dict]:
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return [dict(group, params=list(range(len(self.flat.params))))]

    def _load_groups(self, state_dict: dict) -> None:
        groups = state_dict.get("param_groups", [])
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.flat.params):
            raise ValueError("the optimizer state does not match this adapter's tensors")
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})


class FlatAdamW(_FlatOptimizer):
    def __init__(self, flat: FlatParameters, *, lr: float, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(
            flat,
            {
                "lr": lr,
                "betas": tuple(betas),
                "eps": eps,
                "weight_decay": weight_decay,
                "amsgrad": False,
                "maximize": False,
            },
        )
        self.exp_avg = torch.zeros_like(flat.values)
        self.exp_avg_sq = torch.zeros_like(flat.values)

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        values, grads = self.flat.values, self.flat.grads
        self.step_count += 1
        fused = getattr(torch, "_fused_adamw_", None)  # torch.optim.AdamW(fused=True)'s kernel
        if fused is not None and values.device.type in ("cpu", "cuda"):
            steps = torch.tensor(float(self.step_count), device=values.device)
            fused(
                [values],
                [grads],
                [self.exp_avg],
                [self.exp_avg_sq],
                [],
                [steps],
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                weight_decay=decay,
                eps=eps,
                amsgrad=False,
                maximize=False,
            )
            return
        if decay:
            values.mul_(1.0 - lr * decay)
        self.exp_avg.lerp_(grads, 1.0 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1.0 - beta2)
        step_size = lr / (1.0 - beta1**self.step_count)
        bias_correction2_sqrt = math.sqrt(1.0 - beta2**self.step_count)
        denominator = (self.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        values.addcdiv_(self.exp_avg, denominator, value=-step_size)

    def state_dict(self) -> dict:
        if self.step_count == 0:
            return {"state": {}, "param_groups": self._group_state_dict()}
        step = torch.tensor(float(self.step_count))
        averages = self.flat.split(self.exp_avg)
        squares = self.flat.split(self.exp_avg_sq)
        state = {
            i: {"step": step.clone(), "exp_avg": averages[i].clone(), "exp_avg_sq": squares[i].clone()}
            for i in range(len(self.flat.params))
        }
        return {"state": state, "param_groups": self._group_state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        self._load_groups(state_dict)
        state = state_dict.get("state", {})
        if not state:
            self.step_count = 0
            self.exp_avg.zero_()
            self.exp_avg_sq.zero_()
            return
        steps = {int(entry["step"]) for entry in state.values()}
        if len(state) != len(self.flat.params) or len(steps) != 1:
            raise ValueError("the AdamW state must cover every tensor at one step")
        for i, (average, square) in enumerate(
            zip(self.flat.split(self.exp_avg), self.flat.split(self.exp_avg_sq), strict=True)
        ):
            average.copy_(state[i]["exp_avg"])
            square.copy_(state[i]["exp_avg_sq"])
        self.step_count = steps.pop()


class FlatSGD(_FlatOptimizer):
    def __init__(self, flat: FlatParameters, *, lr: float):
        super().__init__(flat, {"lr": lr, "momentum": 0, "dampening": 0, "weight_decay": 0, "nesterov": False})

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        self.flat.values.add_(self.flat.grads, alpha=-self.param_groups[0]["lr"])

    def state_dict(self) -> dict:
        return {"state": {}, "param_groups": self._group_state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self._load_groups(state_dict)
