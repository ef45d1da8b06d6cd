"""Where a model opens `<think>` itself (a template that leaves it to the model, as original Qwen3
does), reasoning starts only when `<think>` is the answer's first token and thinking was asked
for. Elsewhere it is content: reasoning + content must still cover the decoded text byte for byte,
or a client that binds the answer to its provenance digest (the OpenEnv collector) refuses it.
Found by a damaged adapter that wrote `<think>` mid-answer in an OpenEnv evaluation."""

from __future__ import annotations

import torch

from gpu_runtime.sample_types import SampleRequest
from gpu_runtime.sampling import SamplingParams
from gpu_runtime.sequence import DecodeSequence, ThinkingTokens

PIECES = {1: "<think>", 2: "</think>", 3: "plan", 4: '{"delta": 2}', 5: "noise ", 9: ""}
TOKENS = ThinkingTokens(open_id=1, close_id=2, turn_start_id=None, close_sequence=(2,))


class Pieces:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(PIECES[i] for i in ids)


def _result(completion: list[int], *, thinking: bool):
    request = SampleRequest(prompt_token_ids=[7, 8], sampling=SamplingParams(temperature=1.0, max_tokens=16),
                            seed=1, enable_thinking=thinking)
    base = {"sampling": {}, "template_invocation": {}, "behavior_policy": {}, "tokenizer": {},
            "generation_backend": "test"}
    sequence = DecodeSequence(request, None, prompt_ids=[7, 8], prompt_text=None, adapter=None, thinking=TOKENS,
                              eos_ids=(9,), tokenizer=Pieces(), vocab_size=10, device=torch.device("cpu"),
                              max_context=64, provenance_base=base, created_at=0.0)
    for token in completion:
        sequence.accept(token, -0.5, "sampled")
    return sequence.result()


def test_a_first_token_think_opens_reasoning_when_thinking_is_on():
    result = _result([1, 3, 2, 4, 9], thinking=True)
    assert (result.reasoning_content, result.content) == ("plan", '{"delta": 2}')
    assert result.reasoning_content + "</think>" + result.content == result.text.removeprefix("<think>")


def test_a_think_later_in_the_answer_is_content_and_nothing_is_dropped():
    result = _result([5, 1, 3, 2, 4, 9], thinking=True)
    assert result.reasoning_content is None
    assert result.content == result.text == 'noise <think>plan</think>{"delta": 2}'
    assert result.usage["reasoning_tokens"] == 0


def test_with_thinking_off_a_first_token_think_is_content():
    result = _result([1, 3, 2, 4, 9], thinking=False)
    assert result.reasoning_content is None and result.content == result.text
