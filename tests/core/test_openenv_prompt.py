"""The OpenEnv system prompt shows an action schema's local `$ref`s inlined (core.contracts.openenv_prompt)."""

from __future__ import annotations

import json
from enum import StrEnum

from pydantic import BaseModel, Field

from core.contracts.openenv_prompt import inline_definitions, system_prompt


class Move(StrEnum):
    rock = "rock"
    paper = "paper"
    scissors = "scissors"


class Throw(BaseModel):
    move: Move = Field(..., description="Your move")
    stake: int = Field(1, ge=1, le=5)


class Node(BaseModel):
    label: str
    children: list[Node] = []


def _environment(action: dict) -> dict:
    return {"identity": {"metadata": {"name": "rps", "description": "Rock, paper, scissors."}},
            "schema": {"action": action}}


def test_an_enum_class_field_is_shown_as_its_members_with_the_fields_own_keys():
    schema = Throw.model_json_schema()
    assert "$ref" in json.dumps(schema)  # how Pydantic declares it
    shown = inline_definitions(schema)
    assert shown["properties"]["move"] == {"description": "Your move", "enum": ["rock", "paper", "scissors"],
                                           "title": "Move", "type": "string"}
    assert "$defs" not in shown and shown["properties"]["stake"] == schema["properties"]["stake"]
    prompt = system_prompt(_environment(schema))
    assert '"enum": ["rock", "paper", "scissors"]' in prompt and "$ref" not in prompt
    assert schema == Throw.model_json_schema()  # the environment's own schema is untouched (validation uses it)


def test_schemas_it_cannot_inline_are_shown_as_they_are():
    recursive = Node.model_json_schema()
    assert inline_definitions(recursive) is recursive
    remote = {"type": "object", "$defs": {"A": {"type": "string"}},
              "properties": {"a": {"$ref": "https://example.com/a.json"}}}
    assert inline_definitions(remote) is remote
    plain = {"type": "object", "properties": {"delta": {"type": "integer"}}}
    named_ref = {"type": "object", "$defs": {"A": {"type": "string"}},
                 "properties": {"$ref": {"type": "string"}, "a": {"$ref": "#/$defs/A"}}}  # a field called "$ref"
    assert inline_definitions(named_ref)["properties"] == {"$ref": {"type": "string"}, "a": {"type": "string"}}
    assert inline_definitions(plain) is plain
    assert system_prompt(_environment(plain)).count(json.dumps(plain, sort_keys=True)) == 1
    # one large definition used many times would be repeated at each use: kept as references
    big = {"type": "object", "$defs": {"Big": {"enum": [f"member-{i}" for i in range(300)], "type": "string"}},
           "properties": {f"f{i}": {"$ref": "#/$defs/Big"} for i in range(10)}}
    assert inline_definitions(big) is big


def test_draft_7_definitions_and_nested_references_inline_too():
    schema = {"type": "object", "definitions": {"Side": {"enum": ["buy", "sell"]},
                                                "Order": {"type": "object", "properties": {"side": {"$ref": "#/definitions/Side"}}}},
              "properties": {"order": {"$ref": "#/definitions/Order"}}, "required": ["order"]}
    assert inline_definitions(schema) == {
        "type": "object", "required": ["order"],
        "properties": {"order": {"type": "object", "properties": {"side": {"enum": ["buy", "sell"]}}}}}
