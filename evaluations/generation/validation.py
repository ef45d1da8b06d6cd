"""Validate each chat-completion response against the request that produced it. Pure module.

Imports no Django and no torch (`core.contracts.provenance` is pure: schema and digests only).
`validate_response` checks one response on its own; `check_consistency` checks what must be the
same across every response of a run. Check names (`RolloutError.check`):

- `response_shape`: one choice with text content, a provenance record and usage;
- `provenance_schema`: the record is a valid kiln.rollout-provenance.v1 object;
- `seed`: the choice and the record echo the requested seed;
- `adapter`: base -> no adapter anywhere; NAME -> the choice's and the record's adapter are NAME
  with the same content digest (and, across the run, the same digest every time);
- `prompt_digest`: `prompt_messages_sha256` is the digest of the rendered messages;
- `content_digest`: `scored_payload_sha256` is the digest of the completion text that will be
  written (rebuilt from the message's reasoning and content);
- `action_coverage`: action tokens cover exactly the completion tokens; forced tokens only where
  a thinking budget was requested;
- `usage`: `completion_tokens` is the number of action tokens, `prompt_tokens` the record's
  `prompt_token_count`;
- `template_identity`: the template invocation is the requested one (enable_thinking, no tools)
  and the same for every response; `tokenizer_identity`: the tokenizer digests are the same for
  every response; `behavior_identity`: served model, base model, inference configuration and
  implementation are the same for every response;
- `sampling`: the record's sampling controls equal the rendered request's (a control the request
  leaves to the server must at least be the same for every response) and are the same within a
  group;
- `backend`: the generation backend is named, and the same for every response.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.contracts.provenance import (
    ProvenanceError,
    prompt_messages_sha256,
    scored_payload_sha256,
    validate_rollout_provenance,
)
from evaluations.generation.errors import RolloutError
from evaluations.generation.template import RenderOptions, Task

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SAMPLING_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


@dataclass
class CheckedRollout:
    """One validated response, ready to be scored and written."""

    task_id: str
    seed: int
    text: str  # the completion text that scored_payload_sha256 binds (written as completion.text)
    content: str  # message.content, what the scorer parses
    record: dict  # the kiln.rollout-provenance.v1 record
    usage: dict
    finish_reason: str | None
    adapter: dict | None  # {name, content_sha256} or None for the base model
    sampled_tokens: int
    forced_tokens: int
    max_tokens_requested: bool  # False when the request left max_tokens to the server default


def expected_sampling(parsed) -> dict:
    """The record `sampling` a request asks for (`max_tokens` None: the server's default)."""
    expected = {key: float(getattr(parsed, key)) for key in SAMPLING_FLOATS}
    expected.update(top_k=int(parsed.top_k), max_tokens=parsed.effective_max_tokens, stop=list(parsed.stop or []))
    return expected


def completion_text(message: dict, record: dict) -> str | None:
    """The completion text whose digest the record binds, rebuilt from the message.

    The server splits the decoded completion byte-exactly into reasoning + `</think>` + content
    (thinking on), or returns it all as content (thinking off); reasoning that never closed comes
    back with empty content. The candidate whose digest matches the record is the text to write.
    """
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        candidates = [content]
    else:
        candidates = [reasoning + THINK_CLOSE + content, THINK_OPEN + reasoning + THINK_CLOSE + content]
        if content == "":
            candidates += [reasoning, THINK_OPEN + reasoning]
    want = record.get("scored_payload_sha256")
    return next((c for c in candidates if scored_payload_sha256(c) == want), None)


def _fail(task: Task, seed: int, check: str, message: str) -> RolloutError:
    return RolloutError("rollout_check_failed", message, task_id=task.id, seed=seed, check=check,
                        hint="nothing was written; fix the cause and run the command again")


def _shape(response, task: Task, seed: int) -> tuple[dict, dict, dict, dict]:
    def bad(message):
        return _fail(task, seed, "response_shape", message)

    if not isinstance(response, dict):
        raise bad("the response is not a JSON object")
    choices = response.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise bad(f"expected exactly one choice (n=1), got {len(choices) if isinstance(choices, list) else choices!r}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or not isinstance(message.get("content"), str):
        raise bad("the choice has no message with text content")
    if message.get("reasoning_content") is not None and not isinstance(message["reasoning_content"], str):
        raise bad("message.reasoning_content is not text")
    record = choice.get("rollout_provenance")
    if not isinstance(record, dict):
        raise bad("the choice carries no rollout_provenance record (does the server support recorded provenance?)")
    usage = response.get("usage")
    if not isinstance(usage, dict) or not all(isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
        raise bad("the response has no usage with prompt_tokens and completion_tokens")
    return choice, message, record, usage


def validate_response(response, *, task: Task, seed: int, body: dict, parsed, options: RenderOptions) -> CheckedRollout:
    """Check one response against its rendered request `body` (`parsed`: the server's model of it)."""
    choice, message, record, usage = _shape(response, task, seed)
    try:
        validate_rollout_provenance(record)
    except ProvenanceError as exc:
        raise _fail(task, seed, "provenance_schema", f"invalid kiln.rollout-provenance.v1 record: {exc}") from None

    if str(choice.get("seed")) != str(seed) or record["seed"] != seed:
        raise _fail(task, seed, "seed", f"requested seed {seed}, the choice echoed {choice.get('seed')!r} and the "
                    f"record holds {record['seed']!r}")

    choice_adapter, policy_adapter = choice.get("adapter"), record["behavior_policy"].get("adapter")
    if options.is_base:
        if choice_adapter is not None or policy_adapter is not None:
            name = (choice_adapter or policy_adapter or {}).get("name")
            raise _fail(task, seed, "adapter", f"requested the base model, but the response was sampled with adapter "
                        f"{name!r}")
    else:
        if not isinstance(choice_adapter, dict) or choice_adapter.get("name") != options.adapter:
            got = choice_adapter.get("name") if isinstance(choice_adapter, dict) else choice_adapter
            raise _fail(task, seed, "adapter", f"requested adapter {options.adapter!r}, the response names {got!r}")
        if policy_adapter != {"name": choice_adapter.get("name"), "content_sha256": choice_adapter.get("content_sha256")}:
            raise _fail(task, seed, "adapter", f"the record's behavior adapter {policy_adapter!r} is not the response's "
                        f"adapter {choice_adapter!r}")

    digest = prompt_messages_sha256(body["messages"])
    if record["prompt_messages_sha256"] != digest:
        raise _fail(task, seed, "prompt_digest", f"the record's prompt_messages_sha256 {record['prompt_messages_sha256']} "
                    f"is not the digest of the rendered messages {digest}")

    text = completion_text(message, record)
    if text is None:
        raise _fail(task, seed, "content_digest", "scored_payload_sha256 does not match the completion text rebuilt "
                    "from the message's reasoning and content")

    count, ids, actions = record["prompt_token_count"], record["input_token_ids"], record["action_tokens"]
    indexes = [a["sequence_index"] for a in actions]
    if indexes != list(range(count, len(ids))):
        raise _fail(task, seed, "action_coverage", f"action tokens cover {len(indexes)} positions, but the completion "
                    f"spans positions {count}..{len(ids) - 1} ({len(ids) - count} tokens)")
    forced = sum(1 for a in actions if a["source"] == "forced")
    if forced and not options.budgets:
        raise _fail(task, seed, "action_coverage", f"{forced} action tokens are marked forced, but no thinking budget "
                    "was requested")

    if usage["completion_tokens"] != len(actions):
        raise _fail(task, seed, "usage", f"usage.completion_tokens is {usage['completion_tokens']}, the record has "
                    f"{len(actions)} action tokens")
    if usage["prompt_tokens"] != count:
        raise _fail(task, seed, "usage", f"usage.prompt_tokens is {usage['prompt_tokens']}, the record's "
                    f"prompt_token_count is {count}")
    if isinstance(usage.get("total_tokens"), int) and usage["total_tokens"] != count + len(actions):
        raise _fail(task, seed, "usage", f"usage.total_tokens is {usage['total_tokens']}, expected {count + len(actions)}")

    invocation = record.get("template_invocation") or {}
    kwargs = invocation.get("template_kwargs") or {}
    if invocation.get("tools") or "tool_choice" in invocation:
        raise _fail(task, seed, "template_identity", "the record's template invocation carries tools")
    if kwargs != {"enable_thinking": options.thinking}:
        raise _fail(task, seed, "template_identity", f"the record's template kwargs {kwargs!r} are not the requested "
                    f"{{'enable_thinking': {options.thinking}}}")

    _check_sampling(record["sampling"], expected_sampling(parsed), options, task, seed)

    backend = record["generation_backend"]
    if not isinstance(backend, str) or not backend.strip():
        raise _fail(task, seed, "backend", "the record names no generation backend")

    return CheckedRollout(task_id=task.id, seed=seed, text=text, content=message["content"], record=record,
                          usage=dict(usage), finish_reason=choice.get("finish_reason"), adapter=choice_adapter,
                          sampled_tokens=len(actions) - forced, forced_tokens=forced,
                          max_tokens_requested=parsed.effective_max_tokens is not None)


def _same(a, b) -> bool:
    """Equal values; 1 and 1.0 agree (JSON numbers), True and 1 do not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _check_sampling(recorded: dict, expected: dict, options: RenderOptions, task: Task, seed: int) -> None:
    for key, want in expected.items():
        if key == "max_tokens" and want is None:
            continue  # left to the server; check_consistency requires one value for the whole run
        if not _same(recorded.get(key), want):
            raise _fail(task, seed, "sampling", f"the record's sampling.{key} is {recorded.get(key)!r}, the request "
                        f"asked for {want!r}")
    budget = recorded.get("thinking_budget")
    wanted = {key: value for key, value in (("max_tokens", options.thinking_budget_tokens),
                                            ("max_time_ms", options.thinking_budget_ms)) if value is not None}
    if not wanted:
        if budget is not None:
            raise _fail(task, seed, "sampling", f"the record carries a thinking budget {budget!r}, none was requested")
    elif not isinstance(budget, dict) or {k: v for k, v in budget.items() if k != "close_token_ids"} != wanted:
        raise _fail(task, seed, "sampling", f"the record's thinking budget {budget!r} is not the requested {wanted}")


def check_consistency(rollouts: list[CheckedRollout], tasks_by_id: dict[str, Task]) -> dict:
    """Identity that must hold across every response; returns the run's shared identity."""
    if not rollouts:
        raise RolloutError("no_rollouts", "no rollouts were generated")
    first = rollouts[0].record
    first_policy = first["behavior_policy"]
    default_max_tokens = None
    group_sampling: dict[str, dict] = {}
    for rollout in rollouts:
        task, record = tasks_by_id[rollout.task_id], rollout.record
        policy = record["behavior_policy"]

        def fail(check, message, task=task, rollout=rollout):
            return _fail(task, rollout.seed, check, message + f" (first response: task {rollouts[0].task_id!r} "
                         f"seed {rollouts[0].seed})")

        if record["tokenizer"] != first["tokenizer"]:
            changed = sorted(k for k in first["tokenizer"] if record["tokenizer"].get(k) != first["tokenizer"][k])
            raise fail("tokenizer_identity", f"tokenizer identity changed during the run ({', '.join(changed)})")
        if record.get("template_invocation") != first.get("template_invocation"):
            raise fail("template_identity", "the template invocation changed during the run")
        for key in ("served_model_id", "base_model_sha256", "inference_config_sha256", "implementation"):
            if policy[key] != first_policy[key]:
                raise fail("behavior_identity", f"behavior_policy.{key} changed during the run "
                           f"({first_policy[key]!r} -> {policy[key]!r})")
        if policy.get("adapter") != first_policy.get("adapter"):
            raise fail("adapter", f"the behavior adapter changed during the run ({first_policy.get('adapter')!r} -> "
                       f"{policy.get('adapter')!r}); was the adapter republished?")
        if record["generation_backend"] != first["generation_backend"]:
            raise fail("backend", f"the generation backend changed during the run ({first['generation_backend']!r} "
                       f"-> {record['generation_backend']!r})")
        if not rollout.max_tokens_requested:
            if default_max_tokens is None:
                default_max_tokens = record["sampling"]["max_tokens"]
            elif record["sampling"]["max_tokens"] != default_max_tokens:
                raise fail("sampling", f"the server's default max_tokens changed during the run ({default_max_tokens} "
                           f"-> {record['sampling']['max_tokens']})")
        seen = group_sampling.setdefault(rollout.task_id, record["sampling"])
        if record["sampling"] != seen:
            changed = sorted(k for k in set(seen) | set(record["sampling"]) if seen.get(k) != record["sampling"].get(k))
            raise fail("sampling", f"sampling controls differ within the task's group ({', '.join(changed)}); "
                       "recorded training needs one set of controls per group")
    return {
        "behavior_policy": {k: v for k, v in first_policy.items()},
        "tokenizer": dict(first["tokenizer"]),
        "template_invocation": first.get("template_invocation"),
        "generation_backend": first["generation_backend"],
    }
