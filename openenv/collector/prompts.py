"""What the model reads and what its turns become (reference-spec §4.4-4.5). Pure module: no network.

- `system_prompt(environment)` (defined in `core.contracts.openenv_prompt`, shared with the tiny
  model's warm-up): names the environment and its description, embeds the action JSON
  Schema, demands exactly one JSON object (no Markdown, no fence) and explains `input_text`.
- `observation_text(observation, kind)`: a non-empty string `observation.input_text` verbatim,
  otherwise the complete wire JSON after a one-line label ("OpenEnv reset result ..." or
  "OpenEnv step result ...").
- `action_text(reasoning, content, thinking)`: the trainable action segment, byte-exact model
  output: reasoning + "</think>" + content with thinking on; unfinished reasoning (no final
  content) is kept as it is, never closed by an invented "</think>".
- Harness and protocol errors become tool segments whose `warning_prefix_len` is their full byte
  length, so ECHO never trains on them.
"""

from __future__ import annotations

import json
from typing import Any

from core.contracts.openenv_prompt import system_prompt

THINK_CLOSE = "</think>"
TURN_BREAK = "<TURN_BREAK>"


def wire_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def observation_text(observation: dict, kind: str) -> str:
    """`observation` is the wire observation data `{observation, reward, done, metadata?}`."""
    inner = observation.get("observation")
    if isinstance(inner, dict) and isinstance(inner.get("input_text"), str) and inner["input_text"]:
        return inner["input_text"]
    return (f"OpenEnv {kind} result (observation, reward, done, and optional metadata JSON):\n"
            + wire_json(observation))


def prompt_messages(environment: dict, reset_observation: dict) -> list[dict]:
    return [{"role": "system", "content": system_prompt(environment)},
            {"role": "user", "content": observation_text(reset_observation, "reset")}]


def action_text(reasoning: str | None, content: str, thinking: bool) -> str:
    if not thinking or reasoning is None:
        return content
    if content == "":
        return reasoning  # unfinished reasoning: kept, never closed by an invented </think>
    return reasoning + THINK_CLOSE + content


def action_segment(text: str) -> dict:
    return {"role": "assistant", "content": text, "kind": "action"}


def observation_segment(text: str) -> dict:
    return {"role": "tool", "content": text, "kind": "observation"}


def _warning(content: str) -> dict:
    return {"role": "tool", "content": content, "kind": "observation",
            "warning_prefix_len": len(content.encode("utf-8"))}


def harness_error_segment(code: str, message: str) -> dict:
    return _warning(wire_json({"openenv_harness_error": {"code": code, "message": message}, "done": True}))


def protocol_error_segment(error: dict, *, recoverable: bool, done: bool) -> dict:
    return _warning(wire_json({"openenv_error": error, "recoverable": recoverable, "done": done}))


def assistant_message(reasoning: str | None, content: str, thinking: bool) -> dict:
    message = {"role": "assistant", "content": content}
    if thinking and reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def tool_message(content: str) -> dict:
    return {"role": "tool", "content": content}
