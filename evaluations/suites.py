"""The eval suite contract: parse and bound a suite, check scorer specs, compute the suite hash.

Pure apart from one lookup: a `program` scorer must name a registered Scorer, checked through
the `scorer_exists` callable (by default a read of the scorer registry, imported lazily).

A suite (`kiln.eval-suite.v1`, stored as `<adapter_dir>/.eval/suites/<name>.json`):
    {"schema", "name", "description", "scorer": <spec>, "examples": [
        {"id", "messages": [{"role", "content"}, ...], "target"?, "scorer"?: <spec>, "metadata"?}],
     "suite_hash", "source", "created_at"}
Scorer specs (defaults filled in when parsed): exact, normalized_exact,
numeric_tolerance {tolerance ≥ 0, default 1e-6}, regex {pattern}, contains (the target is contained
in the completion), json_valid, json_schema {schema}, multiple_choice {choices}, program {scorer}.

`suite_hash` = sha256 over RFC 8785 canonical JSON of {"schema": "kiln.eval-suite.v1", "scorer",
"examples"} as parsed (defaults filled): what is scored and against what. The name, description,
source and time are excluded, so the same content registered under another name has the same hash.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from core.canonical import canonical_json, json_digest
from core.contracts.groups import MESSAGE_ROLES
from core.contracts.names import is_valid_name
from evaluations.example_scorers import NEEDS_TARGET, ScorerSpecError, parse_scorer_spec

SUITE_SCHEMA = "kiln.eval-suite.v1"
MAX_EXAMPLES = 10_000
MAX_MESSAGES = 256
MAX_ID_CHARS = 200
MAX_DESCRIPTION_CHARS = 2000
MAX_SUITE_BYTES = 32 * 1024 * 1024


class SuiteError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_name(name, field: str = "name") -> str:
    if name is None:
        raise SuiteError(field, "is required: a name of letters, digits, '.', '_' and '-' (at most 64, starting "
                                "with a letter or digit)")
    if not is_valid_name(name):
        raise SuiteError(field, f"{name!r} is not a valid name: use letters, digits, '.', '_' and '-' "
                                "(at most 64, starting with a letter or digit)")
    return name


def _registered_scorer(name: str) -> bool:
    from evaluations.selectors import scorer_get

    return scorer_get(name=name) is not None


def check_scorer_spec(spec, field: str = "scorer", *,
                      scorer_exists: Callable[[str], bool] | None = None) -> dict:
    """The scorer spec with its defaults filled in, or SuiteError naming the field.

    One checker for what is stored and what is scored: `example_scorers.parse_scorer_spec`; this
    adds only the registry lookup for a `program` scorer."""
    try:
        parsed = parse_scorer_spec(spec, field)
    except ScorerSpecError as exc:
        raise SuiteError(exc.field, exc.message) from None
    if parsed.needs_program and not (scorer_exists or _registered_scorer)(parsed.scorer):
        raise SuiteError(f"{field}.scorer", f"no registered scorer named {parsed.scorer!r}")
    return parsed.to_dict()


def _message(value, field: str) -> dict:
    if not isinstance(value, dict):
        raise SuiteError(field, "must be an object with role and content")
    if value.get("role") not in MESSAGE_ROLES:
        raise SuiteError(f"{field}.role", f"must be one of {', '.join(MESSAGE_ROLES)}")
    if not isinstance(value.get("content"), str):
        raise SuiteError(f"{field}.content", "must be a string")
    message = {"role": value["role"], "content": value["content"]}
    for optional in ("name", "tool_call_id", "tool_calls"):
        if optional in value:
            message[optional] = value[optional]
    return message


def _target(value, scorer: dict, field: str):
    if value is None:
        if scorer["type"] in NEEDS_TARGET:
            raise SuiteError(field, f"is required by scorer type {scorer['type']}")
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SuiteError(field, "must be a string or a number")
    if scorer["type"] == "numeric_tolerance":
        try:
            number = float(value)
        except ValueError:
            raise SuiteError(field, "must be a number (or a numeric string) for numeric_tolerance") from None
        if not math.isfinite(number):
            raise SuiteError(field, "must be finite")
    if scorer["type"] == "multiple_choice" and str(value) not in scorer["choices"]:
        raise SuiteError(field, f"must be one of the choices {scorer['choices']}")
    return value


def parse_example(value, index: int, suite_scorer: dict, *, scorer_exists=None) -> dict:
    field = f"examples[{index}]"
    if not isinstance(value, dict):
        raise SuiteError(field, "must be an object with id and messages")
    example_id = value.get("id")
    if isinstance(example_id, int) and not isinstance(example_id, bool):
        example_id = str(example_id)
    if not isinstance(example_id, str) or not example_id.strip() or len(example_id) > MAX_ID_CHARS:
        raise SuiteError(f"{field}.id", f"must be a non-empty string of at most {MAX_ID_CHARS} characters")
    if example_id != example_id.strip():
        # "a" and "a " would be two ids that look like one: rows, reruns and the gate pair by id.
        raise SuiteError(f"{field}.id", f"{example_id!r} has leading or trailing whitespace; ids must not "
                                        f"(use {example_id.strip()!r})")
    messages = value.get("messages")
    if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
        raise SuiteError(f"{field}.messages", f"must be a list of 1 to {MAX_MESSAGES} chat messages")
    example = {"id": example_id, "messages": [_message(m, f"{field}.messages[{i}]") for i, m in enumerate(messages)]}
    scorer = suite_scorer
    if value.get("scorer") is not None:
        scorer = check_scorer_spec(value["scorer"], f"{field}.scorer", scorer_exists=scorer_exists)
        example["scorer"] = scorer
    target = _target(value.get("target"), scorer, f"{field}.target")
    if target is not None:
        example["target"] = target
    metadata = value.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise SuiteError(f"{field}.metadata", "must be an object")
        example["metadata"] = metadata
    return example


def suite_hash(scorer: dict, examples: list[dict]) -> str:
    return json_digest({"schema": SUITE_SCHEMA, "scorer": scorer, "examples": examples})


def parse_suite(body, *, scorer_exists=None) -> dict:
    """A suite request checked and bounded: {name, description, scorer, examples, suite_hash}."""
    if not isinstance(body, dict):
        raise SuiteError("suite", "must be a JSON object with name, scorer and examples")
    name = check_name(body.get("name"))
    description = body.get("description") or ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        raise SuiteError("description", f"must be a string of at most {MAX_DESCRIPTION_CHARS} characters")
    scorer = check_scorer_spec(body.get("scorer"), scorer_exists=scorer_exists)
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise SuiteError("examples", "must be a non-empty list")
    if len(examples) > MAX_EXAMPLES:
        raise SuiteError("examples", f"at most {MAX_EXAMPLES} examples per suite")
    parsed = [parse_example(e, i, scorer, scorer_exists=scorer_exists) for i, e in enumerate(examples)]
    seen: dict[str, int] = {}
    for i, example in enumerate(parsed):
        if example["id"] in seen:
            raise SuiteError(f"examples[{i}].id", f"{example['id']!r} repeats examples[{seen[example['id']]}].id; "
                                                  "ids must be unique")
        seen[example["id"]] = i
    try:
        size = len(canonical_json(parsed))
    except ValueError as exc:  # NaN, integers past 2**53, lone surrogates in metadata
        raise SuiteError("examples", f"cannot be canonicalized ({exc})") from None
    if size > MAX_SUITE_BYTES:
        raise SuiteError("examples", f"the suite is {size} bytes; at most {MAX_SUITE_BYTES}")
    return {"name": name, "description": description.strip(), "scorer": scorer, "examples": parsed,
            "suite_hash": suite_hash(scorer, parsed)}


def suite_document(parsed: dict, *, source: dict, created_at: str) -> dict:
    """The stored suite file's content."""
    return {"schema": SUITE_SCHEMA, "name": parsed["name"], "description": parsed["description"],
            "scorer": parsed["scorer"], "examples": parsed["examples"], "suite_hash": parsed["suite_hash"],
            "source": source, "created_at": created_at}
