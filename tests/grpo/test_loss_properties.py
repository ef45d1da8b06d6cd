"""Property tests for the loss maths and the plain-policy-gradient check of no_importance_correction."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts.grpo_config import GrpoConfig
from gpu_runtime.grpo.losses import GrpoBatch, grpo_loss, kl_estimate, token_surrogate

NO_KL = {"kl_coeff": 0.0, "loss": {"echo": None}}


@st.composite
def groups(draw, max_b=4, max_t=6):
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(2, max_t))
    logp = st.floats(min_value=-8, max_value=-0.01)
    policy = torch.tensor(
        draw(st.lists(st.lists(logp, min_size=t, max_size=t), min_size=b, max_size=b)), dtype=torch.float64
    )
    mask = torch.tensor(
        draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    )
    mask[:, 0] = False
    mask[:, 1] = True  # every completion has at least one action token
    adv = torch.tensor(
        draw(st.lists(st.floats(min_value=-3, max_value=3), min_size=b, max_size=b)), dtype=torch.float64
    )
    return policy, mask, adv


@settings(max_examples=80, deadline=None)
@given(groups(), st.sampled_from(["token", "sequence"]), st.sampled_from(["token_level", "per_sample"]))
def test_ratio_one_gives_minus_mean_advantage(group, level, aggregation):
    policy, mask, adv = group
    cfg = GrpoConfig.from_dict(
        {**NO_KL, "behavior_policy": "recorded", "is_level": level, "loss_aggregation": aggregation}
    )
    loss, stats = grpo_loss(GrpoBatch(policy, mask, adv, behavior_logprobs=policy.clone()), cfg)
    lengths = mask.sum(dim=1).double()
    if aggregation == "token_level":  # the token-weighted mean of A
        expected = -(adv * lengths).sum() / lengths.sum()
    else:
        expected = -adv.mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-9)
    assert stats["ratio_min"] == stats["ratio_max"] == 1.0 and stats["outside_clip_fraction"] == 0.0


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-30, max_value=30))
def test_k3_is_non_negative(d):
    value = kl_estimate(torch.tensor([d], dtype=torch.float64), torch.zeros(1, dtype=torch.float64), "k3")
    assert value.item() >= -1e-12


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=-5, max_value=5),
    st.floats(min_value=-5, max_value=5),
    st.floats(min_value=0, max_value=0.99),
    st.floats(min_value=0, max_value=3),
)
def test_clipping_never_lets_the_objective_exceed_the_clipped_bound(log_ratio, adv, eps_low, eps_high):
    d = torch.tensor([[log_ratio]], dtype=torch.float64)
    a = torch.tensor([adv], dtype=torch.float64)
    loss, ratio, _ = token_surrogate(d, a, torch.ones(1, 1, dtype=torch.bool), eps_low, eps_high)
    objective = -loss.item()
    r = ratio.item()
    assert objective <= r * adv + 1e-9  # a min: never above the unclipped objective
    bound = (1 + eps_high) * adv if adv >= 0 else (1 - eps_low) * adv
    assert objective <= bound + 1e-9  # never above the clipped bound


@settings(max_examples=60, deadline=None)
@given(groups(), st.floats(min_value=0.1, max_value=10), st.floats(min_value=-1, max_value=1))
def test_cispo_gradient_weight_never_exceeds_the_cap(group, cap, shift):
    policy, mask, adv = group
    policy = policy.clone().requires_grad_(True)
    cfg = GrpoConfig.from_dict(
        {**NO_KL, "behavior_policy": "recorded", "is_level": "cispo", "cispo_max_weight": cap}
    )
    loss, _ = grpo_loss(GrpoBatch(policy, mask, adv, behavior_logprobs=policy.detach() - shift), cfg)
    loss.backward()
    n = mask.sum().item()
    limit = cap * adv.abs()[:, None].expand_as(policy) / n
    assert (policy.grad.abs() <= limit + 1e-12).all()


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(["token", "sequence", "cispo"]))
def test_token_level_loss_is_the_sum_of_per_completion_contributions(group, level):
    policy, mask, adv = group
    ref = policy - 0.1
    cfg = GrpoConfig.from_dict({"is_level": level, "kl_estimator": "k3"})
    loss, stats = grpo_loss(GrpoBatch(policy, mask, adv, reference_logprobs=ref), cfg)
    assert math.fsum(stats["per_completion_loss"]) == pytest.approx(loss.item(), abs=1e-9)
    assert loss.item() == pytest.approx(
        stats["policy_loss"] + stats["kl_loss"] + stats["echo_loss"], abs=1e-9
    )


@settings(max_examples=40, deadline=None)
@given(groups(max_b=1), st.sampled_from(["token", "sequence", "cispo"]))
def test_single_completion_aggregations_agree(group, level):
    policy, mask, adv = group
    losses = [
        grpo_loss(
            GrpoBatch(policy, mask, adv),
            GrpoConfig.from_dict({**NO_KL, "is_level": level, "loss_aggregation": agg}),
        )[0]
        for agg in ("token_level", "per_sample")
    ]
    assert losses[0].item() == pytest.approx(losses[1].item(), abs=1e-12)


# ---- no_importance_correction is the plain policy gradient -----------------------------------


def _tiny_policy(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Tanh(), torch.nn.Linear(8, 11)).double()


def _token_logprobs(model, ids):
    logits = model(ids[:, :-1])
    picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(ids.shape[0], 1, dtype=picked.dtype), picked], dim=1)


@pytest.mark.parametrize("level", ["token", "sequence", "cispo"])
@pytest.mark.parametrize("aggregation", ["token_level", "per_sample"])
def test_no_importance_correction_gives_the_plain_policy_gradient(level, aggregation):
    ids = torch.tensor([[1, 4, 2, 7, 3], [1, 4, 9, 9, 0], [1, 4, 5, 6, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([0.5, -1.0, 0.5], dtype=torch.float64)
    cfg = GrpoConfig.from_dict({**NO_KL, "is_level": level, "loss_aggregation": aggregation})

    model = _tiny_policy()
    loss, stats = grpo_loss(GrpoBatch(_token_logprobs(model, ids), mask, adv), cfg)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    assert stats["ratio_min"] == stats["ratio_max"] == 1.0

    # REINFORCE with group-relative advantages: -sum_t A_i log pi(t), with the same normalisation.
    reference_model = _tiny_policy()
    logp = _token_logprobs(reference_model, ids)
    weighted = (adv[:, None] * logp * mask).sum(dim=1)
    if aggregation == "token_level":
        objective = weighted.sum() / mask.sum()
    else:
        objective = (weighted / mask.sum(dim=1)).mean()
    (-objective).backward()
    for got, want in zip(grads, (p.grad for p in reference_model.parameters()), strict=True):
        assert torch.allclose(got, want, atol=1e-12)
    if level != "cispo":  # at ratio 1 the PPO/GSPO surrogate's value is -A per token
        lengths = mask.sum(dim=1).double()
        value = -(adv * lengths).sum() / lengths.sum() if aggregation == "token_level" else -adv.mean()
        assert loss.item() == pytest.approx(value.item())
