"""The logits -> behaviour-distribution math of gpu_runtime.sampling, on hand-made logits (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from gpu_runtime.sampling import PenaltyState, SamplingParams, apply_penalties, behavior_logprobs, draw_tokens

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0, 0.0]])


def kept(logprobs: torch.Tensor) -> list[int]:
    return torch.isfinite(logprobs[0]).nonzero().flatten().tolist()


def test_temperature_one_without_filters_is_plain_log_softmax():
    out = behavior_logprobs(LOGITS, [SamplingParams()])
    assert torch.allclose(out, torch.log_softmax(LOGITS, -1), atol=1e-7)


def test_temperature_divides_logits():
    out = behavior_logprobs(LOGITS, [SamplingParams(temperature=0.5)])
    assert torch.allclose(out, torch.log_softmax(LOGITS / 0.5, -1), atol=1e-6)


def test_greedy_and_top_k_one_are_one_hot_at_the_argmax():
    greedy = behavior_logprobs(LOGITS, [SamplingParams(temperature=0)])
    top1 = behavior_logprobs(LOGITS, [SamplingParams(top_k=1)])
    assert kept(greedy) == kept(top1) == [4]
    assert greedy[0, 4] == 0 and abs(float(top1[0, 4])) < 1e-7


def test_top_k_keeps_the_k_largest_and_renormalises():
    out = behavior_logprobs(LOGITS, [SamplingParams(top_k=3)])
    assert kept(out) == [0, 1, 4]
    expected = torch.log_softmax(LOGITS[0, [0, 1, 4]], -1)
    assert torch.allclose(out[0, [0, 1, 4]], expected, atol=1e-6)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.softmax(LOGITS[0], -1)  # order by prob: 4, 0, 1, 2, 5, 3
    p_top2 = float(probs[4] + probs[0])
    out = behavior_logprobs(LOGITS, [SamplingParams(top_p=p_top2 - 1e-4)])
    assert kept(out) == [0, 4]
    out = behavior_logprobs(LOGITS, [SamplingParams(top_p=p_top2 + 1e-4)])
    assert kept(out) == [0, 1, 4]


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    probs = torch.softmax(LOGITS[0], -1)
    ratio = probs / probs.max()
    out = behavior_logprobs(LOGITS, [SamplingParams(min_p=0.2)])
    assert kept(out) == [i for i in range(6) if ratio[i] >= 0.2]


def test_rows_are_independent_of_their_batch_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(top_p=0.8, min_p=0.1),
        SamplingParams(temperature=0),
    ]
    batched = behavior_logprobs(logits, params)
    for row, p in enumerate(params):
        alone = behavior_logprobs(logits[row : row + 1], [p])
        assert torch.equal(batched[row], alone[0])


def test_penalties_follow_their_definitions():
    logits = torch.tensor([2.0, -1.0, 0.5, 1.0])
    state = PenaltyState([0], vocab_size=4, device=torch.device("cpu"))  # token 0 in the prompt
    for token in (1, 1, 2):
        state.add(token)
    rep = apply_penalties(logits, SamplingParams(repetition_penalty=2.0), state)
    assert rep.tolist() == [1.0, -2.0, 0.25, 1.0]  # seen: positive halves, negative doubles
    freq = apply_penalties(logits, SamplingParams(frequency_penalty=0.5), state)
    assert freq.tolist() == [2.0, -2.0, 0.0, 1.0]  # minus 0.5 per occurrence in the output
    pres = apply_penalties(logits, SamplingParams(presence_penalty=0.25), state)
    assert pres.tolist() == [2.0, -1.25, 0.25, 1.0]  # minus 0.25 once, output tokens only


def test_inverse_cdf_draw_follows_the_distribution():
    logprobs = torch.log(torch.tensor([[0.1, 0.0, 0.6, 0.3]]))
    assert draw_tokens(logprobs, torch.tensor([0.0], dtype=torch.float64)).item() == 0
    assert draw_tokens(logprobs, torch.tensor([0.1], dtype=torch.float64)).item() == 2
    assert draw_tokens(logprobs, torch.tensor([0.69], dtype=torch.float64)).item() == 2
    assert draw_tokens(logprobs, torch.tensor([0.71], dtype=torch.float64)).item() == 3
    # Just below 1 never lands on a zero-probability tail.
    tail = torch.log(torch.tensor([[0.5, 0.5, 0.0, 0.0]]))
    assert draw_tokens(tail, torch.tensor([1 - 1e-17], dtype=torch.float64)).item() == 1
    u = torch.rand(20000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    counts = torch.bincount(draw_tokens(logprobs.expand(20000, 4), u), minlength=4) / 20000
    assert counts[1] == 0
    assert torch.allclose(counts, torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.015)


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -0.1},
        {"temperature": math.nan},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"min_p": 1.1},
        {"max_tokens": 0},
        {"repetition_penalty": 0.0},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3.0},
        {"stop": ("",)},
    ],
)
def test_invalid_controls_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad).validate()


def test_record_is_the_provenance_sampling_object():
    record = SamplingParams(temperature=1, top_k=5, stop=["\n\n"]).to_record()
    assert record == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 5,
        "min_p": 0.0,
        "max_tokens": 256,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop": ["\n\n"],
    }
