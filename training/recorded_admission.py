"""Recorded-policy checks that run at submission, before anything is queued (no torch).

What can be proven from the corpus alone and the served model's identity is checked here: each
record's schema, the prompt and scored-payload digests (hand-edited completions or prompts), the
tokenizer and base-model identity against what the GPU worker loaded, the behavior adapter
against base_adapter, and sampling controls that must agree within a group (one task rendered
once, seeds varying). The GPU worker repeats the full check with the pinned tokenizer (prompt
token replay, decoding) before training starts.
"""

from __future__ import annotations

from core.contracts.provenance import (
    ProvenanceError,
    prompt_messages_sha256,
    scored_payload_sha256,
    validate_rollout_provenance,
)
from core.errors import KilnError


def _drift(group: int, completion: int, drift: str, message: str, code: str = "recorded_provenance_drift"):
    return KilnError(code, f"groups[{group}].completions[{completion}]: {drift} drift: {message}", status=400,
                     field=f"groups[{group}].completions[{completion}].provenance",
                     hint="regenerate the rollouts with kiln rollout-generate; do not hand-edit recorded corpora")


def check_recorded_corpus(groups: list[dict], *, model_identity: dict | None, base_adapter: dict | None) -> int:
    """Raise a KilnError naming the first drift; return the number of records checked.

    `model_identity` is the served model's identity from the GPU worker (None if it has not
    reported one yet: those two checks then wait for the worker); `base_adapter` is
    {"name", "content_sha256"} of the warm-start adapter, or None for the base model."""
    checked = 0
    for g, group in enumerate(groups, start=1):
        messages_digest = prompt_messages_sha256(group["messages"])
        group_sampling = None
        for c, completion in enumerate(group["completions"]):
            record = completion["provenance"]
            try:
                validate_rollout_provenance(record)
            except ProvenanceError as exc:
                raise _drift(g, c, "schema", str(exc), "recorded_provenance_invalid") from None
            if record["prompt_messages_sha256"] != messages_digest:
                raise _drift(g, c, "prompt", "the group's messages no longer hash to prompt_messages_sha256")
            if record["scored_payload_sha256"] != scored_payload_sha256(completion["text"], completion.get("trajectory")):
                raise _drift(g, c, "completion", "the completion text or trajectory was edited after sampling")
            sampling = {k: v for k, v in record["sampling"].items()}
            if group_sampling is None:
                group_sampling = sampling
            elif sampling != group_sampling:
                changed = sorted(k for k in set(sampling) | set(group_sampling) if sampling.get(k) != group_sampling.get(k))
                raise _drift(g, c, "sampling", f"sampling controls differ from the group's first rollout ({', '.join(changed)})")
            completion_tokens = len(record["input_token_ids"]) - record["prompt_token_count"]
            if completion_tokens > record["sampling"]["max_tokens"]:
                raise _drift(g, c, "sampling", f"{completion_tokens} completion tokens exceed sampling.max_tokens "
                             f"{record['sampling']['max_tokens']}")
            if model_identity:
                if record["tokenizer"] != model_identity.get("tokenizer"):
                    raise _drift(g, c, "tokenizer", "the tokenizer/template identity is not the served model's")
                if record["behavior_policy"]["base_model_sha256"] != model_identity.get("base_model_sha256"):
                    raise _drift(g, c, "base_model", "the behavior base model is not the served model")
            recorded_adapter = record["behavior_policy"].get("adapter")
            if (recorded_adapter or None) != (base_adapter or None) and not (
                    recorded_adapter and base_adapter
                    and recorded_adapter.get("content_sha256") == base_adapter.get("content_sha256")):
                want = f"adapter {base_adapter['name']!r}" if base_adapter else "the base model"
                got = f"adapter {recorded_adapter['name']!r}" if recorded_adapter else "the base model"
                raise _drift(g, c, "adapter", f"sampled from {got}, but training starts from {want} "
                             "(set base_adapter to the adapter that generated the rollouts)")
            checked += 1
    return checked
