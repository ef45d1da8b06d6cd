"""Build and validate `kiln.rollout-provenance.v1` records (reference-spec §2.3). Pure: no Django, no torch.

A record binds one completion to the exact behaviour policy that produced it: the full token
sequence, which tokens were sampled (with their behaviour log-probs) and which were forced by
the thinking budget, the model/adapter/tokenizer/template identities, the sampling controls, the
seed and the backend. Digests use RFC 8785 canonical JSON (Kiln's convention): the prompt
messages as given, and the scored payload `{schema: "kiln.scored-rollout-payload.v1", text,
trajectory}` with `trajectory: []` when the rollout has none (the reward is excluded, so scoring
can happen afterwards). Unknown fields are rejected at every level.
"""

from __future__ import annotations

import math
import re

from core.canonical import canonical_json, json_digest
from core.contracts.sampling import MAX_STOP_BYTES, MAX_STOP_SEQUENCES

SCHEMA = "kiln.rollout-provenance.v1"
PAYLOAD_SCHEMA = "kiln.scored-rollout-payload.v1"
MAX_TOKENS = 16_777_216
MAX_IDENTITY_BYTES = 256
MAX_BACKEND_BYTES = 64
MAX_TOOLS = 256
MAX_TEMPLATE_KWARGS = 256
MAX_TEMPLATE_KEY_BYTES = 256
MAX_INVOCATION_BYTES = 1024 * 1024
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


class ProvenanceError(ValueError):
    """The record is not a valid kiln.rollout-provenance.v1 object; the message names the field."""


def prompt_messages_sha256(messages: list[dict]) -> str:
    return json_digest(messages)


def scored_payload_sha256(text: str, trajectory: list[dict] | None = None) -> str:
    return json_digest({"schema": PAYLOAD_SCHEMA, "text": text, "trajectory": list(trajectory or [])})


def build_rollout_provenance(
    result, *, prompt_messages: list[dict], text: str | None = None, trajectory: list[dict] | None = None
) -> dict:
    """The provenance record for a SampleResult, validated before it is returned.

    `prompt_messages` are the group's `messages` as they will be written to the GRPO JSONL;
    `text`/`trajectory` are the scored rollout's fields (default: the completion text, no
    trajectory). Forced tokens carry `behavior_logprob: null`.
    """
    prompt = list(result.prompt_token_ids)
    actions = []
    for offset, (token, logprob, source) in enumerate(
        zip(result.completion_token_ids, result.token_logprobs, result.token_sources, strict=True)
    ):
        actions.append(
            {
                "sequence_index": len(prompt) + offset,
                "token_id": int(token),
                "source": source,
                "behavior_logprob": float(logprob) if source == "sampled" else None,
            }
        )
    record = {
        "schema": SCHEMA,
        "input_token_ids": prompt + [int(t) for t in result.completion_token_ids],
        "prompt_token_count": len(prompt),
        "prompt_messages_sha256": prompt_messages_sha256(prompt_messages),
        "scored_payload_sha256": scored_payload_sha256(result.text if text is None else text, trajectory),
        "action_tokens": actions,
        "behavior_policy": dict(result.behavior_policy),
        "tokenizer": dict(result.tokenizer),
        "sampling": dict(result.sampling),
        "seed": int(result.seed),
        "generation_backend": result.generation_backend,
    }
    invocation = _compact_invocation(result.template_invocation)
    if invocation:
        record["template_invocation"] = invocation
    validate_rollout_provenance(record)
    return record


def _compact_invocation(invocation: dict) -> dict:
    """Drop empty parts, as the reference serialiser does; an all-default invocation disappears."""
    out = {}
    if invocation.get("tools"):
        out["tools"] = list(invocation["tools"])
    if invocation.get("tool_choice") is not None:
        out["tool_choice"] = invocation["tool_choice"]
    if invocation.get("template_kwargs"):
        out["template_kwargs"] = dict(invocation["template_kwargs"])
    return out


# -- validation -------------------------------------------------------------------------------

_TOP = {
    "schema",
    "input_token_ids",
    "prompt_token_count",
    "prompt_messages_sha256",
    "scored_payload_sha256",
    "action_tokens",
    "behavior_policy",
    "tokenizer",
    "sampling",
    "seed",
    "generation_backend",
}
_ACTION = {"sequence_index", "token_id", "source", "behavior_logprob"}
_POLICY = {"served_model_id", "base_model_sha256", "inference_config_sha256", "implementation"}
_ADAPTER = {"name", "content_sha256"}
_TOKENIZER = {"vocab_sha256", "config_sha256", "chat_template_sha256"}
_INVOCATION = {"tools", "tool_choice", "template_kwargs"}
_SAMPLING = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
}
_BUDGET = {"max_tokens", "max_time_ms", "close_token_ids"}


def validate_rollout_provenance(record) -> None:
    """Raise ProvenanceError unless `record` is a valid kiln.rollout-provenance.v1 object."""
    _fields(record, "provenance", required=_TOP, optional={"template_invocation"})
    if record["schema"] != SCHEMA:
        raise ProvenanceError(f"schema must be {SCHEMA!r}")
    ids = record["input_token_ids"]
    if not isinstance(ids, list) or not ids or len(ids) > MAX_TOKENS:
        raise ProvenanceError(f"input_token_ids must be a non-empty list of at most {MAX_TOKENS} ids")
    if not all(type(token) is int and 0 <= token < 1 << 32 for token in ids):  # fast path; the loop says why
        for token in ids:
            _uint(token, "input_token_ids[]", bits=32)
    count = _uint(record["prompt_token_count"], "prompt_token_count")
    if not 1 <= count <= len(ids):
        raise ProvenanceError(f"prompt_token_count {count} is outside 1..{len(ids)}")
    _sha(record["prompt_messages_sha256"], "prompt_messages_sha256")
    _sha(record["scored_payload_sha256"], "scored_payload_sha256")
    forced_ids = _validate_actions(record["action_tokens"], ids, count)
    _validate_policy(record["behavior_policy"])
    _fields(record["tokenizer"], "tokenizer", required=_TOKENIZER)
    for key in sorted(_TOKENIZER):
        _sha(record["tokenizer"][key], f"tokenizer.{key}")
    if "template_invocation" in record:
        _validate_invocation(record["template_invocation"])
    budget = _validate_sampling(record["sampling"])
    if forced_ids:
        if budget is None:
            raise ProvenanceError("forced action tokens require sampling.thinking_budget")
        stray = sorted(set(forced_ids) - set(budget["close_token_ids"]))
        if stray:
            raise ProvenanceError(
                f"forced token ids {stray} are not in sampling.thinking_budget.close_token_ids"
            )
    _uint(record["seed"], "seed", bits=64)
    _identity_text(record["generation_backend"], "generation_backend", MAX_BACKEND_BYTES)


def _validate_actions(actions, ids: list, prompt_count: int) -> list[int]:
    if not isinstance(actions, list) or not actions or len(actions) > len(ids):
        raise ProvenanceError("action_tokens must be a non-empty list no longer than input_token_ids")
    previous, sampled, forced_ids = -1, 0, []
    for action in actions:
        _fields(
            action, "action_tokens[]", required=_ACTION - {"behavior_logprob"}, optional={"behavior_logprob"}
        )
        index = _uint(action["sequence_index"], "action_tokens[].sequence_index")
        if not prompt_count <= index < len(ids):
            raise ProvenanceError(f"action token index {index} is outside {prompt_count}..{len(ids)}")
        if index <= previous:
            raise ProvenanceError(f"action token indexes must strictly increase ({index} after {previous})")
        previous = index
        token = _uint(action["token_id"], "action_tokens[].token_id", bits=32)
        if token != ids[index]:
            raise ProvenanceError(
                f"action token at {index} claims id {token}; input_token_ids has {ids[index]}"
            )
        logprob = action.get("behavior_logprob")
        if action["source"] == "sampled":
            if not _is_number(logprob) or not math.isfinite(logprob) or logprob > 1e-6:
                raise ProvenanceError(f"sampled token at {index} needs a finite behavior_logprob <= 1e-6")
            sampled += 1
        elif action["source"] == "forced":
            if logprob is not None:
                raise ProvenanceError(f"forced token at {index} must not carry a behavior_logprob")
            forced_ids.append(token)
        else:
            raise ProvenanceError(
                f"action token source must be 'sampled' or 'forced', got {action['source']!r}"
            )
    if sampled == 0:
        raise ProvenanceError("at least one action token must be sampled")
    return forced_ids


def _validate_policy(policy) -> None:
    _fields(policy, "behavior_policy", required=_POLICY, optional={"adapter"})
    _identity_text(policy["served_model_id"], "behavior_policy.served_model_id", MAX_IDENTITY_BYTES)
    _sha(policy["base_model_sha256"], "behavior_policy.base_model_sha256")
    _sha(policy["inference_config_sha256"], "behavior_policy.inference_config_sha256")
    _identity_text(policy["implementation"], "behavior_policy.implementation", MAX_IDENTITY_BYTES)
    if "adapter" in policy:
        _fields(policy["adapter"], "behavior_policy.adapter", required=_ADAPTER)
        _identity_text(policy["adapter"]["name"], "behavior_policy.adapter.name", MAX_IDENTITY_BYTES)
        _sha(policy["adapter"]["content_sha256"], "behavior_policy.adapter.content_sha256")


def _validate_invocation(invocation) -> None:
    _fields(invocation, "template_invocation", required=set(), optional=_INVOCATION)
    tools = invocation.get("tools", [])
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ProvenanceError(f"template_invocation.tools must be a list of at most {MAX_TOOLS}")
    kwargs = invocation.get("template_kwargs", {})
    if not isinstance(kwargs, dict) or len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise ProvenanceError(
            f"template_invocation.template_kwargs must be an object of at most {MAX_TEMPLATE_KWARGS} keys"
        )
    for key in kwargs:
        if not 1 <= len(key.encode()) <= MAX_TEMPLATE_KEY_BYTES:
            raise ProvenanceError(f"template kwarg keys must have 1..{MAX_TEMPLATE_KEY_BYTES} bytes")
    try:
        size = len(canonical_json(invocation))
    except Exception as exc:  # noqa: BLE001 - NaN, non-JSON values
        raise ProvenanceError(f"template_invocation is not valid JSON: {exc}") from exc
    if size > MAX_INVOCATION_BYTES:
        raise ProvenanceError(f"template_invocation has {size} bytes; at most {MAX_INVOCATION_BYTES}")


def _validate_sampling(sampling) -> dict | None:
    _fields(sampling, "sampling", required=_SAMPLING, optional={"thinking_budget"})
    _number(sampling["temperature"], "sampling.temperature", low=0.0)
    _number(sampling["top_p"], "sampling.top_p", low=0.0, high=1.0)
    _uint(sampling["top_k"], "sampling.top_k", bits=32)
    _number(sampling["min_p"], "sampling.min_p", low=0.0, high=1.0)
    if _uint(sampling["max_tokens"], "sampling.max_tokens") == 0:
        raise ProvenanceError("sampling.max_tokens must be greater than zero")
    if _number(sampling["repetition_penalty"], "sampling.repetition_penalty") <= 0:
        raise ProvenanceError("sampling.repetition_penalty must be positive")
    _number(sampling["presence_penalty"], "sampling.presence_penalty", low=-2.0, high=2.0)
    _number(sampling["frequency_penalty"], "sampling.frequency_penalty", low=-2.0, high=2.0)
    stop = sampling["stop"]
    if not isinstance(stop, list) or len(stop) > MAX_STOP_SEQUENCES:
        raise ProvenanceError(f"sampling.stop must be a list of at most {MAX_STOP_SEQUENCES} strings")
    if any(not isinstance(s, str) or not s for s in stop):
        raise ProvenanceError("sampling.stop entries must be non-empty strings")
    if sum(len(s.encode()) for s in stop) > MAX_STOP_BYTES:
        raise ProvenanceError(f"sampling.stop exceeds {MAX_STOP_BYTES} bytes")
    budget = sampling.get("thinking_budget")
    if budget is None:
        return None
    _fields(
        budget,
        "sampling.thinking_budget",
        required={"close_token_ids"},
        optional={"max_tokens", "max_time_ms"},
    )
    if "max_tokens" not in budget and "max_time_ms" not in budget:
        raise ProvenanceError("sampling.thinking_budget needs max_tokens or max_time_ms")
    for key in ("max_tokens", "max_time_ms"):
        if key in budget:
            _uint(budget[key], f"sampling.thinking_budget.{key}", bits=64)
    close = budget["close_token_ids"]
    if not isinstance(close, list) or not close:
        raise ProvenanceError("sampling.thinking_budget.close_token_ids must be a non-empty list")
    for token in close:
        _uint(token, "sampling.thinking_budget.close_token_ids[]", bits=32)
    return budget


# -- field helpers ----------------------------------------------------------------------------


def _fields(obj, where: str, *, required: set, optional: set = frozenset()) -> None:
    if not isinstance(obj, dict):
        raise ProvenanceError(f"{where} must be an object")
    unknown = sorted(set(obj) - required - optional)
    if unknown:
        raise ProvenanceError(f"{where} has unknown fields: {', '.join(unknown)}")
    missing = sorted(required - set(obj))
    if missing:
        raise ProvenanceError(f"{where} is missing fields: {', '.join(missing)}")


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value, where: str, *, low: float | None = None, high: float | None = None) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise ProvenanceError(f"{where} must be a finite number")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ProvenanceError(f"{where} must be within [{low}, {high}]")
    return float(value)


def _uint(value, where: str, *, bits: int = 64) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << bits:
        raise ProvenanceError(f"{where} must be an unsigned {bits}-bit integer")
    return value


def _sha(value, where: str) -> None:
    if not isinstance(value, str) or not _SHA256.match(value):
        raise ProvenanceError(f"{where} must be sha256:<64 lowercase hex>")


def _identity_text(value, where: str, max_bytes: int) -> None:
    if (
        not isinstance(value, str)
        or not value
        or value.strip() != value
        or len(value.encode()) > max_bytes
        or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value)
    ):
        raise ProvenanceError(
            f"{where} must be non-empty, trimmed, control-free text of at most {max_bytes} bytes"
        )
