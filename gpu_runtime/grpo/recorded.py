"""`behavior_policy: recorded`: replay each completion's kiln.rollout-provenance.v1 record and reject drift. Imports no Django.

`verify_recorded_groups` runs before training: first the checker admission runs too
(`core.contracts.recorded`: schema, prompt and scored-payload digests, tokenizer and base-model
identity against the trainer's, the behavior adapter against base_adapter, sampling controls
equal within a group and consistent with what was sampled), then what needs the pinned
tokenizer: the chat template, replaying `template_invocation`, must reproduce the recorded
prompt tokens, and the completion text must decode from the recorded completion tokens.
A mismatch raises `RecordedProvenanceError` (code `recorded_provenance_drift`) naming the group,
the completion (0-based, as admission does) and what drifted. `replay_behavior_logprobs` is the
stronger check the trainer runs once the model is loaded: it recomputes every sampled token's
behavior log-prob under the recorded sampling controls and compares it with the record, so an
edited temperature / top-k / top-p / penalty is caught even when the records stay self-consistent.

The importance ratio uses the recorded log-probs of *sampled* action tokens. Forced tokens
(a thinking budget closing the block) were never drawn from the behavior policy, so they carry no
behavior log-prob and are treated as context: no policy gradient, no ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.contracts.provenance import (
    prompt_messages_sha256,
)
from core.contracts.recorded import RecordedDrift, check_recorded_corpus, completions_of
from gpu_runtime.grpo.audit import PolicyAuditAccumulator
from gpu_runtime.grpo.errors import RecordedProvenanceError

DRIFT = "recorded_provenance_drift"


@dataclass
class RecordedSummary:
    """Counts for the receipt's `grpo.policy_audit.recorded_provenance` block."""

    completion_count: int = 0
    sampled_action_tokens: int = 0
    forced_action_tokens: int = 0
    unique_behavior_sources: int = 0
    recorded_provenance: dict[str, Any] = field(default_factory=dict)  # the full block

    def to_dict(self) -> dict[str, Any]:
        return dict(self.recorded_provenance)


def template_call(provenance: dict | None, default_kwargs: dict | None) -> tuple[bool, list | None, dict]:
    """(enable_thinking, tools, other template kwargs) a prompt was rendered with."""
    if provenance is not None:
        invocation = provenance.get("template_invocation") or {}
        kwargs = dict(invocation.get("template_kwargs") or {})
        tools = invocation.get("tools") or None
    else:
        kwargs, tools = dict(default_kwargs or {}), None
    thinking = kwargs.pop("enable_thinking", True)
    return bool(thinking), tools, kwargs


def render_prompt_ids(
    tokenizer, messages: list[dict], provenance: dict | None, default_kwargs: dict | None
) -> list[int]:
    from gpu_runtime.model_loading import render_prompt  # tokenizer rendering, no model

    thinking, tools, kwargs = template_call(provenance, default_kwargs)
    _, ids = render_prompt(tokenizer, messages, enable_thinking=thinking, tools=tools, template_kwargs=kwargs)
    return ids


def verify_recorded_groups(
    groups: list[dict],
    tokenizer,
    identity: dict,
    base_adapter_identity: dict | None,
    *,
    template_kwargs: dict | None = None,
    should_stop=None,
) -> RecordedSummary:
    """Check every completion's provenance against the pinned tokenizer and identities.

    `identity` is the trainer's model identity (`gpu_runtime.model_loading.identity_of`, needs
    `base_model_sha256` and `tokenizer`); `base_adapter_identity` is `{"content_sha256": ...}` of
    the warm-start adapter, or None when training starts from the base model. `template_kwargs`
    only matters for records without a `template_invocation` (raw-token prompts).
    """
    from gpu_runtime.grpo.errors import stop_check
    from gpu_runtime.identity import tokenizer_identity

    check_stop = stop_check(should_stop)  # between groups: StopRequested
    tok_identity = identity.get("tokenizer") or tokenizer_identity(tokenizer)
    try:  # everything the records alone prove: the same checker admission ran
        check_recorded_corpus(groups, tokenizer=tok_identity, base_model_sha256=identity["base_model_sha256"],
                              base_adapter=base_adapter_identity)
    except RecordedDrift as exc:
        raise RecordedProvenanceError(exc.code, f"{exc.drift} drift: {exc.detail}", group_index=exc.group_index,
                                      completion_index=exc.completion_index, drift=exc.drift) from None
    audit = PolicyAuditAccumulator()
    prompt_cache: dict[tuple, list[int]] = {}
    for g, group in enumerate(groups):
        check_stop()
        messages = group.get("messages")
        messages_digest = prompt_messages_sha256(messages)
        for c, completion in enumerate(completions_of(group) or []):
            record = completion["provenance"]

            def fail(drift: str, message: str, code: str = DRIFT, g=g, c=c):
                raise RecordedProvenanceError(code, f"{drift} drift: {message}", group_index=g,
                                              completion_index=c, drift=drift)

            # What needs this worker's tokenizer: the prompt replayed through the pinned template,
            # and the completion decoded from its recorded tokens.
            key = (messages_digest, repr(record.get("template_invocation")))
            if key not in prompt_cache:
                prompt_cache[key] = render_prompt_ids(tokenizer, messages, record, template_kwargs)
            expected = prompt_cache[key]
            count = record["prompt_token_count"]
            recorded_prompt = record["input_token_ids"][:count]
            if recorded_prompt != expected:
                at = next(
                    (i for i, (a, b) in enumerate(zip(recorded_prompt, expected, strict=False)) if a != b),
                    min(len(recorded_prompt), len(expected)),
                )
                fail(
                    "prompt_tokens",
                    f"prompt tokens drifted: the pinned template renders {len(expected)} tokens, "
                    f"the record has {count}; first difference at token {at}",
                )
            text, trajectory = completion.get("text"), completion.get("trajectory")
            if not trajectory:
                decoded = tokenizer.decode(record["input_token_ids"][count:], skip_special_tokens=True)
                if not isinstance(text, str) or not decoded.startswith(text):
                    fail("completion_tokens", "completion text drifted: it does not decode from the recorded tokens")
            audit.observe_recorded_completion(record)
    block = audit.to_receipt()["recorded_provenance"]
    return RecordedSummary(
        completion_count=block["completion_count"],
        sampled_action_tokens=block["sampled_action_tokens"],
        forced_action_tokens=block["forced_action_tokens"],
        unique_behavior_sources=block["unique_behavior_sources"],
        recorded_provenance=block,
    )


def action_layout(record: dict) -> tuple[list[int], dict[int, float]]:
    """(trained positions, {position: behavior log-prob}) of a record: the sampled action tokens."""
    positions, behavior = [], {}
    for action in record["action_tokens"]:
        if action["source"] == "sampled":
            positions.append(action["sequence_index"])
            behavior[action["sequence_index"]] = float(action["behavior_logprob"])
    return positions, behavior


def replay_tolerance(
    record_inference_sha256: str, trainer_inference_sha256: str, float32: bool
) -> tuple[str, float]:
    """How closely recomputed behavior log-probs must match: tight when the record was sampled
    under the trainer's own inference configuration in float32, loose (catching edited controls,
    not rounding) otherwise. Returns (statistic, bound) with statistic max_abs or mean_abs."""
    if record_inference_sha256 == trainer_inference_sha256 and float32:
        return "max_abs", 2e-3
    return "mean_abs", 0.1


# The most logits one replay projection may produce (float32: 1 GiB): sampled positions go through
# the vocabulary projection in chunks of whole completions that fit (a long one alone), so a large
# vocabulary cannot run out of memory.
REPLAY_LOGITS_BUDGET = 2**28


def _chunks(items: list, size: int, size_of) -> list[list]:
    """`items` split, in order, so that each chunk's total `size_of` stays within `size` (an item
    larger than that alone)."""
    chunks: list[list] = [[]]
    total = 0
    for item in items:
        n = size_of(item)
        if chunks[-1] and total + n > size:
            chunks.append([])
            total = 0
        chunks[-1].append(item)
        total += n
    return [c for c in chunks if c]


def _batch_ids(entries: list, device):
    """Right-padded ids and attention mask of the entries' (group, completion index, item) items."""
    import torch

    width = max(len(item.input_ids) for _, _, item in entries)
    ids = torch.zeros((len(entries), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(entries), width), dtype=torch.long, device=device)
    for row, (_, _, item) in enumerate(entries):
        ids[row, : len(item.input_ids)] = torch.tensor(item.input_ids, device=device)
        mask[row, : len(item.input_ids)] = 1
    return ids, mask


def _lean_chunks(plan, entries: list, device):
    """Per chunk, [(group, completion index, item, float logits at its sampled positions'
    predecessors)] of one group, on the lean forward: the group's shared prompt once and its
    completions against the prompt's keys and values (the trainer's own layout); only the sampled
    positions are projected."""
    import torch

    from gpu_runtime import lean_decoder

    ids, _ = _batch_ids(entries, device)
    lengths = [len(item.input_ids) for _, _, item in entries]
    first = min(min(item.behavior) for _, _, item in entries)
    hidden = lean_decoder.predicting_hidden(plan, ids, first, prefix=lean_decoder.shared_prefix(ids, lengths))
    vocab = plan.lm_head.shape[0]
    for chunk in _chunks(list(enumerate(entries)), REPLAY_LOGITS_BUDGET, lambda e: len(e[1][2].behavior) * vocab):
        rows, columns = [], []
        for row, (_, _, item) in chunk:
            for p in sorted(item.behavior):
                rows.append(row)
                columns.append(p - first)
        at = (torch.tensor(rows, device=device), torch.tensor(columns, device=device))
        logits = lean_decoder.lm_logits(plan, hidden[at]).float()
        out, offset = [], 0
        for _, (group, c, item) in chunk:
            n = len(item.behavior)
            out.append((group, c, item, logits[offset : offset + n]))
            offset += n
        yield out


def _transformers_chunks(model, entries: list, device):
    """`_lean_chunks` on the transformers forward (a model the lean forward does not cover): the
    chunk's completions right-padded with an attention mask, only the rows from the earliest
    sampled position on projected (`logits_to_keep`); a model whose forward does not take it
    gives every row."""
    vocab = model.get_output_embeddings().weight.shape[0]
    width = max(len(item.input_ids) for _, _, item in entries)  # a completion's logits: at most its width
    for chunk in _chunks(entries, REPLAY_LOGITS_BUDGET, lambda _: width * vocab):
        ids, mask = _batch_ids(chunk, device)
        first = min(min(item.behavior) for _, _, item in chunk) - 1
        try:
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=ids.shape[1] - first).logits
            offset = first
        except TypeError:
            logits, offset = model(input_ids=ids, attention_mask=mask).logits, 0
        yield [(group, c, item, logits[row, [p - 1 - offset for p in sorted(item.behavior)]].float())
               for row, (group, c, item) in enumerate(chunk)]


def _replayable(encoded_groups) -> list[list]:
    """Per group with any, its replayable (group, completion index, item) entries: one forward each."""
    groups = [[(group, c, item) for c, item in enumerate(group.completions)
               if item.provenance is not None and item.behavior] for group in encoded_groups]
    return [g for g in groups if g]


def _sampling_params(record: dict):
    from gpu_runtime.sampling import SamplingParams

    s = dict(record["sampling"])
    s.pop("thinking_budget", None)
    return SamplingParams(**{**s, "stop": tuple(s["stop"])})


def _penalised(rows, item, params, device):
    """A penalised request's logits rows as the sampler saw them: penalties over the prompt and
    the completion so far, position by position."""
    import torch

    from gpu_runtime.sampling import PenaltyState, apply_penalties

    prompt_count = item.provenance["prompt_token_count"]
    state = PenaltyState(item.input_ids[:prompt_count], rows.shape[-1], device)
    penalised, cursor = [], prompt_count
    for k, p in enumerate(sorted(item.behavior)):
        while cursor < p:
            state.add(item.input_ids[cursor])
            cursor += 1
        penalised.append(apply_penalties(rows[k], params, state))
    return torch.stack(penalised)


def behavior_is_reference(group, trainer_inference_sha256: str) -> bool:
    """Whether a group's recorded behavior log-probs are already its KL reference's log-probs, so
    the reference forward would only recompute them. The caller checks the run's side (training
    starts from the base model, the reference is the base model, float32 weights); this checks each
    completion: sampled from the base model itself (no adapter), at temperature 1 with no filter or
    penalty (the distribution drawn from is the model's own), under the trainer's inference
    configuration (so the records match a recomputation within float rounding: what the replay's
    tight tolerance checks), and every trained token was sampled (each carries a record)."""
    for item in group.completions:
        record = item.provenance
        if record is None or not item.behavior or set(item.behavior) != set(item.action_positions):
            return False
        policy = record["behavior_policy"]
        if policy.get("adapter") is not None or policy["inference_config_sha256"] != trainer_inference_sha256:
            return False
        if not _sampling_params(record).draws_from_the_model:
            return False
    return True


def replay_behavior_logprobs(model, encoded_groups, trainer_inference_sha256: str, *,
                             should_stop=None) -> dict[str, Any]:
    """Recompute each recorded completion's sampled-token log-probs with the trainer's initial
    policy (base + warm-start adapter = the behavior policy) under the recorded sampling controls,
    and raise `recorded_provenance_drift` (drift `sampling`) where they do not match the record.
    Returns evidence for the receipt. Call under torch.no_grad with the model on its device.

    The forward is the lean one the trainer uses (`gpu_runtime.lean_decoder`) where the model has
    its shape, else the transformers forward; a group runs as one batch, and the distributions of a
    chunk's positions are computed together (each row under its own completion's controls)."""
    import torch

    from gpu_runtime import lean_decoder
    from gpu_runtime.sampling import behavior_logprobs

    device = next(model.parameters()).device
    float32 = next(model.parameters()).dtype == torch.float32
    try:  # LoRA folded into the weights where the model is small, as the sampler serves it
        plan = lean_decoder.plan_for(model, merge_lora=True)
    except lean_decoder.LeanUnsupported:
        plan = None
    from gpu_runtime.grpo.errors import stop_check

    check_stop = stop_check(should_stop)  # between groups: StopRequested (a forward over the corpus)
    checked, worst = 0, 0.0
    for batch in _replayable(encoded_groups):
        check_stop()
        chunks = (_lean_chunks(plan, batch, device) if plan is not None
                  else _transformers_chunks(model, batch, device))
        for entries in chunks:
            rows, params, targets, recorded = [], [], [], []
            for _, _, item, item_rows in entries:
                item_params = _sampling_params(item.provenance)
                if item_params.uses_penalties:
                    item_rows = _penalised(item_rows, item, item_params, device)
                positions = sorted(item.behavior)
                rows.append(item_rows)
                params += [item_params] * len(positions)
                targets += [item.input_ids[p] for p in positions]
                recorded += [item.behavior[p] for p in positions]
            lp = behavior_logprobs(torch.cat(rows), params)
            replayed = lp.gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1)
            diffs = (replayed.double() - torch.tensor(recorded, device=device, dtype=torch.float64)).abs()
            offset = 0
            for group, c, item, _ in entries:
                n = len(item.behavior)
                diff = diffs[offset : offset + n]
                offset += n
                stat, bound = replay_tolerance(
                    item.provenance["behavior_policy"]["inference_config_sha256"], trainer_inference_sha256, float32
                )
                value = float(diff.max() if stat == "max_abs" else diff.mean())
                if not math.isfinite(value) or value > bound:
                    raise RecordedProvenanceError(
                        DRIFT,
                        f"sampling controls drifted: the recorded behavior log-probs do not replay under the "
                        f"recorded sampling controls ({stat} difference {value:.4g} > {bound:g}); temperature, "
                        "top_k, top_p, min_p or a penalty was edited, or the behavior model differs",
                        group_index=group.index,
                        completion_index=c,
                        drift="sampling",
                    )
            checked += len(targets)
            worst = max(worst, float(diffs.max()))
    return {"checked_tokens": checked, "max_abs_logprob_difference": worst}
