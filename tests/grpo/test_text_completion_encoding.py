"""The text route's completions: a finished one is trained with its end token, one cut off at
`max_tokens` (`finish_reason: "length"`) without it, and a bad finish_reason is refused at admission.

Why it matters: appending an end token to a truncated completion trains the model to stop where
the sampler cut it off (and, with a negative advantage, not to stop where it did), a token the
policy never produced. Without finish_reason the text route cannot tell, and appends one.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from core.contracts.groups import GroupError, admit_groups
from core.contracts.grpo_config import GrpoConfig
from gpu_runtime.grpo.encoding import encode_groups

PROMPT = [{"role": "user", "content": "What is 4 + 5?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _encoded(tokenizer, completions):
    groups = admit_groups([{"messages": PROMPT, "completions": completions}]).groups
    [group] = encode_groups(groups, [0], tokenizer, GrpoConfig(), template_kwargs={"enable_thinking": False})
    return group.completions


def test_a_finished_completion_ends_with_the_end_token_and_a_truncated_one_does_not(tokenizer):
    eos = tokenizer.eos_token_id
    text_ids = tokenizer.encode("9999", add_special_tokens=False)
    finished, stopped, truncated = _encoded(tokenizer, [
        {"text": "9999", "reward": 1.0},
        {"text": "9999", "reward": 0.0, "finish_reason": "stop"},
        {"text": "9999", "reward": 0.0, "finish_reason": "length"},
    ])
    assert finished.input_ids[-len(text_ids) - 1:] == text_ids + [eos]
    assert stopped.input_ids == finished.input_ids
    assert truncated.input_ids == finished.input_ids[:-1] and truncated.input_ids[-1] != eos
    assert len(truncated.action_positions) == len(finished.action_positions) - 1 == len(text_ids)


def test_finish_reason_is_checked_and_kept_only_when_given():
    [group] = admit_groups([{"messages": PROMPT, "completions": [{"text": "9", "reward": 1, "finish_reason": "length"},
                                                                {"text": "8", "reward": 0}]}]).groups
    assert group["completions"][0]["finish_reason"] == "length" and "finish_reason" not in group["completions"][1]
    with pytest.raises(GroupError) as caught:
        admit_groups([{"messages": PROMPT, "completions": [{"text": "9", "reward": 1, "finish_reason": "eos"}]}])
    assert caught.value.field == "groups[0].completions[0].finish_reason"
