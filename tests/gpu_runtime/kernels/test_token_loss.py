"""Fused GRPO token loss (Triton, interpreted) against `grpo_loss`'s torch maths, the oracle.

Three completions over 37 positions (the kernel's block is 64, so one partial block), one of
them with a single action token and one with none; padding holds -inf (policy) and NaN
(reference) where no term reads. Loss, per-completion loss and gradient agree to 1e-6
(float32 summation order); counts are equal; the audit's float figures agree to 1e-6 relative.
"""

from __future__ import annotations

import math

import pytest
import torch

from core.contracts.grpo_config import GrpoConfig
from gpu_runtime.grpo.losses import GrpoBatch, grpo_loss

B, T = 4, 37


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[:, 0] = False
    mask[2] = False
    mask[2, 5] = True  # one action token
    mask[3] = False  # none: no ratio observation, no loss term
    policy = -torch.rand(B, T, generator=g) * 3
    behavior = policy + torch.randn(B, T, generator=g) * 0.3
    reference = policy + torch.randn(B, T, generator=g) * 0.3
    policy[~mask] = -math.inf
    reference[~mask] = math.nan
    advantages = torch.tensor([1.0, -0.7, 0.4, 0.9])
    return policy, mask, advantages, behavior, reference


def both(config: dict, kernels, *, env=False, seed=0, dtype=torch.float32):
    cfg = GrpoConfig.from_dict({"loss": {"echo": None}, **config})
    policy, mask, advantages, behavior, reference = tensors(seed)
    out = []
    for choice in (None, kernels):
        leaf = policy.clone().to(dtype).requires_grad_()
        extra = {}
        if env:
            env_mask = torch.zeros_like(mask)
            env_mask[1, ~mask[1]] = True
            env_mask[1, 0] = False
            leaf.data[1][env_mask[1]] = -1.5
            extra = dict(env_mask=env_mask, observation_lengths=torch.tensor([0, 9, 0, 0]))
        batch = GrpoBatch(
            leaf, mask, advantages, behavior_logprobs=behavior,
            reference_logprobs=reference if cfg.kl_term_active else None, **extra,
        )
        loss, stats = grpo_loss(batch, cfg, kernels=choice)
        loss.backward()
        out.append((loss.item(), leaf.grad, stats))
    return out


def assert_same(torch_out, fused_out):
    (loss0, grad0, stats0), (loss1, grad1, stats1) = torch_out, fused_out
    assert loss1 == pytest.approx(loss0, abs=1e-6)
    assert torch.isfinite(grad1).all()
    torch.testing.assert_close(grad1, grad0, atol=1e-6, rtol=1e-5)
    assert stats1.keys() == stats0.keys()
    for key, want in stats0.items():
        got = stats1[key]
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-6, abs=1e-6), key
        elif isinstance(want, list):
            assert got == pytest.approx(want, rel=1e-6, abs=1e-6), key
        else:
            assert got == want, key


CASES = {
    "token ppo, asymmetric clip, k3": dict(
        behavior_policy="recorded", clip_epsilon=0.2, clip_eps_high=0.28, kl_coeff=0.1, kl_estimator="k3"
    ),
    "token, per_sample, k1": dict(behavior_policy="recorded", kl_coeff=0.05, loss_aggregation="per_sample"),
    "token, no importance correction": dict(kl_coeff=0.1, kl_estimator="k3"),
    "gspo sequence ratio": dict(behavior_policy="recorded", is_level="sequence", kl_coeff=0.1),
    "gspo per_sample": dict(
        behavior_policy="recorded", is_level="sequence", loss_aggregation="per_sample", kl_coeff=0.0
    ),
    "cispo capped weight": dict(behavior_policy="recorded", is_level="cispo", cispo_max_weight=1.1, kl_coeff=0.1),
    "entropy-aware KL mask": dict(behavior_policy="recorded", kl_coeff=0.2, entropy_aware_kl_quantile=0.5),
    "no KL": dict(behavior_policy="recorded", kl_coeff=0.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_loss_equals_the_torch_loss(name, triton_kernels):
    assert_same(*both(CASES[name], triton_kernels))


def test_echo_and_no_policy_loss_keep_their_torch_terms(triton_kernels):
    echo = {"echo": {"lambda": 0.1}}
    assert_same(*both({"behavior_policy": "recorded", "kl_coeff": 0.1, "loss": echo}, triton_kernels, env=True))
    assert_same(*both({"loss": {"no_policy_loss": True, **echo}}, triton_kernels, env=True))


def test_bf16_policy_log_probs_are_upcast_alike(triton_kernels):
    torch_out, fused_out = both(CASES["token ppo, asymmetric clip, k3"], triton_kernels, dtype=torch.bfloat16)
    assert fused_out[1].dtype == torch.bfloat16
    assert_same(torch_out, fused_out)
