"""The model's side of an OpenEnv step: action parsing, schema validation, rewards and seeds.

Pure module: no Django, no torch, no network (reference-spec §4.4).
- `ActionSchema.compile` turns the discovered action JSON Schema into a validator once, at
  inspection; only internal `#...` references are allowed, and each must resolve.
- `parse_action` accepts the trimmed final content as one bare JSON value or one ```json fence,
  and requires an object; `ActionSchema.validate` checks it before any step, so a miss
  (`ACTION_SCHEMA_VALIDATION_FAILED`) never contacts the server. Its evidence keeps only closed
  JSON Schema keywords and JSON-Pointer paths.
- Rewards: null and false are 0, true is 1, numbers as they are; the return must stay finite.
- Seeds: group seed = seed_start + group_index (<= i64::MAX); generation seed =
  seed ^ (candidate * 0x9E3779B97F4A7C15) ^ (step * 0xBF58476D1CE4E5B9), wrapping u64.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import referencing.exceptions
from jsonschema import Draft202012Validator, SchemaError, validators
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from core.canonical import json_digest
from core.contracts.groups import MAX_REWARD_MAGNITUDE, REWARD_RANGE, reward_in_range
from openenv.client.errors import ActionError, OpenEnvActionSchemaInvalid, OpenEnvInvalidReward
from openenv.client.http import JsonError, strict_json

MODEL_ACTION_NO_OUTPUT = "MODEL_ACTION_NO_OUTPUT"
INVALID_MODEL_ACTION = "INVALID_MODEL_ACTION"
ACTION_SCHEMA_VALIDATION_FAILED = "ACTION_SCHEMA_VALIDATION_FAILED"

U64 = (1 << 64) - 1
I64_MAX = (1 << 63) - 1
CANDIDATE_MIX = 0x9E3779B97F4A7C15
STEP_MIX = 0xBF58476D1CE4E5B9
MAX_EVIDENCE = 16
MAX_POINTER_CHARS = 256

# The closed vocabulary evidence may name; anything else is reported as "unknown".
SCHEMA_KEYWORDS = frozenset({
    "$ref", "$dynamicRef", "additionalItems", "additionalProperties", "allOf", "anyOf", "const",
    "contains", "dependentRequired", "dependentSchemas", "dependencies", "enum", "exclusiveMaximum",
    "exclusiveMinimum", "false", "format", "if", "items", "maxContains", "maxItems", "maxLength",
    "maxProperties", "maximum", "minContains", "minItems", "minLength", "minProperties", "minimum",
    "multipleOf", "not", "oneOf", "pattern", "patternProperties", "prefixItems", "properties",
    "propertyNames", "required", "type", "unevaluatedItems", "unevaluatedProperties", "uniqueItems",
})

_FENCE = re.compile(r"\A```(?:json)?[ \t]*\r?\n(?P<body>.*?)\r?\n?```\Z", re.DOTALL | re.IGNORECASE)


def _pointer(parts: Iterable) -> str:
    text = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
    return text if len(text) <= MAX_POINTER_CHARS else text[: MAX_POINTER_CHARS - 3] + "..."


def _refs(node: Any, path: tuple = ()) -> Iterable[tuple[tuple, str, str]]:
    """Every ($ref-like keyword, value) in a schema document, with where it sits."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(value, str):
                yield path, key, value
            elif key in ("$id", "id") and path and isinstance(value, str):
                yield path, key, value
            else:
                yield from _refs(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _refs(value, (*path, index))


def _refuse_retrieval(uri: str):
    raise referencing.exceptions.NoSuchResource(ref=uri)


class ActionSchema:
    """The environment's action JSON Schema, compiled once."""

    def __init__(self, schema: Mapping | bool, validator):
        self.schema = schema
        self.sha256 = json_digest(schema)
        self._validator = validator

    @classmethod
    def compile(cls, schema: Any) -> ActionSchema:
        if not isinstance(schema, (Mapping, bool)):
            raise OpenEnvActionSchemaInvalid("the action schema must be a JSON object")
        if isinstance(schema, Mapping) and schema.get("type", "object") != "object":
            raise OpenEnvActionSchemaInvalid("the action schema must describe a JSON object")
        for path, keyword, value in _refs(schema):
            if keyword in ("$id", "id"):
                raise OpenEnvActionSchemaInvalid(f"the action schema sets {keyword} at {_pointer(path)}; "
                                                 "nested identifiers are not supported")
            if not value.startswith("#"):
                raise OpenEnvActionSchemaInvalid(
                    f"the action schema references {value[:120]!r} at {_pointer(path)}: only internal "
                    "#... references are allowed")
        validator_class = validators.validator_for(schema, default=Draft202012Validator)
        try:
            validator_class.check_schema(schema)
        except SchemaError as exc:
            raise OpenEnvActionSchemaInvalid(f"the action schema is not a valid JSON Schema: {exc.message[:300]}") from None
        registry = Registry(retrieve=_refuse_retrieval)
        if isinstance(schema, Mapping):
            resolver = registry.resolver_with_root(Resource.from_contents(schema, default_specification=DRAFT202012))
            for path, _keyword, value in _refs(schema):
                try:
                    resolver.lookup(value)
                except referencing.exceptions.Unresolvable:
                    raise OpenEnvActionSchemaInvalid(
                        f"the action schema reference {value[:120]!r} at {_pointer(path)} does not resolve") from None
        return cls(schema, validator_class(schema, registry=registry))

    def violations(self, action: Any) -> list[dict]:
        try:
            found = sorted(self._validator.iter_errors(action),
                           key=lambda e: (list(map(str, e.absolute_path)), list(map(str, e.absolute_schema_path))))
        except (referencing.exceptions.Unresolvable, RecursionError):
            return [{"keyword": "$ref", "instance_pointer": "", "schema_pointer": ""}]
        out = []
        for error in found[:MAX_EVIDENCE]:
            keyword = str(error.validator) if error.validator is not None else "false"
            out.append({
                "keyword": keyword if keyword in SCHEMA_KEYWORDS else "unknown",
                "instance_pointer": _pointer(error.absolute_path),
                "schema_pointer": _pointer(error.absolute_schema_path),
            })
        return out

    def validate(self, action: Any) -> None:
        errors = self.violations(action)
        if errors:
            first = errors[0]
            where = first["instance_pointer"] or "the action"
            raise ActionError(ACTION_SCHEMA_VALIDATION_FAILED,
                              f"the action does not match the action schema ({first['keyword']} at {where}; "
                              f"{len(errors)} problem(s))", errors=errors)


def parse_action(content: str | None) -> dict:
    """The action object from the model's final content (bare JSON or one ```json fence)."""
    text = (content or "").strip()
    if not text:
        raise ActionError(MODEL_ACTION_NO_OUTPUT, "the model produced no final answer")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group("body").strip()
    try:
        value = strict_json(text)
    except JsonError as exc:
        raise ActionError(INVALID_MODEL_ACTION, f"the model's answer is not one JSON value: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise ActionError(INVALID_MODEL_ACTION, f"the model's answer is JSON {type(value).__name__}, not an object")
    return value


def parse_and_validate_action(content: str | None, schema: ActionSchema) -> dict:
    action = parse_action(content)
    schema.validate(action)
    return action


def reward_value(wire: Any) -> float:
    """A wire reward as a training scalar: null/false -> 0, true -> 1, finite numbers as they are."""
    if wire is None or wire is False:
        return 0.0
    if wire is True:
        return 1.0
    if isinstance(wire, (int, float)):
        if reward_in_range(wire):
            return float(wire)
        if isinstance(wire, int) or math.isfinite(wire):  # a finite number past what training takes
            raise OpenEnvInvalidReward(f"the reward {_short(wire)} is out of range: it must be {REWARD_RANGE}",
                                       hint="scale the environment's rewards; Kiln trains on rewards of at most "
                                            "2**53 in size, and checks every step's")
    raise OpenEnvInvalidReward(f"the reward must be null, a boolean or a finite number, not {type(wire).__name__}")


def _short(number) -> str:
    if isinstance(number, float) or abs(number) < 10**300:
        return f"{float(number):.3g}"
    return f"of {len(str(abs(number)))} digits"  # an integer too large for a float


def episode_return(step_rewards: Iterable[Any]) -> float:
    """The sum of the mapped step rewards (the reset reward is not part of it); it must stay finite."""
    total = 0.0
    for reward in step_rewards:  # in step order, plain float addition (what every reader recomputes)
        total += reward_value(reward)
    if not math.isfinite(total):
        raise OpenEnvInvalidReward("the episode return is not finite")
    if abs(total) > MAX_REWARD_MAGNITUDE:
        raise OpenEnvInvalidReward(f"the episode return {total:.3g} is out of range: it must be {REWARD_RANGE}")
    return total


def group_seed(seed_start: int, group_index: int) -> int:
    for name, value in (("seed_start", seed_start), ("group_index", group_index)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer")
    seed = seed_start + group_index
    if seed > I64_MAX:
        raise ValueError(f"the group seed {seed} exceeds {I64_MAX}")
    return seed


def generation_seed(seed: int, candidate_index: int, step_index: int) -> int:
    """The sampling seed for one candidate's step (wrapping u64 arithmetic)."""
    for name, value in (("seed", seed), ("candidate_index", candidate_index), ("step_index", step_index)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64:
            raise ValueError(f"{name} must be an integer in [0, 2^64)")
    return (seed ^ ((candidate_index * CANDIDATE_MIX) & U64) ^ ((step_index * STEP_MIX) & U64)) & U64


def environment_index(group_index: int, environment_count: int) -> int:
    """Whole groups rotate across the environment URLs."""
    if environment_count < 1:
        raise ValueError("at least one environment is needed")
    return group_index % environment_count


def episode_id_for(seed: int) -> str:
    """The episode id Kiln sends with a group's reset when the caller's template names none.

    OpenEnv's servers give an episode without one a random id (`uuid4`), and many put it in their
    state and observations (the `openenv init` template's state, the counter env's metadata). The
    candidates of a group would then start from different observations (a rejected group), and a
    replay would never match the recorded final state. One id per seed keeps a group's starts
    identical and a replay's reset the same as the collection's."""
    return f"kiln-seed-{seed}"


def effective_reset(template: Mapping[str, Any], seed: int, *, with_episode_id: bool = True) -> dict:
    """The reset payload: the seed-free template with any caller `seed` removed and the group seed
    inserted, and (unless the template names one) the seed's episode id. `with_episode_id=False`: the
    payload of collections recorded before Kiln sent an episode id (verification still accepts them)."""
    if not isinstance(template, Mapping):
        raise ValueError("reset options must be a JSON object")
    payload = {k: v for k, v in template.items() if k != "seed"}
    payload["seed"] = seed
    if with_episode_id and "episode_id" not in payload:
        payload["episode_id"] = episode_id_for(seed)
    return payload


def seed_free(template: Mapping[str, Any]) -> dict:
    """The caller's template behind a reset payload: without the seed, and without the episode id Kiln
    inserted for that seed (a caller's own episode_id stays)."""
    seed = template.get("seed")
    inserted = episode_id_for(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None
    return {k: v for k, v in template.items()
            if k != "seed" and not (k == "episode_id" and inserted is not None and v == inserted)}
