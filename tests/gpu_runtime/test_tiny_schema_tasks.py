"""The second warm-up phase's episodes: schema-valid answers, keys the model must copy, a held-out split."""

from __future__ import annotations

import json
import random
import string

from core.contracts.openenv_prompt import system_prompt
from gpu_runtime.tiny_schema_tasks import (
    KEY_WORDS,
    SchemaEpisodes,
    SecondPhaseSampler,
    action_reasoning,
    is_held_out_key,
)
from gpu_runtime.tiny_tasks import TaskSampler
from openenv.client.actions import ActionSchema, parse_and_validate_action
from openenv.collector.prompts import assistant_message

# Stand-ins for the tokenizer's letter-only pieces (the recipe passes the real ones).
SYSTEM_PROMPT_OPENING = system_prompt(
    {"identity": {"metadata": {"name": "x", "description": ""}}, "schema": {"action": {}}}).split("'")[0]
PIECES = sorted({a + b for a in "aeiou" for b in "bdgklmnprst"} | set(string.ascii_lowercase))


def _schema_of(messages: list[dict]) -> dict:
    return json.loads(messages[0]["content"].split("JSON Schema:\n", 1)[1].split("\n", 1)[0])


def _is_counter_or_bandit(example) -> bool:
    """A first-phase OpenEnv episode: one bounded integer under one of its eight names."""
    if example.kind != "openenv":
        return False
    required = _schema_of(list(example.messages))["required"]
    return len(required) == 1 and required[0] in {"delta", "step", "move", "amount", "arm", "index", "choice", "option"}


def test_every_answer_passes_the_schema_kilns_validator_compiles_and_keeps_required_order():
    episodes = SchemaEpisodes(random.Random(3), PIECES)
    kinds = set()
    for _ in range(400):
        schema, required, action = episodes.schema()
        messages, answer, reasoning = episodes.conversation(schema, required, action)
        assert messages[0]["role"] == "system" and messages[0]["content"].startswith(SYSTEM_PROMPT_OPENING)
        assert _schema_of(messages) == schema
        parsed = parse_and_validate_action(answer, ActionSchema.compile(schema))
        assert list(parsed) == required, "the answer names every required field, in the schema's order"
        assert reasoning == ", ".join(f"{k} = {json.dumps(v)}" for k, v in parsed.items())
        for prop in schema["properties"].values():
            kinds.add("enum" if "enum" in prop else prop["type"])
        for earlier in messages[2::2]:  # earlier actions in the conversation are valid too
            assert earlier["role"] == "assistant"
            parse_and_validate_action(earlier["content"], ActionSchema.compile(schema))
    assert kinds == {"integer", "number", "string", "enum", "boolean", "object"}


def test_held_out_keys_never_reach_the_training_stream_and_made_up_keys_cover_every_piece():
    stream = SchemaEpisodes(random.Random(5), PIECES)
    keys = [stream.key() for _ in range(5_000)]
    assert not any(is_held_out_key(k) for k in keys)
    assert 0.2 < sum(k in KEY_WORDS for k in keys) / len(keys) < 0.4
    used = {piece for key in keys if key not in KEY_WORDS and "_" not in key for piece in PIECES if piece in key}
    assert used == set(PIECES)
    held = SchemaEpisodes(random.Random(5), PIECES)
    assert all(is_held_out_key(held.key(held_out=True)) for _ in range(200))
    # About one key in ten is held out; the named ones a probe uses are stable.
    assert 0.05 < sum(map(is_held_out_key, (f"k{i}" for i in range(2_000)))) / 2_000 < 0.15
    assert is_held_out_key("color") and not is_held_out_key("guess")


def test_the_second_phase_stream_is_deterministic_and_mixes_in_the_first_phase():
    a, b = SecondPhaseSampler(1, PIECES, 0.7, 0.15), SecondPhaseSampler(1, PIECES, 0.7, 0.15)
    drawn = [a.draw(0.25, 0.3) for _ in range(600)]
    assert drawn == [b.draw(0.25, 0.3) for _ in range(600)]
    examples = [example for example, _, _ in drawn]
    openenv_share = sum(ex.kind == "openenv" for ex in examples) / len(examples)
    assert 0.78 < openenv_share < 0.93  # 70% random schemas, 15% counter/bandit, the first phase's 9% of 15%
    assert sum(map(_is_counter_or_bandit, examples)) / len(examples) > 0.12
    assert {"arithmetic", "openenv"} <= {ex.kind for ex in examples}
    assert 0.18 < sum(thinking for _, thinking, _ in drawn) / len(drawn) < 0.32
    only_first = SecondPhaseSampler(1, PIECES, 0.0, 0.0)
    reference = TaskSampler(2)
    assert [only_first.draw(0.25, 0.3)[0] for _ in range(50)] == [reference.sample() for _ in range(50)]


def test_with_thinking_on_earlier_actions_carry_their_reasoning_as_the_collector_sends_them():
    sampler = SecondPhaseSampler(4, PIECES, 0.7, 0.15)
    seen = {True: 0, False: 0}
    for _ in range(400):
        example, thinking, _ = sampler.draw(0.5, 0.3)
        if example.messages is None:
            continue
        for message in example.messages:
            if message["role"] != "assistant":
                assert "reasoning_content" not in message
                continue
            content = message["content"]
            expected = assistant_message(action_reasoning(json.loads(content)), content, thinking)
            assert message == expected  # the exact message `openenv.collector` builds for this turn
            seen[thinking] += 1
    assert seen[True] > 20 and seen[False] > 20


def test_the_first_phase_draw_keeps_its_recipe_order():
    # The first phase's bytes depend on this order: the example, then the thinking and system coins.
    a, b = TaskSampler(9), TaskSampler(9)
    for _ in range(100):
        assert a.draw(0.25, 0.3) == (b.sample(), b.coin(0.25), b.coin(0.3))
