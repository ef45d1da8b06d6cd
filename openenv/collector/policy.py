"""The behavior policy as an injected async callable, and Kiln's own chat route as one.

Pure module: no Django, no torch, no HTTP library. The collector calls
`policy(request: PolicyRequest) -> PolicyReply`. `ChatCompletionPolicy` builds the
`/v1/chat/completions` body of reference-spec §4.4 (adapter, stream false, n 1, the generation
seed, max_tokens, temperature, `rollout_provenance: true`, `chat_template_kwargs.enable_thinking`,
`thinking_budget_tokens` explicitly null when unset, `thinking_budget_ms: null`) and hands it to an
injected `post(body) -> dict` coroutine (the CLI wires the Kiln HTTP client in). Each response is
checked against its `kiln.rollout-provenance.v1` record before it is used:
- one choice with text content and a valid record (`core.contracts.provenance`);
- the seed echoed by the choice and the record; the adapter (base: none anywhere);
- `prompt_messages_sha256` is the digest of the messages sent (as the server normalises them:
  None fields dropped); `scored_payload_sha256` binds the completion rebuilt from reasoning and
  content; the action tokens cover the completion; `usage` agrees;
- the template invocation is exactly `{enable_thinking}` and the sampling controls are the ones
  requested. The behavior policy is returned so the collector can require it unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.canonical import json_digest, sha256_digest
from core.contracts.provenance import ProvenanceError, scored_payload_sha256, validate_rollout_provenance
from openenv.collector.errors import CollectionError
from openenv.collector.prompts import THINK_CLOSE

THINK_OPEN = "<think>"


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float
    thinking: bool
    thinking_budget_tokens: int | None = None


@dataclass(frozen=True)
class PolicyRequest:
    messages: list[dict]
    seed: int
    sampling: Sampling
    group_index: int
    candidate_index: int
    step_index: int


@dataclass(frozen=True)
class PolicyReply:
    content: str                 # the final answer: parsed, validated, and the only thing stepped
    reasoning: str | None        # separated reasoning_content (thinking on)
    behavior_policy: dict        # identical across the whole collection
    tokens: int                  # policy (completion) tokens
    provenance_sha256: str | None = None


Policy = Callable[[PolicyRequest], Awaitable[PolicyReply]]


def policy_failure(request: PolicyRequest, check: str, message: str) -> CollectionError:
    return CollectionError(
        "openenv_policy_response_invalid",
        f"group {request.group_index} candidate {request.candidate_index} step {request.step_index}: "
        f"{check}: {message}", failure_code="training_evidence_invalid",
        hint="the model server's answer did not match its rollout provenance; nothing was published")


def normalised_messages(messages: list[dict]) -> list[dict]:
    """The messages as the server digests them (`model_dump(exclude_none=True)`)."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


class ChatCompletionPolicy:
    """`/v1/chat/completions` with rollout provenance, through an injected `post` coroutine."""

    def __init__(self, post: Callable[[dict], Awaitable[dict]], *, adapter: str | None):
        self._post = post
        self.adapter = adapter  # None = the base model

    def body(self, request: PolicyRequest) -> dict:
        sampling = request.sampling
        return {
            "messages": normalised_messages(request.messages),
            "adapter": self.adapter or "base",
            "stream": False,
            "n": 1,
            "seed": request.seed,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "rollout_provenance": True,
            "chat_template_kwargs": {"enable_thinking": sampling.thinking},
            "thinking_budget_tokens": sampling.thinking_budget_tokens,
            "thinking_budget_ms": None,
        }

    async def __call__(self, request: PolicyRequest) -> PolicyReply:
        body = self.body(request)
        response = await self._post(body)
        return check_response(response, body=body, request=request, adapter=self.adapter)


def _completion_candidates(content: str, reasoning: str | None) -> list[str]:
    if reasoning is None:
        return [content]
    out = [reasoning + THINK_CLOSE + content, THINK_OPEN + reasoning + THINK_CLOSE + content]
    if content == "":
        out += [reasoning, THINK_OPEN + reasoning]
    return out


def _record_digest(record: dict) -> str:
    """sha256 of the record's compact, key-sorted JSON (its u64 seeds exceed RFC 8785's integer domain)."""
    return sha256_digest(json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())


def check_response(response, *, body: dict, request: PolicyRequest, adapter: str | None) -> PolicyReply:
    def fail(check, message):
        return policy_failure(request, check, message)

    if not isinstance(response, dict):
        raise fail("response_shape", "the response is not a JSON object")
    choices = response.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise fail("response_shape", "expected exactly one choice")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or not isinstance(message.get("content"), str):
        raise fail("response_shape", "the choice has no message with text content")
    content, reasoning = message["content"], message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise fail("response_shape", "reasoning_content is not text")
    record = choice.get("rollout_provenance")
    if not isinstance(record, dict):
        raise fail("response_shape", "the choice carries no rollout_provenance record")
    try:
        validate_rollout_provenance(record)
    except ProvenanceError as exc:
        raise fail("provenance_schema", str(exc)) from None
    if str(choice.get("seed")) != str(request.seed) or record["seed"] != request.seed:
        raise fail("seed", f"requested seed {request.seed}, got {choice.get('seed')!r} / {record['seed']!r}")
    policy_adapter = record["behavior_policy"].get("adapter")
    choice_adapter = choice.get("adapter")
    if adapter is None:
        if policy_adapter is not None or choice_adapter is not None:
            raise fail("adapter", "requested the base model, but an adapter answered")
    elif not isinstance(policy_adapter, dict) or policy_adapter.get("name") != adapter \
            or (choice_adapter is not None and choice_adapter != policy_adapter):
        raise fail("adapter", f"requested adapter {adapter!r}, the record names {policy_adapter!r}")
    if record["prompt_messages_sha256"] != json_digest(body["messages"]):
        raise fail("prompt_digest", "prompt_messages_sha256 is not the digest of the messages sent")
    digests = {scored_payload_sha256(text) for text in _completion_candidates(content, reasoning)}
    if record["scored_payload_sha256"] not in digests:
        raise fail("content_digest", "scored_payload_sha256 does not bind the returned reasoning and content")
    count, ids, actions = record["prompt_token_count"], record["input_token_ids"], record["action_tokens"]
    if [a["sequence_index"] for a in actions] != list(range(count, len(ids))):
        raise fail("action_coverage", "the action tokens do not cover exactly the completion")
    if request.sampling.thinking_budget_tokens is None and any(a["source"] == "forced" for a in actions):
        raise fail("action_coverage", "forced tokens without a requested thinking budget")
    usage = response.get("usage")
    if isinstance(usage, dict) and (usage.get("completion_tokens") != len(actions)
                                    or usage.get("prompt_tokens") != count):
        raise fail("usage", "usage does not match the record's token counts")
    kwargs = (record.get("template_invocation") or {}).get("template_kwargs") or {}
    if kwargs != {"enable_thinking": request.sampling.thinking}:
        raise fail("template_identity", f"template kwargs {kwargs!r} are not the requested enable_thinking")
    sampling = record["sampling"]
    if sampling["max_tokens"] != request.sampling.max_tokens or not math.isclose(
            sampling["temperature"], request.sampling.temperature, rel_tol=0, abs_tol=1e-12):
        raise fail("sampling", "the record's max_tokens/temperature are not the requested ones")
    budget = sampling.get("thinking_budget")
    wanted = request.sampling.thinking_budget_tokens
    if (budget is None) != (wanted is None) or (budget is not None and budget.get("max_tokens") != wanted):
        raise fail("sampling", f"the record's thinking budget {budget!r} is not the requested {wanted!r}")
    return PolicyReply(content=content, reasoning=reasoning, behavior_policy=dict(record["behavior_policy"]),
                       tokens=len(actions), provenance_sha256=_record_digest(record))
