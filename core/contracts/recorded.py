"""The one recorded-policy corpus checker: what the provenance records alone can prove. Pure module.

Admission runs it before anything is queued (with the identity the GPU worker reported), and the
trainer runs it again with its pinned tokenizer's identity; the trainer then adds only what needs
its own state (replaying each prompt through the tokenizer, decoding the completion tokens). Both
name the culprit the same way: `groups[g].completions[c]` with 0-based indexes, and a drift name.

Checked per completion: the record's schema; the prompt and scored-payload digests (hand-edited
prompts or completions); the tokenizer and base-model identity; the behavior adapter against
base_adapter; sampling controls equal within a group (one task rendered once, seeds varying);
completion length within max_tokens; greedy controls with sub-zero behavior log-probs; a stop
string inside the completion text.
"""

from __future__ import annotations

import json

from core.contracts.provenance import (
    ProvenanceError,
    prompt_messages_sha256,
    scored_payload_sha256,
    validate_rollout_provenance,
)

DRIFT = "recorded_provenance_drift"


class RecordedDrift(ValueError):
    """A completion whose record does not prove how it was sampled."""

    def __init__(self, code: str, drift: str, detail: str, *, group_index: int, completion_index: int):
        self.code, self.drift, self.detail = code, drift, detail
        self.group_index, self.completion_index = group_index, completion_index
        self.where = f"groups[{group_index}].completions[{completion_index}]"
        super().__init__(f"{self.where}: {drift} drift: {detail}")


def completions_of(group: dict) -> list[dict]:
    """A group's `completions` (or its `rollouts` alias)."""
    value = group.get("completions")
    return group.get("rollouts") if value is None else value


def check_recorded_corpus(groups: list[dict], *, tokenizer: dict | None, base_model_sha256: str | None,
                          base_adapter: dict | None) -> int:
    """Raise RecordedDrift for the first completion that fails; return how many were checked.

    `tokenizer` and `base_model_sha256` are the identity to hold the records to (None skips that
    check: the served model has not reported one yet, and the trainer will); `base_adapter` is
    `{"name", "content_sha256"}` of the warm-start adapter, or None for the base model.
    """
    checked = 0
    for g, group in enumerate(groups):
        messages_digest = prompt_messages_sha256(group.get("messages"))
        group_sampling = _common_sampling(completions_of(group) or [])
        for c, completion in enumerate(completions_of(group) or []):

            def fail(drift: str, detail: str, code: str = DRIFT, g=g, c=c):
                raise RecordedDrift(code, drift, detail, group_index=g, completion_index=c)

            record = completion.get("provenance")
            if record is None:
                fail("provenance", "behavior_policy=recorded requires provenance on every completion",
                     "recorded_provenance_missing")
            try:
                validate_rollout_provenance(record)
            except ProvenanceError as exc:
                fail("schema", f"invalid kiln.rollout-provenance.v1 record: {exc}", "recorded_provenance_invalid")
            if record["prompt_messages_sha256"] != messages_digest:
                fail("prompt_messages", "the group's messages no longer hash to prompt_messages_sha256")
            text, trajectory = completion.get("text"), completion.get("trajectory")
            if record["scored_payload_sha256"] != scored_payload_sha256(text, trajectory):
                fail("scored_payload", "the completion text or trajectory was edited after sampling "
                     "(it no longer hashes to scored_payload_sha256)")
            if tokenizer is not None and record["tokenizer"] != tokenizer:
                changed = sorted(k for k in set(tokenizer) | set(record["tokenizer"])
                                 if record["tokenizer"].get(k) != tokenizer.get(k))
                fail("tokenizer", f"the tokenizer/template identity differs ({', '.join(changed)})")
            policy = record["behavior_policy"]
            if base_model_sha256 is not None and policy["base_model_sha256"] != base_model_sha256:
                fail("base_model", "the behavior base model is not the training base model")
            _check_adapter(policy.get("adapter"), base_adapter, fail)
            sampling = record["sampling"]
            if sampling != group_sampling:
                changed = sorted(k for k in set(sampling) | set(group_sampling)
                                 if sampling.get(k) != group_sampling.get(k))
                fail("sampling", f"sampling controls differ from the rest of the group's rollouts ({', '.join(changed)})")
            _check_sampling(record, text, trajectory, fail)
            checked += 1
    return checked


def _common_sampling(completions: list) -> dict | None:
    """The sampling controls most of a group's records share (the first on a tie): the odd one out is
    the edited one, so it is the one a drift names, whichever position it holds."""
    seen: dict[str, tuple[int, dict]] = {}
    for completion in completions:
        record = completion.get("provenance") if isinstance(completion, dict) else None
        sampling = record.get("sampling") if isinstance(record, dict) else None
        if isinstance(sampling, dict):
            key = json.dumps(sampling, sort_keys=True, default=str)
            count, _ = seen.get(key, (0, sampling))
            seen[key] = (count + 1, sampling)
    if not seen:
        return None
    return max(seen.values(), key=lambda entry: entry[0])[1]  # max keeps the first of equal counts


def _check_adapter(recorded: dict | None, base_adapter: dict | None, fail) -> None:
    if recorded is None and base_adapter is None:
        return
    if recorded is None:
        fail("adapter", f"sampled from the base model, but training starts from adapter {base_adapter.get('name')!r} "
             "(its behavior policy is not the trained policy's start)")
    if base_adapter is None:
        fail("adapter", f"sampled with adapter {recorded['name']!r}, but training starts from the base model "
             "(set base_adapter to that adapter)")
    want = base_adapter.get("content_sha256")  # the registry's name for the adapter-files digest
    if recorded["content_sha256"] != want:
        fail("adapter", f"behavior adapter {recorded['name']!r} content {recorded['content_sha256']} is not "
             f"the base_adapter content {want}")


def _check_sampling(record: dict, text, trajectory, fail) -> None:
    sampling = record["sampling"]
    completion_tokens = len(record["input_token_ids"]) - record["prompt_token_count"]
    if completion_tokens > sampling["max_tokens"]:
        fail("sampling", f"{completion_tokens} completion tokens exceed sampling.max_tokens {sampling['max_tokens']}")
    sampled = [a for a in record["action_tokens"] if a["source"] == "sampled"]
    if (sampling["temperature"] == 0 or sampling["top_k"] == 1) and any(a["behavior_logprob"] != 0 for a in sampled):
        fail("sampling", "greedy sampling controls (temperature 0 / top_k 1) but a sampled token has a "
             "behavior log-prob below 0")
    if not trajectory and isinstance(text, str) and sampling["stop"]:
        hit = next((stop for stop in sampling["stop"] if stop in text), None)
        if hit is not None:
            fail("sampling", f"stop string {hit!r} occurs inside the completion text")
