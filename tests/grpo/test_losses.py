"""grpo_loss and its pieces against hand-computed values on tiny tensors (float64)."""

import math

import pytest
import torch

from core.contracts.grpo_config import GrpoConfig
from gpu_runtime.grpo.losses import (
    GrpoBatch,
    aggregate,
    entropy_kl_mask,
    grpo_loss,
    kl_estimate,
    merge_step_stats,
)

# Two completions: row 0 has 3 action tokens (positions 1-3), row 1 has 2 (positions 1-2).
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
POLICY = [[0.0, -1.0, -2.0, -0.5], [0.0, -0.3, -0.7, 0.0]]
RATIOS = [[1.0, 1.5, 0.5, 1.1], [1.0, 1.5, 0.5, 1.0]]
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)


def config(**overrides):
    base = {"behavior_policy": "recorded", "kl_coeff": 0.0, "loss": {"echo": None}}
    return GrpoConfig.from_dict({**base, **overrides})


def batch(**extra):
    policy = torch.tensor(POLICY, dtype=torch.float64, requires_grad=True)
    behavior = policy.detach() - torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    return GrpoBatch(policy, MASK, ADV, behavior_logprobs=behavior, **extra), policy


def test_token_surrogate_hand_computed_with_clipping_at_both_bounds():
    # eps 0.2 -> [0.8, 1.2].  Row 0 (A=+1): r=1.5 clipped to 1.2 -> -1.2 (no grad); r=0.5 -> -0.5;
    # r=1.1 -> -1.1.  Row 1 (A=-1): r=1.5 -> +1.5; r=0.5 clipped to 0.8 -> +0.8 (no grad).
    b, policy = batch()
    loss, stats = grpo_loss(b, config())
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 1.5 + 0.8) / 5)
    loss.backward()
    # d(-r*A)/dlogp = -r*A on unclipped tokens, 0 on clipped ones; / 5 tokens (token_level).
    expected = torch.tensor([[0, 0, -0.5, -1.1], [0, 1.5, 0, 0]], dtype=torch.float64) / 5
    assert torch.allclose(policy.grad, expected)
    assert stats["below_clip_count"] == 2 and stats["above_clip_count"] == 2
    assert stats["ratio_observations"] == 5 and stats["ratio_scope"] == "token"
    assert stats["clip_low_fraction"] == pytest.approx(0.4) and stats["clip_high_fraction"] == pytest.approx(
        0.4
    )
    assert stats["outside_clip_fraction"] == pytest.approx(0.8)
    assert stats["surrogate_clipped_count"] == 2  # only where the clip binds for the sign of A
    assert stats["ratio_min"] == pytest.approx(0.5) and stats["ratio_max"] == pytest.approx(1.5)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 1.5 + 0.5) / 5)


def test_clip_eps_high_moves_only_the_upper_bound():
    b, _ = batch()
    loss, stats = grpo_loss(b, config(clip_eps_high=0.6))  # range [0.8, 1.6]
    assert loss.item() == pytest.approx((-1.5 - 0.5 - 1.1 + 1.5 + 0.8) / 5)
    assert stats["above_clip_count"] == 0 and stats["below_clip_count"] == 2


def test_per_sample_aggregation():
    b, _ = batch()
    loss, stats = grpo_loss(b, config(loss_aggregation="per_sample"))
    row0, row1 = (-1.2 - 0.5 - 1.1) / 3, (1.5 + 0.8) / 2
    assert stats["per_completion_loss"] == pytest.approx([row0, row1])
    assert loss.item() == pytest.approx((row0 + row1) / 2)


def test_token_level_contributions_sum_to_the_loss():
    b, _ = batch()
    loss, stats = grpo_loss(b, config())
    assert sum(stats["per_completion_loss"]) == pytest.approx(loss.item())
    per_token = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 4.0, 5.0, 9.0]])
    assert aggregate(per_token, MASK, "token_level").tolist() == pytest.approx([6 / 5, 9 / 5])
    assert aggregate(per_token, MASK, "per_sample").tolist() == pytest.approx([2.0, 4.5])


def test_gspo_sequence_ratio_is_length_normalised():
    # Row 0: s = (1.5*0.5*1.1)^(1/3); A=+1, s < 1.2 so unclipped: L = -s on each of 3 tokens.
    # Row 1: s = (1.5*0.5)^(1/2) = 0.866; A=-1, s >= 0.8 so unclipped: L = +s on each of 2 tokens.
    s0, s1 = 0.825 ** (1 / 3), 0.75**0.5
    b, policy = batch()
    loss, stats = grpo_loss(b, config(is_level="sequence", loss_aggregation="per_sample"))
    assert stats["per_completion_loss"] == pytest.approx([-s0, s1])
    assert stats["ratio_scope"] == "sequence" and stats["ratio_observations"] == 2
    assert stats["ratio_min"] == pytest.approx(s1) and stats["ratio_max"] == pytest.approx(s0)
    loss.backward()
    # Per-token coefficient s*A/|y| (then / 2 completions for the per-sample mean).
    expected = torch.tensor([[0, -s0 / 3, -s0 / 3, -s0 / 3], [0, s1 / 2, s1 / 2, 0]], dtype=torch.float64) / 2
    assert torch.allclose(policy.grad, expected)
    b, _ = batch()
    loss, _ = grpo_loss(b, config(is_level="sequence"))
    assert loss.item() == pytest.approx((3 * -s0 + 2 * s1) / 5)


def test_gspo_clips_the_sequence_ratio():
    policy = torch.tensor([[0.0, -1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    behavior = policy.detach() - math.log(0.5)  # s = 0.5 < 0.8 with A < 0: clipped
    b = GrpoBatch(
        policy,
        torch.tensor([[0, 1, 1]], dtype=torch.bool),
        torch.tensor([-2.0], dtype=torch.float64),
        behavior_logprobs=behavior,
    )
    loss, stats = grpo_loss(b, config(is_level="sequence"))
    assert loss.item() == pytest.approx(0.8 * 2)  # -min(0.5*-2, 0.8*-2) = 1.6
    loss.backward()
    assert torch.count_nonzero(policy.grad) == 0
    assert stats["below_clip_count"] == 1 and stats["surrogate_clipped_count"] == 1


def test_cispo_caps_the_detached_weight_and_multiplies_logprob():
    # cap 1.2: weights row 0 = [1.2, 0.5, 1.1], row 1 = [1.2, 0.5].  L_t = -w*A*logp.
    b, policy = batch()
    loss, stats = grpo_loss(b, config(is_level="cispo", cispo_max_weight=1.2, clip_eps_high=0.01))
    terms = [1.2 * 1.0, 0.5 * 2.0, 1.1 * 0.5, 1.2 * -0.3, 0.5 * -0.7]
    assert loss.item() == pytest.approx(sum(terms) / 5)
    loss.backward()
    expected = torch.tensor([[0, -1.2, -0.5, -1.1], [0, 1.2, 0.5, 0]], dtype=torch.float64) / 5
    assert torch.allclose(policy.grad, expected)  # every token keeps a gradient; no lower floor
    assert stats["below_clip_count"] == 0 and stats["above_clip_count"] == 2  # ratios 1.5 > 1.2


def test_kl_estimators_hand_computed():
    policy = torch.tensor([math.log(2.0), -1.0, 0.0], dtype=torch.float64)
    reference = torch.zeros(3, dtype=torch.float64)
    assert kl_estimate(policy, reference, "k1").tolist() == pytest.approx([math.log(2), -1.0, 0.0])
    # k3 = exp(-d) - 1 + d: d=ln2 -> 0.5 - 1 + ln2; d=-1 -> e - 2; d=0 -> 0
    assert kl_estimate(policy, reference, "k3").tolist() == pytest.approx(
        [math.log(2) - 0.5, math.e - 2, 0.0]
    )
    assert kl_estimate(policy, reference, "none").tolist() == [0.0, 0.0, 0.0]


def test_kl_term_in_the_loss_and_its_stats():
    # No importance correction, A = 0: only KL remains.  k3 against reference -1 everywhere.
    policy = torch.tensor([[0.0, -1.0 + math.log(2.0), -2.0]], dtype=torch.float64, requires_grad=True)
    reference = torch.full((1, 3), -1.0, dtype=torch.float64)
    b = GrpoBatch(
        policy,
        torch.tensor([[0, 1, 1]], dtype=torch.bool),
        torch.zeros(1, dtype=torch.float64),
        reference_logprobs=reference,
    )
    cfg = GrpoConfig.from_dict({"kl_estimator": "k3", "kl_coeff": 0.5, "loss": {"echo": None}})
    loss, stats = grpo_loss(b, cfg)
    k3 = [math.log(2) - 0.5, math.e - 2]  # d = ln2 and d = -1
    assert loss.item() == pytest.approx(0.5 * sum(k3) / 2)
    assert stats["kl_loss"] == pytest.approx(loss.item()) and stats["policy_loss"] == 0.0
    assert stats["kl_token_observations"] == 2
    assert stats["kl_mean_log_ratio"] == pytest.approx((math.log(2) - 1) / 2)
    assert stats["kl_mean_estimator"] == pytest.approx(sum(k3) / 2)  # before kl_coeff
    assert stats["kl_entropy_mask_applied_tokens"] == 2


def test_entropy_aware_kl_quantile_selects_high_surprise_tokens():
    policy = torch.tensor([[-0.1, -2.0, -0.5, -3.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    # ascending surprise [0.1, 0.5, 2, 3]; q=0.5 -> rank round(1.5)=2 -> threshold 2.0
    assert entropy_kl_mask(policy, mask, 0.5).tolist() == [[False, True, False, True]]
    assert entropy_kl_mask(policy, mask, 0.0).tolist() == [[True] * 4]
    assert entropy_kl_mask(policy, mask, 1.0).tolist() == [[False, False, False, True]]
    assert entropy_kl_mask(policy, mask, None).tolist() == [[True] * 4]
    partial = torch.tensor([[False, True, True, False]])
    assert entropy_kl_mask(policy, partial, 1.0).tolist() == [[False, True, False, False]]


def test_entropy_mask_gates_the_kl_loss_and_is_counted():
    policy = torch.tensor([[0.0, -0.1, -2.0, -0.5, -3.0]], dtype=torch.float64)
    reference = policy - 1.0  # k1 = 1 on every token
    b = GrpoBatch(
        policy,
        torch.tensor([[0, 1, 1, 1, 1]], dtype=torch.bool),
        torch.zeros(1, dtype=torch.float64),
        reference_logprobs=reference,
    )
    cfg = GrpoConfig.from_dict({"kl_coeff": 1.0, "entropy_aware_kl_quantile": 0.5, "loss": {"echo": None}})
    loss, stats = grpo_loss(b, cfg)
    assert loss.item() == pytest.approx(2 / 4)  # 2 of 4 tokens carry KL 1, mean over 4 tokens
    assert stats["kl_entropy_mask_applied_tokens"] == 2
    assert stats["kl_mean_estimator"] == pytest.approx(1.0) and stats[
        "kl_mean_masked_estimator"
    ] == pytest.approx(0.5)


def echo_batch(no_policy=False):
    policy = torch.tensor([[0.0, -0.5, -1.0, -2.0, -4.0]], dtype=torch.float64, requires_grad=True)
    action = torch.tensor([[0, 1, 0, 0, 0]], dtype=torch.bool)
    env = torch.tensor([[0, 0, 1, 1, 0]], dtype=torch.bool)  # position 4 = trimmed warning token
    b = GrpoBatch(
        policy,
        action,
        torch.tensor([2.0], dtype=torch.float64),
        env_mask=env,
        observation_lengths=torch.tensor([4]),
    )
    return b, policy


def test_echo_is_lambda_times_env_ce_over_full_observation_length():
    b, policy = echo_batch()
    cfg = GrpoConfig.from_dict({"kl_coeff": 0})
    loss, stats = grpo_loss(b, cfg)
    echo = 0.05 * (1.0 + 2.0) / 4  # CE over the env tokens, divided by |O| = 4 (not 2)
    assert stats["echo_loss"] == pytest.approx(echo) and stats["echo_contributed"]
    assert loss.item() == pytest.approx(-2.0 + echo)
    assert stats["echo_env_ce"] == pytest.approx(3.0 / 4) and stats["observation_tokens"] == 4
    loss.backward()
    assert policy.grad[0].tolist() == pytest.approx([0, -2.0, -0.05 / 4, -0.05 / 4, 0])


def test_no_policy_loss_trains_only_the_observation_tokens():
    b, policy = echo_batch()
    cfg = GrpoConfig.from_dict({"loss": {"no_policy_loss": True, "echo": {"lambda": 0.1}}})
    loss, stats = grpo_loss(b, cfg)
    assert loss.item() == pytest.approx(0.1 * 3.0 / 4)
    assert stats["policy_loss"] == 0.0 and stats["kl_loss"] == 0.0
    loss.backward()
    assert policy.grad[0, 1] == 0.0 and policy.grad[0, 2] != 0.0


def test_echo_disabled_ignores_env_tokens():
    b, _ = echo_batch()
    loss, stats = grpo_loss(b, GrpoConfig.from_dict({"kl_coeff": 0, "loss": {"echo": None}}))
    assert loss.item() == pytest.approx(-2.0) and not stats["echo_contributed"]
    assert stats["env_tokens"] == 2


def test_padding_garbage_never_leaks_nan():
    policy = torch.tensor([[-math.inf, -1.0, math.nan]], dtype=torch.float64, requires_grad=True)
    b = GrpoBatch(
        policy,
        torch.tensor([[0, 1, 0]], dtype=torch.bool),
        torch.tensor([1.0], dtype=torch.float64),
        reference_logprobs=torch.tensor([[math.nan, -1.5, -math.inf]], dtype=torch.float64),
    )
    for level in ("token", "sequence", "cispo"):
        policy.grad = None
        loss, _ = grpo_loss(b, GrpoConfig.from_dict({"kl_estimator": "k3", "is_level": level}))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(policy.grad).all()


def test_input_checks():
    b, _ = batch()
    with pytest.raises(ValueError, match="recorded"):
        grpo_loss(GrpoBatch(b.policy_logprobs, MASK, ADV), config())
    with pytest.raises(ValueError, match="reference_logprobs"):
        grpo_loss(b, GrpoConfig.from_dict({"behavior_policy": "recorded"}))
    with pytest.raises(ValueError, match="overlap"):
        grpo_loss(
            GrpoBatch(b.policy_logprobs, MASK, ADV, behavior_logprobs=b.behavior_logprobs, env_mask=MASK),
            config(),
        )
    with pytest.raises(ValueError, match="observation_lengths"):
        grpo_loss(
            GrpoBatch(b.policy_logprobs, MASK, ADV, behavior_logprobs=b.behavior_logprobs, env_mask=~MASK),
            config(loss={}),
        )
    with pytest.raises(ValueError, match="shape"):
        grpo_loss(GrpoBatch(b.policy_logprobs, MASK[:, :3], ADV), config())


def test_low_precision_policy_is_upcast_for_the_maths():
    policy = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    b = GrpoBatch(policy, torch.tensor([[0, 1, 1]], dtype=torch.bool), torch.tensor([1.0]))
    loss, stats = grpo_loss(b, GrpoConfig.from_dict({"kl_coeff": 0}))
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert policy.grad.dtype == torch.bfloat16 and policy.grad[0, 1].item() == pytest.approx(-0.5)
    assert stats["ratio_min"] == stats["ratio_max"] == 1.0


def test_masks_may_be_integer_tensors():
    policy = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    b = GrpoBatch(policy, torch.tensor([[0, 1, 1]]), torch.tensor([2.0]))
    loss, _ = grpo_loss(b, GrpoConfig.from_dict({"kl_coeff": 0}))
    assert loss.item() == pytest.approx(-2.0)


def _random_step(seed: int):
    """Five completions of one group, each with action tokens, two with observation tokens."""
    g = torch.Generator().manual_seed(seed)
    b, t = 5, 9
    policy = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    action = torch.rand(b, t, generator=g) < 0.6
    action[:, 0] = False
    action[:, 1] = True
    env = torch.zeros(b, t, dtype=torch.bool)
    env[1, 6:8] = True  # observation tokens ECHO trains on, in two completions
    env[4, 5:9] = True
    action &= ~env
    return {
        "policy": policy,
        "action": action,
        "adv": torch.randn(b, generator=g, dtype=torch.float64),
        "behavior": policy + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "reference": policy + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "env": env,
        "lengths": torch.tensor([0, 4, 0, 0, 6]),
    }


@pytest.mark.parametrize("is_level", ["token", "sequence", "cispo"])
def test_micro_batches_with_the_step_token_total_add_up_to_the_whole_step(is_level):
    """A token_level step run as micro-batches of completions (each divided by the step's action
    tokens) gives the whole step's loss, gradient and stats: what the trainer relies on when it
    splits a large group to keep its activations small."""
    step = _random_step(3)
    cfg = GrpoConfig.from_dict({
        "behavior_policy": "recorded", "is_level": is_level, "kl_coeff": 0.3, "kl_estimator": "k3",
        "entropy_aware_kl_quantile": 0.5, "loss": {"echo": {"lambda": 0.1}},
    })

    def run(rows, token_total):
        policy = step["policy"][rows].clone().requires_grad_(True)
        part = GrpoBatch(policy, step["action"][rows], step["adv"][rows],
                         behavior_logprobs=step["behavior"][rows], reference_logprobs=step["reference"][rows],
                         env_mask=step["env"][rows], observation_lengths=step["lengths"][rows],
                         token_total=token_total)
        loss, stats = grpo_loss(part, cfg)
        loss.backward()
        return loss.item(), stats, policy.grad

    whole_loss, whole, whole_grad = run([0, 1, 2, 3, 4], None)
    total = int(step["action"].sum())
    parts = [run(rows, total) for rows in ([0, 1], [2, 3, 4])]
    merged = merge_step_stats([stats for _, stats, _ in parts])
    assert sum(loss for loss, _, _ in parts) == pytest.approx(whole_loss, abs=1e-12)
    assert torch.allclose(torch.cat([grad for _, _, grad in parts]), whole_grad, atol=1e-12)
    assert set(merged) == set(whole)
    for key, value in whole.items():
        if isinstance(value, float):
            assert merged[key] == pytest.approx(value, abs=1e-12), key
        elif isinstance(value, list):
            assert merged[key] == pytest.approx(value, abs=1e-12), key
        else:
            assert merged[key] == value, key
    assert whole["echo_contributed"] and whole["kl_entropy_mask_applied_tokens"] > 0


def test_merging_refuses_a_stat_it_does_not_know():
    step = _random_step(4)
    b = GrpoBatch(step["policy"], step["action"], step["adv"], behavior_logprobs=step["behavior"])
    _, stats = grpo_loss(b, config())
    with pytest.raises(ValueError, match="new_figure"):
        merge_step_stats([stats, {**stats, "new_figure": 1}])
