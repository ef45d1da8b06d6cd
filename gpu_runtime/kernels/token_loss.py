"""Fused GRPO token loss: one forward and one backward kernel for the per-token core of
`gpu_runtime.grpo.losses.grpo_loss`. Imports torch (triton lazily); no Django.

Per completion row b (one program each, looping over its tokens):
- log-ratio d_t = log pi_theta - log pi_b (recorded) or 0 with gradient 1 (no importance correction);
- surrogate: token PPO with asymmetric clipping, GSPO's sequence ratio, or CISPO's capped weight;
- KL against the reference: k1 = d, k3 = exp(-d) - 1 + d (d = log pi_theta - log pi_ref), times
  kl_coeff on the entropy-KL mask (computed by the caller: it needs a per-row sort);
- sums divided by the aggregation's denominator (total action tokens for token_level, the row's
  own for per_sample), giving the (B,) policy and KL parts the caller weights and adds.
It also writes, per row, the figures of the policy audit (token count, ratio sum/min/max, clip
counts, KL sums), accumulated in float64. The backward kernel recomputes the same values and
writes d loss / d log pi_theta; positions outside the action mask get exactly 0. The torch
implementation in `losses.py` is the oracle; they agree up to float32 summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpu_runtime.kernels.triton_support import next_power_of_2

__all__ = ["STAT_FIELDS", "TokenLossSettings", "token_loss_parts"]

LEVELS = {"token": 0, "sequence": 1, "cispo": 2}
KL_KINDS = {"none": 0, "k1": 1, "k3": 2}
# Columns of the per-row statistics the kernel writes (float64).
STAT_FIELDS = (
    "tokens", "surrogate_sum", "kl_penalty_sum", "ratio_sum", "ratio_min", "ratio_max",
    "below", "above", "clipped", "kl_log_ratio_sum", "kl_estimator_sum", "kl_masked_estimator_sum",
    "kl_masked_tokens",
)


@dataclass(frozen=True)
class TokenLossSettings:
    is_level: str
    eps_low: float
    eps_high: float
    cispo_max_weight: float
    recorded: bool
    kl_estimator: str
    kl_coeff: float
    kl_penalty: bool  # the KL term reaches the loss
    aggregation: str  # token_level | per_sample


def _kernels():
    from gpu_runtime.kernels import token_loss_triton as k

    return k.forward, k.backward


def _flags(settings: TokenLossSettings, has_ref: bool) -> dict:
    return dict(
        LEVEL=LEVELS[settings.is_level],
        RECORDED=settings.recorded,
        HAS_REF=has_ref,
        KL_KIND=KL_KINDS[settings.kl_estimator],
        KL_PENALTY=settings.kl_penalty and has_ref,
    )


def _scalars(settings: TokenLossSettings) -> tuple[float, float, float, float]:
    return (1.0 - settings.eps_low, 1.0 + settings.eps_high, float(settings.cispo_max_weight),
            float(settings.kl_coeff))


class _TokenLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, policy, mask, advantages, behavior, reference, kl_mask, denominators, settings):
        forward_kernel, _ = _kernels()
        rows, width = policy.shape
        has_ref = reference is not None
        stats = torch.empty((rows, len(STAT_FIELDS)), dtype=torch.float64, device=policy.device)
        block = min(1024, next_power_of_2(max(width, 16)))
        forward_kernel[(rows,)](
            policy, behavior if behavior is not None else policy, reference if has_ref else policy, mask,
            kl_mask if has_ref else mask, advantages, stats, width, *_scalars(settings),
            **_flags(settings, has_ref), BLOCK=block,
        )
        policy_part = stats[:, 1].to(policy.dtype) / denominators
        kl_part = stats[:, 2].to(policy.dtype) / denominators
        ctx.save_for_backward(policy, mask, advantages, behavior, reference, kl_mask, denominators)
        ctx.settings, ctx.block = settings, block
        ctx.mark_non_differentiable(stats)
        return policy_part, kl_part, stats

    @staticmethod
    def backward(ctx, g_policy, g_kl, _g_stats):
        _, backward_kernel = _kernels()
        policy, mask, advantages, behavior, reference, kl_mask, denominators = ctx.saved_tensors
        zeros = torch.zeros_like(denominators)
        coeff_policy = (zeros if g_policy is None else g_policy) / denominators
        coeff_kl = (zeros if g_kl is None else g_kl) / denominators
        grad = torch.empty_like(policy)
        has_ref = reference is not None
        backward_kernel[(policy.shape[0],)](
            policy, behavior if behavior is not None else policy, reference if has_ref else policy, mask,
            kl_mask if has_ref else mask, advantages, coeff_policy.contiguous(), coeff_kl.contiguous(), grad,
            policy.shape[1], *_scalars(ctx.settings), **_flags(ctx.settings, has_ref), BLOCK=ctx.block,
        )
        return grad, None, None, None, None, None, None, None


def token_loss_parts(
    policy: Tensor,
    mask: Tensor,
    advantages: Tensor,
    settings: TokenLossSettings,
    *,
    behavior: Tensor | None = None,
    reference: Tensor | None = None,
    kl_mask: Tensor | None = None,
    token_total: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(policy part (B,), KL part (B,), per-row stats (B, len(STAT_FIELDS)) float64).

    `policy` (B, T) float32 carries the gradient; `mask` and `kl_mask` are bool (B, T);
    `behavior` is required when `settings.recorded`, `reference` for any KL figure; `token_total`
    is token_level's divisor when this batch is one micro-batch of a step (default: its own tokens)."""
    if settings.recorded and behavior is None:
        raise ValueError("recorded behavior policy needs behavior log-probs")
    mask = mask.bool()
    if settings.aggregation == "token_level":
        total = mask.sum() if token_total is None else torch.tensor(token_total, device=mask.device)
        denominators = total.clamp(min=1).to(policy.dtype).expand(mask.shape[0]).contiguous()
    elif settings.aggregation == "per_sample":
        denominators = mask.sum(dim=1).clamp(min=1).to(policy.dtype)
    else:
        raise ValueError(f"unknown loss_aggregation {settings.aggregation!r}")

    def prepared(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.detach().to(torch.float32).contiguous()

    return _TokenLoss.apply(
        policy.contiguous(),
        mask.contiguous(),
        advantages.detach().to(torch.float32).contiguous(),
        prepared(behavior) if settings.recorded else None,
        prepared(reference),
        None if reference is None else (mask if kl_mask is None else kl_mask.bool()).contiguous(),
        denominators,
        settings,
    )
