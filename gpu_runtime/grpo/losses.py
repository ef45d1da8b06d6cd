"""The GRPO per-step loss (spec §3.1 steps 3-6): surrogates, KL, aggregation and ECHO.

Imports torch only (no Django, no transformers). Every input is a dense (B, T) tensor laid out
by sequence position: `policy_logprobs[b, t]` is log pi_theta(x_t | x_<t) of the realised token
(see `reference.token_logprobs`), and the masks select which positions each term uses.

`grpo_loss(batch, config)` is what the trainer calls, once per optimizer step: with the whole
group for `token_level`, with one completion (B=1) per step for `per_sample`. It returns the
scalar loss and a stats dict whose figures feed the receipt and `audit.PolicyAuditAccumulator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "GrpoBatch",
    "aggregate",
    "cispo_surrogate",
    "echo_terms",
    "entropy_kl_mask",
    "grpo_loss",
    "gspo_surrogate",
    "importance_log_ratio",
    "kl_estimate",
    "merge_step_stats",
    "token_surrogate",
]


@dataclass
class GrpoBatch:
    """One step's tensors. B completions of one group, padded to T positions."""

    policy_logprobs: Tensor  # (B, T), differentiable; valid at action and env positions
    action_mask: Tensor  # (B, T) bool: tokens that get the policy gradient
    advantages: Tensor  # (B,) A_i, constant across the completion's tokens
    behavior_logprobs: Tensor | None = None  # (B, T) recorded log pi_b; needed for `recorded`
    reference_logprobs: Tensor | None = None  # (B, T) log pi_ref; needed when KL is enabled
    env_mask: Tensor | None = None  # (B, T) bool: observation tokens ECHO trains on
    observation_lengths: Tensor | None = None  # (B,) |O|: observation tokens before warning trim
    # token_level's divisor when this batch is one micro-batch of a step: the action tokens of the
    # whole step (None: this batch's own), so micro-batch losses and gradients add up to the step's.
    token_total: int | None = None


def _only(values: Tensor | None, mask: Tensor) -> Tensor | None:
    """values where mask, else 0 (where(), not a multiply: 0 * inf would be NaN)."""
    if values is None:
        return None
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def importance_log_ratio(policy: Tensor, behavior: Tensor | None, mask: Tensor) -> Tensor:
    """d_t = log pi_theta - log pi_b (0 outside the mask).

    Without a behavior policy (`no_importance_correction`) d_t = logp - logp.detach(): exactly 0
    by value, so the ratio is exactly 1, but its gradient is d(logp), keeping the surrogate's
    gradient the plain policy gradient.
    """
    denominator = policy.detach() if behavior is None else behavior.detach().to(policy.dtype)
    return _only(policy - denominator, mask)


def _clipped_objective(ratio: Tensor, adv: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """-min(r*A, clip(r, low, high)*A) and the 'unclipped' flag (where r keeps its gradient).

    Written with where() rather than torch.minimum so the gradient is exact at ties: the min picks
    r*A when A >= 0 and r <= high, or A < 0 and r >= low; otherwise the clipped constant wins.
    """
    unclipped = torch.where(adv >= 0, ratio <= high, ratio >= low)
    clipped_value = ratio.detach().clamp(low, high) * adv
    return -torch.where(unclipped, ratio * adv, clipped_value), unclipped


def token_surrogate(log_ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float):
    """Per-token PPO: L_t = -min(r_t*A, clip(r_t, 1-eps_low, 1+eps_high)*A); clipped tokens get no
    gradient. Returns (per_token_loss (B,T), ratio (B,T), unclipped (B,T))."""
    ratio = torch.exp(log_ratio)
    loss, unclipped = _clipped_objective(ratio, advantages[:, None], 1.0 - eps_low, 1.0 + eps_high)
    return _only(loss, mask), ratio, unclipped & mask


def gspo_surrogate(log_ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float):
    """GSPO: s = exp(mean_t d_t) = (pi_theta/pi_b)^(1/|y|); L = -min(s*A, clip(s)*A), broadcast to
    every action token (so the per-token gradient coefficient is s*A/|y| under a per-sample mean).
    Returns (per_token_loss (B,T), seq_ratio (B,), unclipped (B,))."""
    lengths = mask.sum(dim=1)
    mean_log_ratio = log_ratio.sum(dim=1) / lengths.clamp(min=1).to(log_ratio.dtype)
    seq_ratio = torch.exp(mean_log_ratio)
    seq_loss, unclipped = _clipped_objective(seq_ratio, advantages, 1.0 - eps_low, 1.0 + eps_high)
    return _only(seq_loss[:, None].expand_as(log_ratio), mask), seq_ratio, unclipped & (lengths > 0)


def cispo_surrogate(log_ratio: Tensor, policy: Tensor, advantages: Tensor, mask: Tensor, max_weight: float):
    """CISPO: L_t = -stopgrad(min(r_t, max_weight)) * A * log pi_theta(t). Every token keeps a
    gradient; the weight is only capped above (no lower floor). Returns (loss (B,T), ratio)."""
    ratio = torch.exp(log_ratio)
    weight = ratio.detach().clamp(max=max_weight)
    return _only(-(weight * advantages[:, None] * policy), mask), ratio


def kl_estimate(policy: Tensor, reference: Tensor, estimator: str) -> Tensor:
    """Per-token KL against the reference, before kl_coeff. With d = log pi_theta - log pi_ref:
    k1 = d; k3 = exp(-d) - 1 + d (>= 0); none = 0."""
    d = policy - reference.detach().to(policy.dtype)
    if estimator == "k1":
        return d
    if estimator == "k3":
        return torch.exp(-d) - 1.0 + d
    if estimator == "none":
        return torch.zeros_like(d)
    raise ValueError(f"unknown kl_estimator {estimator!r}")


def entropy_kl_mask(policy: Tensor, mask: Tensor, quantile: float | None) -> Tensor:
    """Which action tokens get the KL term. With q set, per completion: tokens whose -log pi_theta
    is at or above the q-quantile of that completion's action tokens (nearest rank
    round(q*(n-1)) of the ascending values; q=0 keeps all, q=1 keeps the maximum)."""
    if quantile is None:
        return mask.clone()
    surprise = -policy.detach()
    keep = torch.zeros_like(mask)
    for row in range(mask.shape[0]):
        values = surprise[row][mask[row]]
        if values.numel() == 0:
            continue
        rank = min(int(math.floor(quantile * (values.numel() - 1) + 0.5)), values.numel() - 1)
        threshold = torch.sort(values).values[rank]
        keep[row] = mask[row] & (surprise[row] >= threshold)
    return keep


def aggregate(per_token: Tensor, mask: Tensor, mode: str, token_total: int | None = None) -> Tensor:
    """Per-completion contributions (B,) of a per-token loss.

    token_level (DAPO): sum over every active token of the batch / total active tokens (of the
    whole step, `token_total`, when the batch is one micro-batch of it); the contributions sum to
    the batch loss. per_sample: the mean over each completion's tokens.
    """
    sums = _only(per_token, mask).sum(dim=1)
    if mode == "token_level":
        return sums / max(int(mask.sum()) if token_total is None else token_total, 1)
    if mode == "per_sample":
        return sums / mask.sum(dim=1).clamp(min=1).to(per_token.dtype)
    raise ValueError(f"unknown loss_aggregation {mode!r}")


def echo_terms(policy: Tensor, env_mask: Tensor, observation_lengths: Tensor, lam: float):
    """ECHO per completion: lam * (sum of CE over env-mask tokens) / |O|, where CE = -log pi_theta
    and |O| is the full observation length before warning trimming. Returns (terms (B,), the CE
    sums (B,), contributing (B,) bool)."""
    ce_sum = _only(-policy, env_mask).sum(dim=1)
    lengths = observation_lengths.to(device=policy.device, dtype=policy.dtype)
    contributing = (env_mask.sum(dim=1) > 0) & (lengths > 0)
    terms = torch.where(contributing, lam * ce_sum / lengths.clamp(min=1), torch.zeros_like(ce_sum))
    return terms, ce_sum, contributing


def _on_policy_device(batch: GrpoBatch) -> GrpoBatch:
    """Every tensor on the policy's device, masks as bool (callers may build masks on the CPU)."""
    device = batch.policy_logprobs.device

    def move(tensor: Tensor | None) -> Tensor | None:
        return None if tensor is None else tensor.to(device)

    env_mask = move(batch.env_mask)
    return GrpoBatch(
        policy_logprobs=batch.policy_logprobs,
        action_mask=move(batch.action_mask).bool(),
        advantages=move(batch.advantages),
        behavior_logprobs=move(batch.behavior_logprobs),
        reference_logprobs=move(batch.reference_logprobs),
        env_mask=None if env_mask is None else env_mask.bool(),
        observation_lengths=move(batch.observation_lengths),
        token_total=batch.token_total,
    )


def _check_batch(batch: GrpoBatch, config) -> None:
    shape = batch.policy_logprobs.shape
    if batch.policy_logprobs.dim() != 2:
        raise ValueError(f"policy_logprobs must be (B, T), got {tuple(shape)}")
    for name in ("action_mask", "behavior_logprobs", "reference_logprobs", "env_mask"):
        value = getattr(batch, name)
        if value is not None and value.shape != shape:
            raise ValueError(f"{name} shape {tuple(value.shape)} differs from policy_logprobs {tuple(shape)}")
    for name in ("advantages", "observation_lengths"):
        value = getattr(batch, name)
        if value is not None and value.shape != (shape[0],):
            raise ValueError(f"{name} must have shape ({shape[0]},), got {tuple(value.shape)}")
    if not torch.isfinite(batch.advantages).all():
        raise ValueError("advantages must be finite")
    mask = batch.action_mask.bool()
    if config.behavior_policy == "recorded":
        if batch.behavior_logprobs is None:
            raise ValueError("behavior_policy=recorded needs behavior_logprobs")
        if not torch.isfinite(batch.behavior_logprobs[mask]).all():
            raise ValueError("behavior_logprobs must be finite at every action token")
    if config.kl_term_active and batch.reference_logprobs is None:
        raise ValueError("KL is enabled, so reference_logprobs is required")
    if batch.reference_logprobs is not None and not torch.isfinite(batch.reference_logprobs[mask]).all():
        raise ValueError("reference_logprobs must be finite at every action token")
    if batch.env_mask is not None:
        if (mask & batch.env_mask.bool()).any():
            raise ValueError("action_mask and env_mask overlap")
        if config.loss.echo_enabled and batch.env_mask.any() and batch.observation_lengths is None:
            raise ValueError("ECHO needs observation_lengths (|O| per completion)")


def _policy_and_kl(
    policy, log_ratio, mask, adv, reference, config, stats: dict, token_total: int | None = None
) -> tuple[Tensor, Tensor]:
    """The (B,) policy and KL parts of the loss (torch path); fills the surrogate and KL stats."""
    eps_low, eps_high = config.clip_bounds
    if config.is_level == "token":
        surrogate, ratio, unclipped = token_surrogate(log_ratio, adv, mask, eps_low, eps_high)
        observed, lower, upper = ratio[mask], 1.0 - eps_low, 1.0 + eps_high
        stats["surrogate_clipped_count"] = int((mask & ~unclipped).sum())
    elif config.is_level == "sequence":
        surrogate, seq_ratio, unclipped = gspo_surrogate(log_ratio, adv, mask, eps_low, eps_high)
        has_tokens = mask.sum(dim=1) > 0
        observed, lower, upper = seq_ratio[has_tokens], 1.0 - eps_low, 1.0 + eps_high
        stats["surrogate_clipped_count"] = int((has_tokens & ~unclipped).sum())
    elif config.is_level == "cispo":
        surrogate, ratio = cispo_surrogate(log_ratio, policy, adv, mask, config.cispo_max_weight)
        observed, lower, upper = ratio[mask], None, config.cispo_max_weight
        stats["surrogate_clipped_count"] = int((ratio[mask] > upper).sum())
    else:
        raise ValueError(f"unknown is_level {config.is_level!r}")
    stats.update(_ratio_stats(observed.detach().double(), lower, upper, config.is_level))
    stats["action_tokens"] = int(mask.sum())

    kl_tokens = torch.zeros_like(policy)
    if reference is not None:
        kl = kl_estimate(policy, reference, config.kl_estimator)
        kl_mask = entropy_kl_mask(
            policy, mask, config.entropy_aware_kl_quantile if config.kl_penalty_enabled else None
        )
        stats.update(_kl_stats(policy, reference, kl, mask, kl_mask))
        if config.kl_penalty_enabled:
            kl_tokens = _only(config.kl_coeff * kl, kl_mask)
    else:
        stats.update(_kl_stats(None, None, None, mask, mask))

    zero = torch.zeros(mask.shape[0], dtype=policy.dtype, device=policy.device)
    if config.loss.no_policy_loss:
        policy_part, kl_part = zero, zero
    else:
        policy_part = aggregate(surrogate, mask, config.loss_aggregation, token_total)
        kl_part = aggregate(kl_tokens, mask, config.loss_aggregation, token_total)
    return policy_part, kl_part


def grpo_loss(batch: GrpoBatch, config, *, kernels=None) -> tuple[Tensor, dict]:
    """The scalar loss for one optimizer step and its stats (plain Python numbers).

    loss = aggregate(surrogate + kl_coeff * KL * entropy_mask) + ECHO, where under token_level the
    per-completion ECHO terms add up (as the per-completion gradients accumulate into one step),
    and under per_sample the loss is the mean over completions with a term (B=1 in training).
    `no_policy_loss` drops the surrogate and the KL term; ECHO alone remains.
    """
    batch = _on_policy_device(batch)
    _check_batch(batch, config)
    policy = batch.policy_logprobs
    if policy.dtype not in (torch.float32, torch.float64):
        policy = policy.float()  # the ratio and clipping maths need at least fp32
    mask = batch.action_mask.bool()
    env_mask = None if batch.env_mask is None else batch.env_mask.bool()
    # Zero every position no term reads, so padding values (e.g. -inf) can never leak NaN into the
    # loss or, through a where() backward, into the gradient.
    active = mask if env_mask is None else mask | env_mask
    policy = _only(policy, active)
    behavior = _only(batch.behavior_logprobs, mask)
    reference = _only(batch.reference_logprobs, mask)
    adv = batch.advantages.detach().to(device=policy.device, dtype=policy.dtype)
    recorded = config.behavior_policy == "recorded"
    log_ratio = importance_log_ratio(policy, behavior if recorded else None, mask)

    stats: dict = {"is_level": config.is_level, "completions": int(mask.shape[0])}
    if kernels is not None and kernels.triton and policy.dtype == torch.float32:
        # The fused kernel (gpu_runtime.kernels.token_loss); this function's torch maths is its oracle.
        from gpu_runtime.grpo.fused_loss import fused_policy_and_kl

        policy_part, kl_part = fused_policy_and_kl(
            policy, mask, adv, behavior, reference, config, stats, token_total=batch.token_total
        )
    else:
        policy_part, kl_part = _policy_and_kl(
            policy, log_ratio, mask, adv, reference, config, stats, batch.token_total
        )
    zero = torch.zeros(mask.shape[0], dtype=policy.dtype, device=policy.device)
    participating = mask.any(dim=1) & (not config.loss.no_policy_loss)

    echo_part = zero
    env_tokens = 0 if env_mask is None else int(env_mask.sum())
    stats.update(env_tokens=env_tokens, echo_contributed=False, echo_env_ce=None, observation_tokens=0)
    if env_mask is not None and config.loss.echo_enabled and env_tokens:
        lengths = batch.observation_lengths
        echo_part, ce_sum, contributing = echo_terms(policy, env_mask, lengths, config.loss.echo_lambda)
        participating = participating | contributing
        obs = lengths[contributing].sum().item()
        stats.update(
            echo_contributed=bool(contributing.any()),
            observation_tokens=int(obs),
            echo_env_ce=(ce_sum[contributing].sum().item() / obs) if obs else None,
        )

    per_completion = policy_part + kl_part + echo_part
    if config.loss_aggregation == "token_level":
        weights = torch.ones_like(per_completion)
    else:
        weights = participating.to(policy.dtype) / max(int(participating.sum()), 1)
    loss = (per_completion * weights).sum()
    stats.update(
        loss=loss.item(),
        policy_loss=(policy_part * weights).sum().item(),
        kl_loss=(kl_part * weights).sum().item(),
        echo_loss=(echo_part * weights).sum().item(),
        per_completion_loss=[float(v) for v in per_completion.detach().tolist()],
    )
    return loss, stats


def _ratio_stats(observed: Tensor, lower: float | None, upper: float, is_level: str) -> dict:
    """Importance-sampling figures of `kiln.grpo-policy-audit.v1` for this step (sums included so
    the accumulator can merge steps). CISPO has no lower bound, so below_clip_count is 0."""
    n = int(observed.numel())
    below = int((observed < lower).sum()) if lower is not None else 0
    above = int((observed > upper).sum())
    return {
        "ratio_scope": "sequence" if is_level == "sequence" else "token",
        "ratio_observations": n,
        "ratio_sum": float(observed.sum()) if n else 0.0,
        "ratio_mean": float(observed.mean()) if n else None,
        "ratio_min": float(observed.min()) if n else None,
        "ratio_max": float(observed.max()) if n else None,
        "below_clip_count": below,
        "above_clip_count": above,
        "clip_low_fraction": below / n if n else None,
        "clip_high_fraction": above / n if n else None,
        "outside_clip_fraction": (below + above) / n if n else None,
    }


def _kl_stats(policy, reference, kl, mask: Tensor, kl_mask: Tensor) -> dict:
    """KL-reference figures before kl_coeff; means are over all action tokens (so the masked mean
    matches the loss contribution before kl_coeff)."""
    if reference is None:
        return {
            "kl_token_observations": 0,
            "kl_entropy_mask_applied_tokens": 0,
            "kl_log_ratio_sum": 0.0,
            "kl_estimator_sum": 0.0,
            "kl_masked_estimator_sum": 0.0,
            "kl_mean_log_ratio": None,
            "kl_mean_estimator": None,
            "kl_mean_masked_estimator": None,
        }
    n = int(mask.sum())
    log_ratio = (policy.detach() - reference.to(policy.dtype)).double()[mask]
    estimator = kl.detach().double()
    sums = {
        "kl_log_ratio_sum": float(log_ratio.sum()),
        "kl_estimator_sum": float(estimator[mask].sum()),
        "kl_masked_estimator_sum": float(estimator[kl_mask & mask].sum()),
    }
    return {
        "kl_token_observations": n,
        "kl_entropy_mask_applied_tokens": int((kl_mask & mask).sum()),
        **sums,
        "kl_mean_log_ratio": sums["kl_log_ratio_sum"] / n if n else None,
        "kl_mean_estimator": sums["kl_estimator_sum"] / n if n else None,
        "kl_mean_masked_estimator": sums["kl_masked_estimator_sum"] / n if n else None,
    }


# How `merge_step_stats` combines one step's micro-batch stats: added, the extreme kept, the same in
# every part, or recomputed from the merged sums. A key in none of these is an error, so a new stat
# cannot be dropped silently.
_ADDED = {
    "completions", "action_tokens", "surrogate_clipped_count", "ratio_observations", "ratio_sum",
    "below_clip_count", "above_clip_count", "kl_token_observations", "kl_entropy_mask_applied_tokens",
    "kl_log_ratio_sum", "kl_estimator_sum", "kl_masked_estimator_sum", "env_tokens", "observation_tokens",
    "loss", "policy_loss", "kl_loss", "echo_loss",
}
_EXTREMES = {"ratio_min": min, "ratio_max": max}
_SHARED = {"is_level", "ratio_scope"}
_DERIVED = {
    "ratio_mean", "clip_low_fraction", "clip_high_fraction", "outside_clip_fraction", "kl_mean_log_ratio",
    "kl_mean_estimator", "kl_mean_masked_estimator", "echo_env_ce", "echo_contributed", "per_completion_loss",
}


def merge_step_stats(parts: list[dict]) -> dict:
    """One optimizer step's stats from its token_level micro-batches' (each computed with the
    step's `token_total`, so losses add): the figures `grpo_loss` gives for the whole batch, up to
    float summation order."""
    unknown = set().union(*parts) - _ADDED - set(_EXTREMES) - _SHARED - _DERIVED
    if unknown:
        raise ValueError(f"merge_step_stats does not know how to merge {sorted(unknown)}")
    out: dict = {key: parts[0][key] for key in _SHARED if key in parts[0]}
    for key in _ADDED & set(parts[0]):
        out[key] = sum(part[key] for part in parts)
    for key, pick in _EXTREMES.items():
        values = [part[key] for part in parts if part.get(key) is not None]
        out[key] = pick(values) if values else None
    n = out["ratio_observations"]
    below, above = out["below_clip_count"], out["above_clip_count"]
    out.update(
        ratio_mean=out["ratio_sum"] / n if n else None,
        clip_low_fraction=below / n if n else None,
        clip_high_fraction=above / n if n else None,
        outside_clip_fraction=(below + above) / n if n else None,
    )
    kl_n = out["kl_token_observations"]
    for mean, total in (("kl_mean_log_ratio", "kl_log_ratio_sum"), ("kl_mean_estimator", "kl_estimator_sum"),
                        ("kl_mean_masked_estimator", "kl_masked_estimator_sum")):
        out[mean] = out[total] / kl_n if kl_n else None
    # echo_env_ce is a mean over the contributing completions' observation tokens.
    echoing = [part for part in parts if part["echo_contributed"]]
    observed = sum(part["observation_tokens"] for part in echoing)
    out["echo_contributed"] = bool(echoing)
    out["echo_env_ce"] = (
        sum(part["echo_env_ce"] * part["observation_tokens"] for part in echoing) / observed if observed else None
    )
    out["per_completion_loss"] = [value for part in parts for value in part["per_completion_loss"]]
    return out
