"""The system prompt Kiln shows a model acting in an OpenEnv environment (reference-spec §4.4). Pure.

It lives in the kernel because two sides need the exact same words: the collector
(`openenv.collector.prompts`) sends it, and the tiny demo model's warm-up (`gpu_runtime.tiny_tasks`)
trains on it, so the demo model answers Kiln's own prompt with a schema-valid JSON action.
"""

from __future__ import annotations

import json

# Where a schema keeps the definitions its `$ref`s point at (JSON Schema 2020-12, and drafts before it).
_DEFINITIONS = ("$defs", "definitions")
# An inlined schema may always grow to this many characters (then to twice the original's size).
MIN_INLINED_CHARS = 4096


def system_prompt(environment: dict) -> str:
    """`environment` is an OpenEnvInspection (`{identity: {metadata: {name, description}}, schema: {action}}`)."""
    meta = environment["identity"]["metadata"]
    schema = json.dumps(inline_definitions(environment["schema"]["action"]), sort_keys=True, ensure_ascii=False)
    return (
        f"You are acting in the OpenEnv environment {meta['name']!r}: {meta['description']}\n"
        "Each turn you receive the environment's latest observation. Reply with exactly one JSON object, "
        "the action, and nothing else: no Markdown, no code fence, no commentary.\n"
        f"The action must match this JSON Schema:\n{schema}\n"
        "When an observation carries a non-empty input_text, that text is shown to you verbatim as the "
        "observation; otherwise you see the complete observation JSON."
    )


def inline_definitions(schema):
    """The action schema with each local `{"$ref": "#/$defs/Name"}` replaced by that definition (the
    reference's sibling keys, such as a field's description, kept over it) and the definitions dropped.

    Why: Pydantic declares a field typed by an Enum class as a reference into `$defs`, so its members
    sit far from the field; inlined, the field reads as a `Literal` one does (`{"enum": [...], "type":
    "string"}`), which a model copies more easily. The meaning is the same: actions are still validated
    against the environment's own schema. A schema with any other reference, a recursive one or none
    is shown as it is."""
    if not isinstance(schema, dict):
        return schema
    containers = [key for key in _DEFINITIONS if isinstance(schema.get(key), dict)]
    if not containers:
        return schema
    definitions = {f"#/{key}/{name}": value for key in containers for name, value in schema[key].items()}

    def inline(node, seen: tuple):
        if isinstance(node, list):
            return [inline(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        reference = node.get("$ref")
        if not isinstance(reference, str):  # no reference here (or a property that is named "$ref")
            return {key: inline(value, seen) for key, value in node.items()}
        if reference not in definitions or reference in seen:
            raise _NotInlinable
        siblings = {key: inline(value, seen) for key, value in node.items() if key != "$ref"}
        return {**inline(definitions[reference], (*seen, reference)), **siblings}

    try:
        body = inline({key: value for key, value in schema.items() if key not in containers}, ())
    except _NotInlinable:
        return schema
    # A definition referenced from many places would be repeated at each: past twice the size, the
    # references are the shorter way to say it.
    if len(json.dumps(body)) > max(2 * len(json.dumps(schema)), MIN_INLINED_CHARS):
        return schema
    return body


class _NotInlinable(Exception):
    """A reference outside the schema's definitions, or one that reaches itself."""
