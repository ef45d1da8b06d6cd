"""The system prompt Kiln shows a model acting in an OpenEnv environment (reference-spec §4.4). Pure.

It lives in the kernel because two sides need the exact same words: the collector
(`openenv.collector.prompts`) sends it, and the tiny demo model's warm-up (`gpu_runtime.tiny_tasks`)
trains on it, so the demo model answers Kiln's own prompt with a schema-valid JSON action.
"""

from __future__ import annotations

import json


def system_prompt(environment: dict) -> str:
    """`environment` is an OpenEnvInspection (`{identity: {metadata: {name, description}}, schema: {action}}`)."""
    meta = environment["identity"]["metadata"]
    schema = json.dumps(environment["schema"]["action"], sort_keys=True, ensure_ascii=False)
    return (
        f"You are acting in the OpenEnv environment {meta['name']!r}: {meta['description']}\n"
        "Each turn you receive the environment's latest observation. Reply with exactly one JSON object, "
        "the action, and nothing else: no Markdown, no code fence, no commentary.\n"
        f"The action must match this JSON Schema:\n{schema}\n"
        "When an observation carries a non-empty input_text, that text is shown to you verbatim as the "
        "observation; otherwise you see the complete observation JSON."
    )
