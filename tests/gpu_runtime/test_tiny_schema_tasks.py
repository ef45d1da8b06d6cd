"""The second warm-up phase's episodes: schema-valid answers, keys the model must copy, a held-out split."""

from __future__ import annotations

import json
import random
import string

from core.contracts.openenv_prompt import system_prompt
from gpu_runtime.tiny_schema_tasks import KEY_WORDS, SchemaEpisodes, SecondPhaseSampler, is_held_out_key
from gpu_runtime.tiny_tasks import TaskSampler
from openenv.client.actions import ActionSchema, parse_and_validate_action

# Stand-ins for the tokenizer's letter-only pieces (the recipe passes the real ones).
SYSTEM_PROMPT_OPENING = system_prompt(
    {"identity": {"metadata": {"name": "x", "description": ""}}, "schema": {"action": {}}}).split("'")[0]
PIECES = sorted({a + b for a in "aeiou" for b in "bdgklmnprst"} | set(string.ascii_lowercase))


def _schema_of(messages: list[dict]) -> dict:
    return json.loads(messages[0]["content"].split("JSON Schema:\n", 1)[1].split("\n", 1)[0])


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
    assert sum(k in KEY_WORDS for k in keys) / len(keys) > 0.3
    used = {piece for key in keys if key not in KEY_WORDS and "_" not in key for piece in PIECES if piece in key}
    assert used == set(PIECES)
    held = SchemaEpisodes(random.Random(5), PIECES)
    assert all(is_held_out_key(held.key(held_out=True)) for _ in range(200))
    # About one key in ten is held out; the named ones a probe uses are stable.
    assert 0.05 < sum(map(is_held_out_key, (f"k{i}" for i in range(2_000)))) / 2_000 < 0.15
    assert is_held_out_key("color") and not is_held_out_key("guess")


def test_the_second_phase_stream_is_deterministic_and_mixes_in_the_first_phase():
    a, b = SecondPhaseSampler(1, PIECES, 0.7), SecondPhaseSampler(1, PIECES, 0.7)
    drawn = [a.sample() for _ in range(300)]
    assert drawn == [b.sample() for _ in range(300)]
    openenv_share = sum(ex.kind == "openenv" for ex in drawn) / len(drawn)
    assert 0.62 < openenv_share < 0.83  # 70% random schemas + the first phase's own 9% of 30%
    kinds = {ex.kind for ex in drawn}
    assert {"arithmetic", "openenv"} <= kinds
    only_first = SecondPhaseSampler(1, PIECES, 0.0)
    reference = TaskSampler(2)
    assert [only_first.sample() for _ in range(50)] == [reference.sample() for _ in range(50)]
