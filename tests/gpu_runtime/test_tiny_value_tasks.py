"""The third warm-up phase's episodes: enum members to copy, integer ranges as environments draw them."""

from __future__ import annotations

import random
from collections import Counter

from gpu_runtime.tiny_schema_tasks import KEY_WORDS, STRING_WORDS, SchemaEpisodes, is_held_out_key
from gpu_runtime.tiny_value_tasks import (
    MEMBER_WORDS,
    ThirdPhaseSampler,
    ValueEpisodes,
    is_held_out_member,
)
from openenv.client.actions import ActionSchema, parse_and_validate_action
from tests.gpu_runtime.test_tiny_schema_tasks import PIECES, _schema_of

# Actions real environments name most often; a probe of copying must not find them in training.
COMMON_ENVIRONMENT_MEMBERS = {"rock", "paper", "scissors", "hit", "stand", "heads", "tails", "buy", "sell",
                              "yellow", "banana", "cherry", "mango", "search", "calculator", "circle", "triangle"}


def _fields(schema: dict) -> dict:
    return {key: prop for key, prop in schema["properties"].items() if key != "metadata"}


def test_every_answer_is_valid_and_reads_each_value_from_its_own_field():
    episodes = ValueEpisodes(random.Random(3), PIECES)
    kinds, mixed = Counter(), 0
    for _ in range(600):
        schema, required, action = episodes.schema()
        messages, answer, _ = episodes.conversation(schema, required, action)
        assert _schema_of(messages) == schema
        parsed = parse_and_validate_action(answer, ActionSchema.compile(schema))
        assert list(parsed) == required
        for key, value in parsed.items():
            prop = schema["properties"][key]
            if "enum" in prop:
                assert value in prop["enum"]
            elif "minimum" in prop:
                assert prop["minimum"] <= value <= prop["maximum"]
        field_kinds = {"enum" if "enum" in p else p["type"] for p in _fields(schema).values()}
        kinds.update(field_kinds)
        mixed += len(field_kinds) > 1
    total = sum(kinds.values())
    assert kinds["enum"] / total > 0.3 and kinds["integer"] / total > 0.25  # the two kinds this phase is for
    assert {"string", "number", "boolean"} <= set(kinds)  # the others stay in practice
    assert mixed > 150  # fields of different types side by side: a value must come from its own field


def test_enum_members_must_be_copied_and_a_tenth_are_held_out():
    episodes = ValueEpisodes(random.Random(5), PIECES)
    members = [m for _ in range(800) for prop in _fields(episodes.schema()[0]).values() for m in prop.get("enum", ())]
    assert len(members) > 500 and not any(map(is_held_out_member, members))
    # the second phase's string words are members too, else a member could be told by not being one of them
    second_phase_words = set(STRING_WORDS) | set(KEY_WORDS)
    assert 0.15 < sum(m in second_phase_words for m in members) / len(members) < 0.4
    assert not set(members) & COMMON_ENVIRONMENT_MEMBERS and not set(MEMBER_WORDS) & COMMON_ENVIRONMENT_MEMBERS
    made_of_pieces = [m for m in members if m not in second_phase_words and m not in MEMBER_WORDS]
    assert len(made_of_pieces) / len(members) > 0.35  # nearly half can only be copied, never recalled
    held = ValueEpisodes(random.Random(5), PIECES)
    for _ in range(100):
        schema, required, _ = held.schema(held_out=True)
        assert all(map(is_held_out_key, required))
        assert all(is_held_out_member(m) for prop in _fields(schema).values() for m in prop.get("enum", ()))
    assert 0.05 < sum(is_held_out_member(f"m{i}") for i in range(2_000)) / 2_000 < 0.15


def test_integer_ranges_start_where_environments_start_them_and_values_reach_the_bounds():
    episodes = ValueEpisodes(random.Random(7), PIECES)
    lows, widths, at_edge, values = Counter(), [], 0, 0
    for _ in range(3_000):
        low, high = episodes.integer_bounds()
        lows[low] += 1
        widths.append(high - low)
        value = episodes.bounded_integer(low, high)
        assert low <= value <= high
        at_edge += value in (low, high)
        values += 1
    assert (lows[0] + lows[1]) / sum(lows.values()) > 0.4 and max(widths) >= 99 and min(widths) >= 1
    assert 0.35 < at_edge / values < 0.6  # EDGE_SHARE plus the uniform draws that land on a bound


def test_the_third_phase_stream_is_deterministic_and_keeps_the_second_phase_mix():
    a, b = ThirdPhaseSampler(2, PIECES, 0.65, 0.2), ThirdPhaseSampler(2, PIECES, 0.65, 0.2)
    drawn = [a.draw(0.25, 0.3) for _ in range(600)]
    assert drawn == [b.draw(0.25, 0.3) for _ in range(600)]
    schemas = [_schema_of(list(ex.messages)) for ex, _, _ in drawn if ex.kind == "openenv"]
    enums = sum(any("enum" in p for p in _fields(s).values()) for s in schemas)
    assert enums / len(schemas) > 0.4
    assert {ex.kind for ex, _, _ in drawn} >= {"arithmetic", "openenv"}
    # The second phase's stream is untouched by the hooks this phase overrides.
    plain = SchemaEpisodes(random.Random(3), PIECES)
    assert all(plain.integer_bounds()[0] in range(-5, 6) for _ in range(200))
