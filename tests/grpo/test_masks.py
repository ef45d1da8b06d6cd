"""Trajectory masks with a fake ChatML renderer and a one-character-per-token encoder."""

import pytest

from gpu_runtime.grpo.masks import MaskBuildError, TurnSegment, build_trajectory_masks, sum_token_counts


def chatml(messages):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def chars(text):
    """One token per character, with exact offsets: token counts equal character counts."""
    return [ord(c) for c in text], [(i, i + 1) for i in range(len(text))]


PROMPT = [{"role": "user", "content": "Compute 6*7."}]
WARNING = "WARNING: slow\n"
TRAJECTORY = [
    {"role": "assistant", "content": "run(6*7)", "kind": "action"},
    {"role": "tool", "content": WARNING + "42", "kind": "observation", "warning_prefix_len": len(WARNING)},
    {"role": "system", "content": "note", "kind": "context"},
    {"role": "assistant", "content": "42", "kind": "action"},
]


def spans_of(mask, text):
    """The masked characters as strings of consecutive runs."""
    runs, current = [], ""
    for on, ch in zip(mask, text, strict=True):
        if on:
            current += ch
        elif current:
            runs.append(current)
            current = ""
    return runs + ([current] if current else [])


def test_action_and_env_masks_follow_segment_kinds():
    masks = build_trajectory_masks(PROMPT, TRAJECTORY, render=chatml, encode=chars)
    text = "".join(map(chr, masks.input_ids))
    assert text == chatml(PROMPT + [{"role": s["role"], "content": s["content"]} for s in TRAJECTORY])
    assert spans_of(masks.action_mask, text) == ["run(6*7)", "42"]
    assert spans_of(masks.env_mask, text) == ["42"]  # the warning prefix is filtered out
    assert masks.observation_tokens == len(WARNING) + 2  # |O| counts the full observation
    assert masks.token_counts == {
        "action_tokens": 10,
        "env_tokens": 2,
        "env_tokens_before_warning_filter": len(WARNING) + 2,
        "env_tokens_after_warning_filter": 2,
        "warning_tokens_filtered": len(WARNING),
        "context_tokens": len(text) - 10 - len(WARNING) - 2,
    }
    assert not any(a and e for a, e in zip(masks.action_mask, masks.env_mask, strict=True))
    assert [kind for _, _, kind in masks.segment_spans] == ["action", "observation", "action"]


def test_full_obs_and_disabled_filter_keep_the_warning():
    for kwargs in ({"env_mask_mode": "full_obs"}, {"warning_filter": False}):
        masks = build_trajectory_masks(PROMPT, TRAJECTORY, render=chatml, encode=chars, **kwargs)
        text = "".join(map(chr, masks.input_ids))
        assert spans_of(masks.env_mask, text) == [WARNING + "42"]
        assert masks.token_counts["warning_tokens_filtered"] == 0


def test_harness_errors_with_full_length_warning_are_never_trained():
    error = '{"openenv_error":"x","recoverable":true,"done":false}'
    trajectory = [
        {"role": "assistant", "content": "bad", "kind": "action"},
        {"role": "tool", "content": error, "kind": "observation", "warning_prefix_len": len(error)},
    ]
    masks = build_trajectory_masks(PROMPT, trajectory, render=chatml, encode=chars)
    assert masks.token_counts["env_tokens"] == 0 and masks.observation_tokens == len(error)


def test_warning_prefix_is_measured_in_bytes():
    segment = TurnSegment(role="tool", content="é!ok", kind="observation", warning_prefix_len=1)
    assert segment.warning_chars() == 1  # a byte count inside "é" counts the whole character
    assert (
        TurnSegment(role="tool", content="é!ok", kind="observation", warning_prefix_len=2).warning_chars()
        == 1
    )
    assert (
        TurnSegment(role="tool", content="é!ok", kind="observation", warning_prefix_len=3).warning_chars()
        == 2
    )
    assert (
        TurnSegment(role="tool", content="é!ok", kind="observation", warning_prefix_len=99).warning_chars()
        == 4
    )
    masks = build_trajectory_masks(
        PROMPT,
        [
            {"role": "assistant", "content": "a", "kind": "action"},
            {"role": "tool", "content": "é!ok", "kind": "observation", "warning_prefix_len": 2},
        ],
        render=chatml,
        encode=chars,
    )
    assert spans_of(masks.env_mask, "".join(map(chr, masks.input_ids))) == ["!ok"]


def test_tokens_straddling_action_and_observation_are_rejected():
    def glued(messages):
        return "".join(m["content"] for m in messages)

    def triples(text):
        offsets = [(i, min(i + 3, len(text))) for i in range(0, len(text), 3)]
        return list(range(len(offsets))), offsets

    prompt = [{"role": "user", "content": "hi "}]
    trajectory = [
        {"role": "assistant", "content": "ab", "kind": "action"},
        {"role": "tool", "content": "cd", "kind": "observation"},
    ]
    # "hi abcd": tokens "hi ", "abc", "d" -> "abc" overlaps both segments
    with pytest.raises(MaskBuildError, match="overlap"):
        build_trajectory_masks(prompt, trajectory, render=glued, encode=triples)


def test_template_that_rewrites_content_falls_back_to_ordered_search():
    def annotated(messages):  # renders a per-message length, so sentinels change the text
        return "".join(f"[{m['role']}:{len(m['content'])}]{m['content']}|" for m in messages)

    trajectory = [
        {"role": "assistant", "content": "7", "kind": "action"},
        {"role": "tool", "content": "ok 7", "kind": "observation"},
    ]
    masks = build_trajectory_masks(PROMPT, trajectory, render=annotated, encode=chars)
    text = "".join(map(chr, masks.input_ids))
    assert spans_of(masks.action_mask, text) == ["7"]
    assert text[masks.action_mask.index(True) - 1] == "]"  # the content, not the "7" in 'Compute 6*7'
    assert spans_of(masks.env_mask, text) == ["ok 7"]


def test_content_not_rendered_verbatim_is_an_error():
    def stripping(messages):
        return "".join(f"<{m['role']}>{m['content'].strip().upper()}" for m in messages)

    with pytest.raises(MaskBuildError, match="verbatim"):
        build_trajectory_masks(
            PROMPT,
            [{"role": "assistant", "content": " hello ", "kind": "action"}],
            render=stripping,
            encode=chars,
        )


def test_segment_validation():
    with pytest.raises(MaskBuildError):
        TurnSegment(role="assistant", content="x", kind="reasoning")
    with pytest.raises(MaskBuildError):
        TurnSegment(role="tool", content="x", kind="observation", warning_prefix_len=-1)
    with pytest.raises(MaskBuildError):
        build_trajectory_masks(
            [],
            [{"role": "assistant", "content": "x", "kind": "action"}],
            render=lambda m: m[0]["content"],
            encode=chars,
        )  # no prompt: token 0 is an action


def test_sum_token_counts():
    one = build_trajectory_masks(PROMPT, TRAJECTORY, render=chatml, encode=chars)
    total = sum_token_counts([one, one])
    assert total["action_tokens"] == 20 and total["warning_tokens_filtered"] == 2 * len(WARNING)


def test_real_tokenizer_and_kiln_chat_template():
    """The tiny model's BPE tokenizer and Qwen3-style template (thinking action included)."""
    from gpu_runtime.grpo.masks import hf_encode, hf_render
    from gpu_runtime.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(["Compute 6*7. run(6*7) WARNING: slow result 42 Let me think."] * 20)
    trajectory = [
        {"role": "assistant", "content": "Let me think.\n</think>\n\nrun(6*7)", "kind": "action"},
        {"role": "tool", "content": "WARNING: slow\n42", "kind": "observation", "warning_prefix_len": 14},
        {"role": "assistant", "content": "The answer is 42", "kind": "action"},
    ]
    masks = build_trajectory_masks(
        PROMPT, trajectory, render=hf_render(tokenizer), encode=hf_encode(tokenizer)
    )
    picked = lambda mask: tokenizer.decode([t for t, on in zip(masks.input_ids, mask, strict=True) if on])  # noqa: E731
    assert picked(masks.action_mask) == "Let me think.\n</think>\n\nrun(6*7)" + "The answer is 42"
    assert picked(masks.env_mask) == "42"
    assert masks.token_counts["warning_tokens_filtered"] > 0
    assert tokenizer.decode(masks.input_ids).startswith("<|im_start|>user\nCompute 6*7.<|im_end|>")
