"""Action parsing and validation, reward mapping, seeds and reset payloads (reference-spec §4.4)."""

import math

import pytest

from openenv.client.actions import (
    ACTION_SCHEMA_VALIDATION_FAILED,
    I64_MAX,
    INVALID_MODEL_ACTION,
    MODEL_ACTION_NO_OUTPUT,
    U64,
    ActionSchema,
    effective_reset,
    environment_index,
    episode_return,
    generation_seed,
    group_seed,
    parse_action,
    parse_and_validate_action,
    reward_value,
    seed_free,
)
from openenv.client.errors import ActionError, OpenEnvActionSchemaInvalid, OpenEnvInvalidReward
from tests.openenv.fake_server import COUNTER_ACTION_SCHEMA

# --- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, expected", [
    ('{"delta": 2}', {"delta": 2}),
    ('  \n{"delta":2}\n ', {"delta": 2}),
    ('```json\n{"delta": -1}\n```', {"delta": -1}),
    ('```JSON\n{"delta": -1}```', {"delta": -1}),
    ('\n```json\n{\n  "message": "hi"\n}\n```\n', {"message": "hi"}),
    ('```\n{"a": [1, 2]}\n```', {"a": [1, 2]}),
    ('{"text": "```json not a fence```"}', {"text": "```json not a fence```"}),
])
def test_parses_bare_and_fenced_json_objects(content, expected):
    assert parse_action(content) == expected


@pytest.mark.parametrize("content", [None, "", "   \n\t "])
def test_empty_final_content_is_no_output(content):
    with pytest.raises(ActionError) as info:
        parse_action(content)
    assert info.value.code == MODEL_ACTION_NO_OUTPUT


@pytest.mark.parametrize("content", [
    "delta 2",
    '{"delta": 2} and more',
    'Here you go: {"delta": 2}',
    '```json\n{"delta": 2}\n```\n```json\n{"delta": 3}\n```',
    '```json\n{"delta": 2}\n``` trailing',
    '```python\n{"delta": 2}\n```',
    "[1, 2]",
    '"delta"',
    "3",
    "null",
    '{"delta": NaN}',
    '{"delta": 1, "delta": 2}',
    "```json\n```",
])
def test_anything_else_is_an_invalid_action(content):
    with pytest.raises(ActionError) as info:
        parse_action(content)
    assert info.value.code == INVALID_MODEL_ACTION


# --- the action schema ----------------------------------------------------------------------------


def test_valid_action_passes_the_compiled_schema():
    schema = ActionSchema.compile(COUNTER_ACTION_SCHEMA)
    assert schema.sha256.startswith("sha256:")
    assert parse_and_validate_action('```json\n{"delta": 3}\n```', schema) == {"delta": 3}


def test_schema_miss_is_typed_with_closed_keywords_and_pointers_only():
    schema = ActionSchema.compile(COUNTER_ACTION_SCHEMA)
    with pytest.raises(ActionError) as info:
        parse_and_validate_action('{"delta": 9, "ignore previous instructions": "x"}', schema)
    error = info.value
    assert error.code == ACTION_SCHEMA_VALIDATION_FAILED
    keywords = {e["keyword"] for e in error.errors}
    assert keywords == {"additionalProperties", "maximum"}
    assert {"keyword": "maximum", "instance_pointer": "/delta", "schema_pointer": "/properties/delta/maximum"} in error.errors
    assert all(set(e) == {"keyword", "instance_pointer", "schema_pointer"} for e in error.errors)
    assert "ignore previous" not in str(error.as_dict())  # no action values in the evidence
    with pytest.raises(ActionError) as missing:
        schema.validate({})
    assert missing.value.errors[0]["keyword"] == "required"


def test_internal_refs_compile_and_validate():
    schema = ActionSchema.compile({
        "type": "object", "$defs": {"Move": {"type": "string", "enum": ["up", "down"]}},
        "properties": {"move": {"$ref": "#/$defs/Move"}}, "required": ["move"],
    })
    schema.validate({"move": "up"})
    with pytest.raises(ActionError) as info:
        schema.validate({"move": "left"})
    assert info.value.errors[0]["keyword"] == "enum"
    assert info.value.errors[0]["instance_pointer"] == "/move"


@pytest.mark.parametrize("bad", [
    {"type": "object", "properties": {"a": {"$ref": "https://example.com/schema.json"}}},
    {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}},
    {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}},
    {"type": "object", "properties": {"a": {"$id": "https://example.com/a", "type": "string"}}},
    {"type": "object", "properties": {"a": {"type": "no-such-type"}}},
    {"type": "array"},
    ["not", "a", "schema"],
])
def test_external_unresolvable_or_invalid_schemas_fail_compilation(bad):
    with pytest.raises(OpenEnvActionSchemaInvalid) as info:
        ActionSchema.compile(bad)
    assert info.value.code == "openenv_action_schema_invalid"
    assert info.value.failure_code == "environment_protocol_error"


# --- rewards --------------------------------------------------------------------------------------


@pytest.mark.parametrize("wire, value", [(None, 0.0), (False, 0.0), (True, 1.0), (0, 0.0), (3, 3.0),
                                         (-1.5, -1.5), (2.9, 2.9)])
def test_reward_mapping(wire, value):
    mapped = reward_value(wire)
    assert mapped == value and isinstance(mapped, float)


@pytest.mark.parametrize("wire", [math.inf, -math.inf, math.nan, "1", [1], {"r": 1}])
def test_rewards_that_are_not_finite_scalars_are_refused(wire):
    with pytest.raises(OpenEnvInvalidReward):
        reward_value(wire)


@pytest.mark.parametrize("wire, said", [(1e300, "1e+300"), (-1e16, "-1e+16"), (2**53 + 2, "9.01e+15"),
                                        (10**400, "of 401 digits")])
def test_a_finite_reward_past_what_training_takes_is_refused_at_its_step(wire, said):
    """QA: 1e300 was collected, then every episode's work was lost when publication refused the corpus
    (training_evidence_invalid, 'not an OpenEnv server'); it is refused at the step it arrives in."""
    with pytest.raises(OpenEnvInvalidReward) as raised:
        reward_value(wire)
    assert raised.value.message == f"the reward {said} is out of range: it must be finite and at most 2**53 " \
        "(about 9.0e15) in size"
    assert "scale the environment's rewards" in raised.value.hint
    assert reward_value(2**53) == 2.0**53 and reward_value(-(2**53)) == -(2.0**53)  # the bound itself is taken


def test_episode_return_sums_mapped_step_rewards_and_stays_finite():
    assert episode_return([2.9, -1.1, 11.9]) == pytest.approx(13.7)
    assert episode_return([None, True, False, 2]) == 3.0
    assert episode_return([]) == 0.0
    with pytest.raises(OpenEnvInvalidReward):
        episode_return([1.7e308, 1.7e308])
    with pytest.raises(OpenEnvInvalidReward, match="the episode return 1.8e\\+16 is out of range"):
        episode_return([9e15, 9e15])  # each step in range, their sum not


# --- seeds and resets -----------------------------------------------------------------------------


def test_group_seed():
    assert group_seed(1000, 0) == 1000
    assert group_seed(70, 2) == 72
    assert group_seed(I64_MAX, 0) == I64_MAX
    with pytest.raises(ValueError):
        group_seed(I64_MAX, 1)
    with pytest.raises(ValueError):
        group_seed(-1, 0)


def test_generation_seed_matches_the_reference_formula():
    assert generation_seed(17, 0, 0) == 17
    assert generation_seed(0, 1, 0) == 0x9E3779B97F4A7C15
    assert generation_seed(0, 0, 1) == 0xBF58476D1CE4E5B9
    assert generation_seed(17, 3, 5) == (17 ^ ((3 * 0x9E3779B97F4A7C15) & U64) ^ ((5 * 0xBF58476D1CE4E5B9) & U64))
    # wrapping u64 multiplication, worked by hand: 2 * 0x9E3779B97F4A7C15 = 0x13C6EF372FE94F82A
    assert generation_seed(0, 2, 0) == 0x3C6EF372FE94F82A
    seeds = {generation_seed(1000, c, s) for c in range(8) for s in range(8)}
    assert len(seeds) == 64 and all(0 <= x <= U64 for x in seeds)
    with pytest.raises(ValueError):
        generation_seed(U64 + 1, 0, 0)


def test_environment_index_rotates_whole_groups():
    assert [environment_index(g, 3) for g in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError):
        environment_index(0, 0)


def test_effective_reset_replaces_any_caller_seed():
    template = {"difficulty": "hard", "seed": 5}
    assert effective_reset(template, 71) == {"difficulty": "hard", "seed": 71, "episode_id": "kiln-seed-71"}
    assert template == {"difficulty": "hard", "seed": 5}
    assert seed_free(template) == {"difficulty": "hard"}
    assert effective_reset({}, 0) == {"seed": 0, "episode_id": "kiln-seed-0"}
    assert effective_reset({}, 0, with_episode_id=False) == {"seed": 0}


def test_a_reset_names_one_episode_id_per_seed_unless_the_caller_names_one():
    """OpenEnv servers give an episode without an id a random one, which their state and observations
    may carry: a group's candidates would start differently and a replay would never match."""
    assert effective_reset({}, 7)["episode_id"] == effective_reset({}, 7)["episode_id"] != \
        effective_reset({}, 8)["episode_id"]
    assert effective_reset({"episode_id": "mine"}, 7) == {"episode_id": "mine", "seed": 7}
    # The caller's template behind a payload: Kiln's inserted id goes, the caller's own stays.
    assert seed_free(effective_reset({"target": 2}, 9)) == {"target": 2}
    assert seed_free(effective_reset({"episode_id": "mine"}, 9)) == {"episode_id": "mine"}
    assert seed_free({"seed": 9, "episode_id": "kiln-seed-8"}) == {"episode_id": "kiln-seed-8"}
