"""The sampler's oneDNN-packed projections (`gpu_runtime.packed_linear`): same maps, same samples,
records the trainer accepts, and the plain path wherever packing does not apply (with the reason).

The tiny model is below the packing threshold (its weights stay in cache), so these tests lower the
threshold to run the packed path on it; the 25.7 M-parameter model of the benchmarks is above it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from core.contracts.provenance import build_rollout_provenance
from gpu_runtime import lean_decoder, lean_plan, packed_linear
from gpu_runtime.grpo.adapter_io import attach_lora
from gpu_runtime.lean_plan import Projection, Stacked
from gpu_runtime.sampler import Sampler
from tests.gpu_runtime.test_sampler import ask, reference_logprobs
from tests.grpo.tiny_support import exact_match_reward, run, train_request

pytestmark = pytest.mark.skipif(packed_linear._onednn_problem() is not None,
                                reason=f"{packed_linear._onednn_problem()}")


@pytest.fixture
def pack_everything(monkeypatch):
    monkeypatch.setattr(packed_linear, "PACK_MIN_ELEMENTS", 0)
    monkeypatch.delenv(packed_linear.SWITCH, raising=False)


@pytest.fixture
def packed_sampler(loaded, pack_everything):
    sampler = Sampler(loaded)
    assert sampler.packing_problem is None
    return sampler


def test_packed_projections_compute_the_plain_maps(loaded, pack_everything):
    plan = lean_decoder.plan_for(loaded.model, merge_lora=True)
    packed, problem = packed_linear.packed_plan(plan)
    assert problem is None
    generator = torch.Generator().manual_seed(0)
    for plain_layer, packed_layer in zip(plan.layers, packed.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):
            plain, fast = getattr(plain_layer, name), getattr(packed_layer, name)
            assert isinstance(fast, packed_linear.PackedLinear) and fast.plain is plain
            x = torch.randn(3, 5, plain.weight.shape[1], generator=generator)  # odd batch and length
            with torch.inference_mode():
                expected, got = plain(x), fast(x)
            assert got.shape == expected.shape == (3, 5, plain.weight.shape[0])
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), name
            assert not torch.equal(x, torch.zeros_like(x)) and got.abs().max() > 0
            # Under autograd the plain map runs: gradients flow as before.
            x.requires_grad_(True)
            y = fast(x)
            assert y.grad_fn is not None and torch.equal(y, plain(x))
            y.sum().backward()
            assert x.grad is not None and x.grad.abs().sum() > 0


def test_where_packing_does_not_apply_the_plan_is_unchanged_and_says_why(loaded, monkeypatch):
    plan = lean_decoder.plan_for(loaded.model, merge_lora=True)
    unchanged, problem = packed_linear.packed_plan(plan)
    assert unchanged is plan and "small model" in problem and "stay in cache" in problem

    monkeypatch.setattr(packed_linear, "PACK_MIN_ELEMENTS", 0)
    monkeypatch.setenv(packed_linear.SWITCH, "0")
    assert packed_linear.packed_plan(plan) == (plan, f"{packed_linear.SWITCH}=0")
    monkeypatch.delenv(packed_linear.SWITCH)

    # A training plan keeps its LoRA terms live: nothing to pack.
    with_lora = attach_lora(loaded.shared_base.fresh_model(), rank=4, alpha=8)
    training_plan = lean_decoder.plan_for(with_lora)
    assert packed_linear.packed_plan(training_plan) == (training_plan, "LoRA terms are not folded into the weights")

    first = plan.layers[0]
    bf16_parts = tuple(Projection(p.weight.to(torch.bfloat16), p.bias, ()) for p in first.qkv.parts)
    reduced = dataclasses.replace(first, qkv=Stacked(bf16_parts, first.qkv.weight.to(torch.bfloat16)))
    bf16_plan = dataclasses.replace(plan, layers=(reduced, *plan.layers[1:]))
    _, problem = packed_linear.packed_plan(bf16_plan)
    assert "float32 on the CPU" in problem and "bfloat16" in problem

    # A model too large to stack its projections is not copied again.
    monkeypatch.setattr(lean_plan, "FUSE_MAX_ELEMENTS", 0)
    apart = lean_decoder.plan_for(loaded.model, merge_lora=True)
    assert apart.layers[0].qkv.weight is None
    _, problem = packed_linear.packed_plan(apart)
    assert "not stacked" in problem


def test_a_packed_sampler_samples_as_the_plain_one(packed_sampler, sampler, full_forward):
    requests = [
        ask(seed=31, max_tokens=20, ignore_eos=True),
        ask("Hello!", thinking=False, seed=32, max_tokens=12, temperature=0.8, top_p=0.9),
        ask("What is 3 + 4? Reply with just the number.", seed=33, max_tokens=8, repetition_penalty=1.4),
    ]
    packed, plain = packed_sampler.generate(requests), sampler.generate(requests)
    (plan,) = packed_sampler._plans.values()  # the base model's: its projections ran packed
    assert isinstance(plan.layers[0].qkv, packed_linear.PackedLinear) and packed_sampler.packing_problem is None
    for a, b in zip(packed, plain, strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)
    assert len({tuple(r.completion_token_ids) for r in packed}) == 3
    first = packed[0]
    assert reference_logprobs(first, requests[0].sampling, full_forward) == pytest.approx(first.token_logprobs, abs=1e-4)
    # A request's tokens do not depend on its neighbours.
    alone = packed_sampler.generate([requests[0]])[0]
    assert alone.completion_token_ids == first.completion_token_ids


def test_records_from_a_packed_sampler_pass_the_trainers_replay(packed_sampler, tiny_model_dir, tmp_path, one_thread):
    messages = [{"role": "user", "content": "What is 2 + 3? Reply with just the number."}]
    results = packed_sampler.generate([
        ask(messages[0]["content"], thinking=False, seed=seed, temperature=1.0, max_tokens=6) for seed in range(4)
    ])
    group = {"messages": messages, "completions": [
        {"text": r.text, "reward": exact_match_reward(r.text, r.finish_reason == "stop", "5") + 0.1 * i,
         "provenance": build_rollout_provenance(r, prompt_messages=messages)}
        for i, r in enumerate(results)
    ]}
    result = run(train_request(tiny_model_dir, [group], tmp_path, "packed", behavior_policy="recorded",
                               dynamic_sampling=False))
    replay = result.receipt["recorded_behavior_replay"]
    assert replay["checked_tokens"] == sum(len(r.completion_token_ids) for r in results) > 0
    assert replay["max_abs_logprob_difference"] < 1e-3
    ratios = result.receipt["grpo"]["policy_audit"]["importance_sampling"]
    assert ratios["min_ratio"] == pytest.approx(1.0, abs=1e-4) and ratios["max_ratio"] == pytest.approx(1.0, abs=1e-4)
