"""oneDNN-packed projections (`gpu_runtime.onednn_linear`, `gpu_runtime.packed_linear`): the
same maps and input gradients as the plain ones, the same samples, records the trainer accepts, a
GRPO run that equals the plain one, and the plain path wherever packing does not apply (with the
reason).

The tiny model is below the packing threshold (its weights stay in cache), so these tests lower the
threshold to run its training plans packed; the 25.7 M-parameter model of the benchmarks is above it.
The sampler packs every model it can, whatever its size: a row's product over packed weights does
not depend on the rows beside it (batch invariance, tests/gpu_runtime/test_adapters.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

from core.contracts.provenance import build_rollout_provenance
from gpu_runtime import lean_decoder, lean_plan, onednn_linear, packed_linear
from gpu_runtime.grpo.adapter_io import attach_lora
from gpu_runtime.sampler import Sampler
from tests.gpu_runtime.test_sampler import ask, reference_logprobs
from tests.grpo.tiny_support import exact_match_reward, fixed_groups, run, train_request

pytestmark = pytest.mark.skipif(onednn_linear.onednn_problem() is not None,
                                reason=f"{onednn_linear.onednn_problem()}")


@pytest.fixture
def pack_everything(monkeypatch):
    monkeypatch.setattr(onednn_linear, "PACK_MIN_ELEMENTS", 0)
    monkeypatch.delenv(onednn_linear.SWITCH, raising=False)


@pytest.fixture
def packed_sampler(loaded, pack_everything):
    sampler = Sampler(loaded)
    assert sampler.packing_problem is None
    return sampler


def plain_plan(model, monkeypatch, **kwargs):
    monkeypatch.setenv(onednn_linear.SWITCH, "0")
    plan = lean_decoder.plan_for(model, **kwargs)
    monkeypatch.delenv(onednn_linear.SWITCH)
    assert plan.packing_problem == f"{onednn_linear.SWITCH}=0"
    return plan


def test_packed_projections_compute_the_plain_maps_and_input_gradients(loaded, pack_everything, monkeypatch):
    # A training plan: live LoRA terms on q, k, v, o (B made non-zero so they count), frozen base.
    model = attach_lora(loaded.shared_base.fresh_model(), rank=4, alpha=8)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    packed = lean_decoder.plan_for(model)
    plain = plain_plan(model, monkeypatch)
    assert packed.packing_problem is None
    sampling, problem = packed_linear.packed_plan(lean_decoder.plan_for(loaded.model, merge_lora=True))
    assert problem is None
    generator = torch.Generator().manual_seed(0)
    for plain_layer, packed_layer, sampling_layer in zip(plain.layers, packed.layers, sampling.layers, strict=True):
        # q|k|v and gate|up: packed in place of the plain stacked copy; o and down only for sampling.
        for name in ("qkv", "gate_up"):
            assert packed_layer_stack_is_packed(getattr(packed_layer, name))
            assert packed_layer_stack_is_packed(getattr(sampling_layer, name))
        assert isinstance(sampling_layer.o, packed_linear.PackedLinear) and not isinstance(packed_layer.o, packed_linear.PackedLinear)
        pairs = [(getattr(plain_layer, n), getattr(packed_layer, n)) for n in ("qkv", "gate_up")]
        pairs += [(sampling_layer.o.plain, sampling_layer.o), (sampling_layer.down.plain, sampling_layer.down)]
        for slow, fast in pairs:
            width = fast.parts[0].weight.shape[1] if hasattr(fast, "parts") else fast.weight.shape[1]
            x = torch.randn(3, 5, width, generator=generator)  # odd batch and length
            with torch.inference_mode():
                expected, got = slow(x), fast(x)
            assert got.shape == expected.shape and got.abs().max() > 0
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
            # Under autograd: the input's gradient (and the LoRA terms') as on the plain path.
            grads = []
            for projection in (slow, fast):
                leaf = x.clone().requires_grad_(True)
                weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2))
                (projection(leaf) * weights).sum().backward()
                grads.append(leaf.grad)
            assert grads[0].abs().max() > 0
            assert torch.allclose(grads[1], grads[0], rtol=1e-5, atol=1e-5)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert all(p.requires_grad for p in lora_b)


def packed_layer_stack_is_packed(stacked) -> bool:
    return stacked.packed is not None and stacked.weight is None and stacked.fused


def test_the_packed_copy_replaces_the_plain_stack_and_is_shared_across_plans(loaded, pack_everything, monkeypatch):
    adapted = attach_lora(loaded.shared_base.fresh_model(), rank=4, alpha=8)
    training = lean_decoder.plan_for(adapted)
    sampling = lean_decoder.plan_for(loaded.model, merge_lora=True)
    for a, b in zip(training.layers, sampling.layers, strict=True):
        assert a.qkv.packed is b.qkv.packed and a.gate_up.packed is b.gate_up.packed  # one copy
        assert a.qkv.weight is None and a.gate_up.weight is None  # no plain stacked copy

    # A frozen adapter folded in (the sampler serving it): its own packed stack, the adapter's map.
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(3))
    folded = lean_decoder.plan_for(adapted, merge_lora=True)
    plain_folded = plain_plan(adapted, monkeypatch, merge_lora=True)
    assert folded.layers[0].qkv.packed is not sampling.layers[0].qkv.packed
    assert folded.layers[0].gate_up.packed is sampling.layers[0].gate_up.packed  # no LoRA on the MLP
    ids = torch.tensor([[5, 17, 99, 3, 42, 7]])
    with torch.inference_mode():
        got, _ = lean_decoder.forward(folded, ids)
        expected, _ = lean_decoder.forward(plain_folded, ids)
        base, _ = lean_decoder.forward(sampling, ids)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4) and not torch.allclose(got, base, atol=1e-3)


def test_a_row_over_a_packed_weight_is_bitwise_the_same_in_any_batch():
    """oneDNN runs one row alone with another kernel (at 3,072 inputs, another sum): it runs as two."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(256, 3072, generator=generator)
    packed = onednn_linear.pack(weight)
    x = torch.randn(9, 3072, generator=generator)
    alone = [onednn_linear.linear(x[row : row + 1], packed, None, (weight,)) for row in range(9)]
    for rows in (2, 3, 9):
        together = onednn_linear.linear(x[:rows], packed, None, (weight,))
        assert all(torch.equal(together[row], alone[row][0]) for row in range(rows))
    torch.testing.assert_close(alone[0], x[:1] @ weight.T, rtol=1e-4, atol=1e-3)


def test_the_sampler_packs_a_small_model_its_trainer_does_not(loaded):
    plan = lean_decoder.plan_for(loaded.model, merge_lora=True)
    assert "small model" in plan.packing_problem and "stay in cache" in plan.packing_problem
    assert plan.layers[0].qkv.weight is not None and plan.layers[0].qkv.packed is None  # plain stack
    packed, problem = packed_linear.packed_plan(plan)
    assert problem is None and isinstance(packed, packed_linear.PackedPlan)
    layer = packed.layers[0]
    assert layer.qkv.packed is not None and layer.gate_up.packed is not None and layer.qkv.weight is None
    assert isinstance(layer.o, packed_linear.PackedLinear) and isinstance(packed.head, packed_linear.PackedLinear)
    assert plan.layers[0].qkv.weight is not None  # the trainer's plain stack stays
    hidden = torch.randn(3, loaded.model.config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(packed_linear.lm_logits(packed, hidden), lean_decoder.lm_logits(plan, hidden))


def test_where_packing_does_not_apply_the_plan_is_unchanged_and_says_why(loaded, monkeypatch):

    monkeypatch.setattr(onednn_linear, "PACK_MIN_ELEMENTS", 0)
    monkeypatch.setenv(onednn_linear.SWITCH, "0")
    switched = lean_decoder.plan_for(loaded.model, merge_lora=True)
    assert packed_linear.packed_plan(switched) == (switched, f"{onednn_linear.SWITCH}=0")
    monkeypatch.delenv(onednn_linear.SWITCH)

    # A training plan keeps its LoRA terms live on o: its stacks are packed, o and down are not.
    with_lora = attach_lora(loaded.shared_base.fresh_model(), rank=4, alpha=8)
    training_plan = lean_decoder.plan_for(with_lora)
    assert training_plan.packing_problem is None
    assert packed_linear.packed_plan(training_plan) == (training_plan, "LoRA terms are not folded into the weights")

    reduced = copy.deepcopy(loaded.model).to(torch.bfloat16)
    bf16_plan = lean_decoder.plan_for(reduced, merge_lora=True)
    assert "float32 on the CPU" in bf16_plan.packing_problem and "bfloat16" in bf16_plan.packing_problem
    assert bf16_plan.layers[0].qkv.packed is None

    # A model too large to stack its projections is not copied again.
    monkeypatch.setattr(lean_plan, "FUSE_MAX_ELEMENTS", 0)
    apart = lean_decoder.plan_for(loaded.model, merge_lora=True)
    assert not apart.layers[0].qkv.fused
    _, problem = packed_linear.packed_plan(apart)
    assert "not stacked" in problem


def test_a_packed_sampler_samples_as_the_plain_one(packed_sampler, loaded, full_forward, monkeypatch):
    requests = [
        ask(seed=31, max_tokens=20, ignore_eos=True),
        ask("Hello!", thinking=False, seed=32, max_tokens=12, temperature=0.8, top_p=0.9),
        ask("What is 3 + 4? Reply with just the number.", seed=33, max_tokens=8, repetition_penalty=1.4),
    ]
    packed = packed_sampler.generate(requests)
    monkeypatch.setenv(onednn_linear.SWITCH, "0")
    plain_sampler = Sampler(loaded)
    plain = plain_sampler.generate(requests)
    assert plain_sampler.packing_problem == f"{onednn_linear.SWITCH}=0"
    (plan,) = packed_sampler._plans.values()  # the base model's: its projections ran packed
    assert plan.layers[0].qkv.packed is not None and isinstance(plan.layers[0].down, packed_linear.PackedLinear)
    assert packed_sampler.packing_problem is None
    for a, b in zip(packed, plain, strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)
    assert len({tuple(r.completion_token_ids) for r in packed}) == 3
    first = packed[0]
    assert reference_logprobs(first, requests[0].sampling, full_forward) == pytest.approx(first.token_logprobs, abs=1e-4)
    # A request's tokens do not depend on its neighbours.
    alone = packed_sampler.generate([requests[0]])[0]
    assert alone.completion_token_ids == first.completion_token_ids
    assert alone.token_logprobs == first.token_logprobs  # bit for bit: packed rows are batch-invariant


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


def test_a_grpo_run_with_packed_stacks_equals_the_plain_one(tiny_model_dir, tmp_path, monkeypatch, one_thread):
    """Same data, same seed; tolerances as for the kernels (tests/gpu_runtime/kernels/test_grpo_step.py):
    the first step agrees to float32 rounding, the second after one AdamW update to 1e-3."""

    def train(name):
        return run(train_request(tiny_model_dir, fixed_groups(2), tmp_path, name, kl_coeff=0.05, kl_estimator="k3"))

    monkeypatch.setenv(onednn_linear.SWITCH, "0")
    plain = train("plain")
    monkeypatch.delenv(onednn_linear.SWITCH)
    monkeypatch.setattr(onednn_linear, "PACK_MIN_ELEMENTS", 0)
    packed = train("packed")

    records = [r.receipt["runtime"]["execution_provenance"]["packed_matmul"] for r in (plain, packed)]
    assert records == [{"packed": False, "reason": f"{onednn_linear.SWITCH}=0"}, {"packed": True, "reason": None}]
    first, second = zip(plain.receipt["loss_history"], packed.receipt["loss_history"], strict=True)
    assert first[1]["loss"] == pytest.approx(first[0]["loss"], rel=1e-5, abs=1e-7)
    assert second[1]["loss"] == pytest.approx(second[0]["loss"], rel=1e-3, abs=1e-6)
    assert second[1]["kl_estimator_mean"] == pytest.approx(second[0]["kl_estimator_mean"], rel=1e-3, abs=1e-9)
    assert second[0]["kl_estimator_mean"] > 0  # the second step's policy has moved off the base
    norms = list(zip(plain.receipt["lora_grad_norms"], packed.receipt["lora_grad_norms"], strict=True))
    assert norms[0][0] > 0 and norms[0][1] == pytest.approx(norms[0][0], rel=1e-5)
    assert norms[1][1] == pytest.approx(norms[1][0], rel=1e-3)
