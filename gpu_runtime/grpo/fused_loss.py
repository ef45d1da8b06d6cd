"""The GRPO loss's policy and KL parts through the fused token-loss kernel. Imports torch; no Django.

`losses.grpo_loss(..., kernels=choice)` calls this when the kernel selection says Triton; the
torch maths in `losses.py` is the oracle (tests/gpu_runtime/kernels/test_token_loss.py). The
stats it writes carry the same keys and, up to float summation order, the same values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpu_runtime.grpo.losses import entropy_kl_mask
from gpu_runtime.kernels.token_loss import STAT_FIELDS, TokenLossSettings, token_loss_parts

__all__ = ["fused_policy_and_kl", "settings_for"]


def settings_for(config) -> TokenLossSettings:
    eps_low, eps_high = config.clip_bounds
    return TokenLossSettings(
        is_level=config.is_level,
        eps_low=eps_low,
        eps_high=eps_high,
        cispo_max_weight=float(config.cispo_max_weight),
        recorded=config.behavior_policy == "recorded",
        kl_estimator=config.kl_estimator,
        kl_coeff=float(config.kl_coeff),
        kl_penalty=bool(config.kl_penalty_enabled),
        aggregation=config.loss_aggregation,
    )


def fused_policy_and_kl(
    policy, mask, adv, behavior, reference, config, stats: dict, *, token_total: int | None = None
) -> tuple[Tensor, Tensor]:
    if config.is_level not in ("token", "sequence", "cispo"):
        raise ValueError(f"unknown is_level {config.is_level!r}")
    settings = settings_for(config)
    kl_mask = None
    if reference is not None:
        kl_mask = entropy_kl_mask(
            policy, mask, config.entropy_aware_kl_quantile if config.kl_penalty_enabled else None
        )
    source = policy.detach() if config.loss.no_policy_loss else policy
    policy_part, kl_part, rows = token_loss_parts(
        source, mask, adv, settings, behavior=behavior, reference=reference, kl_mask=kl_mask,
        token_total=token_total,
    )
    stats.update(_stats(rows, config, reference is not None))
    if config.loss.no_policy_loss:
        zero = torch.zeros(mask.shape[0], dtype=policy.dtype, device=policy.device)
        return zero, zero
    return policy_part, kl_part


def _stats(rows: Tensor, config, has_reference: bool) -> dict:
    """The figures `losses._ratio_stats` and `losses._kl_stats` give, from the kernel's row sums."""
    col = {name: rows[:, i] for i, name in enumerate(STAT_FIELDS)}
    tokens = col["tokens"]
    has_tokens = tokens > 0
    n_tokens = int(tokens.sum())
    n = int(has_tokens.sum()) if config.is_level == "sequence" else n_tokens
    below, above = int(col["below"].sum()), int(col["above"].sum())
    out: dict = {
        "surrogate_clipped_count": int(col["clipped"].sum()),
        "ratio_scope": "sequence" if config.is_level == "sequence" else "token",
        "ratio_observations": n,
        "ratio_sum": float(col["ratio_sum"].sum()) if n else 0.0,
        "ratio_mean": float(col["ratio_sum"].sum()) / n if n else None,
        "ratio_min": float(col["ratio_min"][has_tokens].min()) if n else None,
        "ratio_max": float(col["ratio_max"][has_tokens].max()) if n else None,
        "below_clip_count": below,
        "above_clip_count": above,
        "clip_low_fraction": below / n if n else None,
        "clip_high_fraction": above / n if n else None,
        "outside_clip_fraction": (below + above) / n if n else None,
        "action_tokens": n_tokens,
    }
    if not has_reference:
        out.update(
            kl_token_observations=0, kl_entropy_mask_applied_tokens=0, kl_log_ratio_sum=0.0,
            kl_estimator_sum=0.0, kl_masked_estimator_sum=0.0, kl_mean_log_ratio=None,
            kl_mean_estimator=None, kl_mean_masked_estimator=None,
        )
        return out
    sums = {
        "kl_log_ratio_sum": float(col["kl_log_ratio_sum"].sum()),
        "kl_estimator_sum": float(col["kl_estimator_sum"].sum()),
        "kl_masked_estimator_sum": float(col["kl_masked_estimator_sum"].sum()),
    }
    out.update(
        kl_token_observations=n_tokens,
        kl_entropy_mask_applied_tokens=int(col["kl_masked_tokens"].sum()),
        **sums,
        kl_mean_log_ratio=sums["kl_log_ratio_sum"] / n_tokens if n_tokens else None,
        kl_mean_estimator=sums["kl_estimator_sum"] / n_tokens if n_tokens else None,
        kl_mean_masked_estimator=sums["kl_masked_estimator_sum"] / n_tokens if n_tokens else None,
    )
    return out
