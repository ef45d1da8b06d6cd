"""The batching sampler on the tiny model: controls, log-probs, seeds in batches, thinking, scheduling, errors."""

from __future__ import annotations

import threading

import pytest
import torch

from core.contracts.provenance import build_rollout_provenance
from gpu_runtime.sample_types import SampleRequest, SampleRequestError
from gpu_runtime.sampler import Sampler
from gpu_runtime.sampling import PenaltyState, SamplingParams, apply_penalties, behavior_logprobs

QUESTION = "What is 47 + 13? Reply with just the number."


def ask(content=QUESTION, *, thinking=True, seed=0, **sampling):
    sampling.setdefault("max_tokens", 16)
    extra = {k: sampling.pop(k) for k in ("ignore_eos", "thinking_budget_tokens", "adapter") if k in sampling}
    return SampleRequest(
        messages=[{"role": "user", "content": content}],
        enable_thinking=thinking,
        seed=seed,
        sampling=SamplingParams(**sampling),
        **extra,
    )


def reference_logprobs(result, params, full_forward) -> list[float]:
    """Behaviour log-probs recomputed from one uncached forward pass over prompt + completion."""
    prompt, completion = result.prompt_token_ids, result.completion_token_ids
    logits = full_forward(prompt + completion)
    state = PenaltyState(prompt, logits.shape[-1], torch.device("cpu"))
    out = []
    for i, token in enumerate(completion):
        row = logits[len(prompt) - 1 + i]
        if params.uses_penalties:
            row = apply_penalties(row, params, state)
        out.append(float(behavior_logprobs(row[None], [params])[0, token]))
        state.add(token)
    return out


def test_top_k_one_equals_greedy_which_is_the_argmax(sampler, full_forward):
    greedy, top1 = sampler.generate([ask(temperature=0, seed=1), ask(top_k=1, seed=2)])
    assert greedy.completion_token_ids == top1.completion_token_ids
    assert greedy.token_logprobs == [0.0] * len(greedy.completion_token_ids)
    logits = full_forward(greedy.prompt_token_ids + greedy.completion_token_ids)
    start = len(greedy.prompt_token_ids) - 1
    for i, token in enumerate(greedy.completion_token_ids):
        assert int(logits[start + i].argmax()) == token


def test_logprobs_match_a_full_forward_pass_at_temperature_one(sampler, full_forward):
    params = SamplingParams(max_tokens=24)
    results = sampler.generate([ask(seed=s, max_tokens=24) for s in range(3)])
    for result in results:
        expected = reference_logprobs(result, params, full_forward)
        plain = torch.log_softmax(full_forward(result.prompt_token_ids + result.completion_token_ids), -1)
        assert expected == pytest.approx(result.token_logprobs, abs=1e-4)
        for i, token in enumerate(result.completion_token_ids):
            assert float(plain[len(result.prompt_token_ids) - 1 + i, token]) == pytest.approx(
                result.token_logprobs[i], abs=1e-4
            )


def test_a_long_completion_in_a_changing_batch_keeps_its_logprobs(sampler, full_forward):
    """Decoding writes each step's keys and values into the cache's spare columns (a buffer that
    doubles when full) while shorter neighbours finish and leave the batch: the long completion's
    log-probs still equal those of one full forward over its tokens."""
    params = SamplingParams(max_tokens=120)
    short = [ask("Hello!", thinking=False, seed=s, max_tokens=3 + 7 * s, ignore_eos=True) for s in range(4)]
    results = sampler.generate([short[0], ask(seed=5, max_tokens=120, ignore_eos=True), *short[1:]])
    assert [len(r.completion_token_ids) for r in results] == [3, 120, 10, 17, 24]
    long_one = results[1]
    assert reference_logprobs(long_one, params, full_forward) == pytest.approx(long_one.token_logprobs, abs=1e-4)


def test_logprobs_are_those_of_the_processed_distribution(sampler, full_forward):
    controls = dict(
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.3,
        presence_penalty=0.4,
        frequency_penalty=0.3,
        max_tokens=24,
    )
    params = SamplingParams(**controls)
    for seed in (5, 6):
        result = sampler.generate([ask(seed=seed, **controls)])[0]
        expected = reference_logprobs(result, params, full_forward)
        assert all(lp > -float("inf") for lp in result.token_logprobs)
        assert expected == pytest.approx(result.token_logprobs, abs=1e-4)


def test_same_seed_gives_the_same_tokens_alone_and_in_a_mixed_batch(sampler):
    target = dict(seed=1234, max_tokens=32, ignore_eos=True)
    alone = sampler.generate([ask(**target)])[0]
    neighbours = [
        ask("Hello!", seed=1, max_tokens=5),
        ask(
            'Reply with one JSON object that sets "delta" to 2.',
            thinking=False,
            seed=2,
            top_k=5,
            max_tokens=40,
        ),
        ask("What is 3 + 4? Reply with just the number.", seed=3, temperature=0.5, repetition_penalty=1.5),
    ]
    batched = sampler.generate([neighbours[0], ask(**target), *neighbours[1:]])[1]
    assert batched.completion_token_ids == alone.completion_token_ids
    assert batched.token_logprobs == alone.token_logprobs  # bit for bit: the CPU path is batch-invariant
    assert batched.seed == alone.seed == 1234

    # Joining mid-flight, after another request has decoded a while, changes nothing either.
    long_one = sampler.submit(ask("Tell me a fact.", seed=9, max_tokens=60, ignore_eos=True))
    for _ in range(7):
        sampler.step()
    late = sampler.submit(ask(**target))
    while not late.done():
        sampler.step()
    assert late.result().completion_token_ids == alone.completion_token_ids
    assert late.result().token_logprobs == alone.token_logprobs
    long_one.cancel()
    sampler.step()

    other_seed = sampler.generate([ask(**dict(target, seed=4321))])[0]
    assert other_seed.completion_token_ids != alone.completion_token_ids


def test_max_tokens_ends_with_length(sampler):
    result = sampler.generate([ask(max_tokens=5, ignore_eos=True)])[0]
    assert len(result.completion_token_ids) == 5 and result.finish_reason == "length"
    assert result.usage == {
        "prompt_tokens": len(result.prompt_token_ids),
        "completion_tokens": 5,
        "total_tokens": len(result.prompt_token_ids) + 5,
        "reasoning_tokens": result.usage["reasoning_tokens"],
        "forced_tokens": 0,
    }


def test_end_of_turn_stops_and_is_kept_as_a_token_but_not_as_text(sampler, loaded):
    results = sampler.generate([ask(thinking=False, seed=s, max_tokens=16) for s in range(4)])
    eos = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    stopped = [r for r in results if r.finish_reason == "stop"]
    assert stopped, "the warmed model ends its answers"
    for r in stopped:
        assert r.completion_token_ids[-1] == eos and r.stop_reason == eos
        assert "<|im_end|>" not in r.text
        assert r.reasoning_content is None and r.content == r.text


def test_stop_string_cuts_the_text(sampler):
    base = sampler.generate([ask(seed=11, max_tokens=30, ignore_eos=True)])[0]
    middle = len(base.text) // 2
    stop = base.text[middle : middle + 2]
    cut_at = base.text.find(stop)
    assert len(base.text) >= 6 and cut_at > 0
    result = sampler.generate([ask(seed=11, max_tokens=30, ignore_eos=True, stop=[stop, "never-seen-zz"])])[0]
    assert result.finish_reason == "stop" and result.stop_reason == stop
    assert result.text == base.text[:cut_at]
    n = len(result.completion_token_ids)
    assert result.completion_token_ids == base.completion_token_ids[:n] and n < len(base.completion_token_ids)


def test_thinking_output_splits_reasoning_from_content(sampler):
    results = sampler.generate([ask(seed=s, max_tokens=40) for s in range(4)])
    closed = [r for r in results if "</think>" in r.text]
    assert closed, "the warmed model closes its reasoning"
    for r in closed:
        assert r.reasoning_content + "</think>" + r.content == r.text
        assert r.usage["reasoning_tokens"] == r.completion_token_ids.index(sampler._thinking.close_id)


def test_thinking_budget_forces_the_close_tokens(sampler, loaded, full_forward):
    close = list(sampler._thinking.close_sequence)
    assert loaded.tokenizer.decode(close) == "</think>\n\n"
    result = sampler.generate([ask(seed=21, max_tokens=20, thinking_budget_tokens=2)])[0]
    assert result.token_sources[:4] == ["sampled", "sampled", "forced", "forced"]
    assert result.completion_token_ids[2:4] == close
    assert close[0] not in result.completion_token_ids[:2]
    assert result.reasoning_content == loaded.tokenizer.decode(result.completion_token_ids[:2])
    assert result.usage["reasoning_tokens"] == 2 and result.usage["forced_tokens"] == 2
    assert result.sampling["thinking_budget"] == {"close_token_ids": close, "max_tokens": 2}
    # Forced tokens still carry the log-prob they would have had under the behaviour distribution.
    assert reference_logprobs(result, SamplingParams(max_tokens=20), full_forward) == pytest.approx(
        result.token_logprobs, abs=1e-4
    )
    record = build_rollout_provenance(result, prompt_messages=[{"role": "user", "content": QUESTION}])
    forced = [a for a in record["action_tokens"] if a["source"] == "forced"]
    assert [a["token_id"] for a in forced] == close and all(a["behavior_logprob"] is None for a in forced)

    immediate = sampler.generate([ask(seed=21, max_tokens=6, thinking_budget_tokens=0)])[0]
    assert immediate.token_sources[:2] == ["forced", "forced"] and immediate.reasoning_content == ""
    timed = sampler.generate(
        [
            SampleRequest(
                messages=[{"role": "user", "content": QUESTION}],
                seed=21,
                thinking_budget_ms=0,
                sampling=SamplingParams(max_tokens=6),
            )
        ]
    )[0]
    assert timed.completion_token_ids[:2] == close and timed.token_sources[:2] == ["forced", "forced"]
    assert timed.sampling["thinking_budget"] == {"close_token_ids": close, "max_time_ms": 0}


def test_raw_prompt_tokens_sample_like_the_rendered_messages(sampler, loaded):
    _, ids = loaded.render_prompt([{"role": "user", "content": QUESTION}], enable_thinking=True)
    by_ids = sampler.generate(
        [SampleRequest(prompt_token_ids=ids, seed=3, sampling=SamplingParams(max_tokens=12))]
    )[0]
    by_messages = sampler.generate([ask(seed=3, max_tokens=12)])[0]
    assert by_ids.completion_token_ids == by_messages.completion_token_ids
    assert by_ids.template_invocation == {} and by_ids.prompt_text is None
    assert by_messages.template_invocation == {"tools": [], "template_kwargs": {"enable_thinking": True}}


def test_a_new_request_does_not_wait_for_a_long_one(loaded):
    sampler = Sampler(loaded)
    long_one = sampler.submit(ask(seed=1, max_tokens=400, ignore_eos=True))
    for _ in range(3):
        sampler.step()
    short = sampler.submit(ask(seed=2, max_tokens=3, ignore_eos=True))
    steps = 0
    while not short.done():
        sampler.step()
        steps += 1
    assert steps == 2  # prefill + first token, then one decode step yields tokens 2 and 3
    assert len(short.result().completion_token_ids) == 3
    assert not long_one.done()
    assert long_one.cancel()
    sampler.step()
    assert not sampler.busy


def test_run_forever_serves_threads_and_fails_leftovers_on_stop(loaded):
    sampler = Sampler(loaded)
    stop = threading.Event()
    runner = threading.Thread(target=sampler.run_forever, args=(stop,))
    runner.start()
    try:
        results = {}

        def client(i):
            results[i] = sampler.submit(ask(seed=i, max_tokens=4, ignore_eos=True)).result(timeout=60)

        clients = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(60)
        assert sorted(results) == [0, 1, 2] and all(
            len(r.completion_token_ids) == 4 for r in results.values()
        )
        assert (
            sampler.generate([ask(seed=0, max_tokens=4, ignore_eos=True)])[0].completion_token_ids
            == results[0].completion_token_ids
        )
        endless = sampler.submit(ask(seed=5, max_tokens=1500, ignore_eos=True))
    finally:
        stop.set()
        runner.join(60)
    with pytest.raises(SampleRequestError) as info:
        endless.result(timeout=5)
    assert info.value.code == "sampler_stopped"


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (ask(temperature=-1), "invalid_request"),
        (ask(top_p=0), "invalid_request"),
        (SampleRequest(), "invalid_request"),
        (SampleRequest(messages=[{"role": "user", "content": "x"}], prompt_token_ids=[1]), "invalid_request"),
        (SampleRequest(prompt_token_ids=[10**9]), "invalid_request"),
        (SampleRequest(prompt_token_ids=[5] * 5000), "context_length_exceeded"),
        (ask(thinking=False, thinking_budget_tokens=4), "invalid_request"),
        (ask(adapter="nope"), "adapter_not_found"),
        (SampleRequest(messages=[{"role": "user", "content": "x"}], seed=-1), "invalid_request"),
    ],
)
def test_bad_requests_fail_with_codes(sampler, request_, code):
    handle = sampler.submit(request_)
    sampler.step()
    with pytest.raises(SampleRequestError) as info:
        handle.result(timeout=5)
    assert info.value.code == code


def test_result_carries_identities_usage_and_timing(sampler, loaded):
    result = sampler.generate([ask(seed=8, max_tokens=6)])[0]
    assert result.behavior_policy == {
        "served_model_id": loaded.served_model_id,
        "base_model_sha256": loaded.identity["base_model_sha256"],
        "inference_config_sha256": loaded.identity["inference_config_sha256"],
        "implementation": loaded.identity["implementation"],
    }
    assert result.tokenizer == loaded.identity["tokenizer"] and result.adapter is None
    assert result.generation_backend == "torch-cpu"
    assert set(result.timing) == {"queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "total_ms"}
    assert all(v >= 0 for v in result.timing.values())
    assert result.timing["total_ms"] >= result.timing["ttft_ms"]
    assert result.usage["total_tokens"] == result.usage["prompt_tokens"] + result.usage["completion_tokens"]


def test_the_lean_and_transformers_forwards_sample_alike(loaded, sampler):
    """The sampler decodes through the lean forward; a model it cannot cover takes the
    transformers forward. Both must give one behaviour: same tokens for a seed, same log-probs."""
    assert sampler.forward_path == "lean"
    fallback = Sampler(loaded)
    fallback.forward_path = "transformers"  # as for an unsupported architecture
    requests = [
        ask(seed=21, max_tokens=20, ignore_eos=True),
        ask("Hello!", thinking=False, seed=22, max_tokens=12, temperature=0.8, top_p=0.9),
        ask("What is 3 + 4? Reply with just the number.", seed=23, max_tokens=8, repetition_penalty=1.4),
    ]
    lean = sampler.generate(requests)
    hf = fallback.generate(requests)
    for a, b in zip(lean, hf, strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)
    assert len({tuple(r.completion_token_ids) for r in lean}) == 3
