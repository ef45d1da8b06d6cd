"""Turn GRPO groups (spec §2.1) into token sequences, trained positions and advantages. Imports no Django.

Runs on the CPU with the tokenizer only (outside the GPU writer). Three completion shapes:
- plain: the prompt is `messages` through the chat template with the generation prompt
  (`enable_thinking` and other kwargs from the request's `template_kwargs`); the completion is
  the text's tokens plus the end-of-turn token, every one of them an action token;
- trajectory: prompt + segments render as one chat (`masks.build_trajectory_masks`); `kind`
  selects action (policy gradient) and observation (ECHO) tokens;
- recorded: the provenance `input_token_ids` are the sequence, the sampled action tokens are the
  trained positions and carry their behavior log-probs (`recorded.action_layout`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from core.contracts.groups import GroupError, admit_groups
from gpu_runtime.grpo.advantages import group_advantages
from gpu_runtime.grpo.errors import RecordedProvenanceError, TrainingError
from gpu_runtime.grpo.masks import MaskBuildError, build_trajectory_masks, hf_encode, hf_render
from gpu_runtime.grpo.recorded import action_layout, completions_of, render_prompt_ids, template_call


@dataclass
class EncodedCompletion:
    input_ids: list[int]
    action_positions: list[int]
    env_positions: list[int]
    observation_tokens: int  # |O| before warning trimming (ECHO's divisor)
    reward: float
    behavior: dict[int, float] | None = None  # recorded: position -> behavior log-prob
    provenance: dict | None = None
    token_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class EncodedGroup:
    index: int  # position in the request's groups
    rewards: list[float]
    completions: list[EncodedCompletion]
    advantages: list[float] = field(default_factory=list)


def schema_error(message: str) -> TrainingError:
    return TrainingError("data_schema_error", message, failure_reason="data_schema_error")


def check_groups(groups: Any) -> None:
    """Spec §2.1 shape checks, by the same contract admission uses (core.contracts.groups): a
    caller that reaches the trainer directly meets the same rules and messages."""
    try:
        admit_groups(groups)
    except GroupError as exc:
        raise schema_error(str(exc)) from None


def group_rewards(groups: list[dict]) -> list[list[float]]:
    return [[float(c["reward"]) for c in completions_of(g)] for g in groups]


def encode_groups(
    groups: list[dict],
    indices: list[int],
    tokenizer,
    config,
    *,
    template_kwargs: dict | None = None,
    timings: dict[str, float] | None = None,
    should_stop=None,
) -> list[EncodedGroup]:
    """Encode the groups at `indices` (the kept ones, in training order). With `should_stop`, a
    stop between groups raises StopRequested (a large corpus takes minutes to encode)."""
    from gpu_runtime.grpo.errors import stop_check

    check_stop = stop_check(should_stop)
    timings = timings if timings is not None else {}
    eos = tokenizer.eos_token_id
    if eos is None:
        raise schema_error("the tokenizer has no eos token to end a completion with")
    recorded = config.behavior_policy == "recorded"
    echo = config.loss.echo
    out = []
    for g in indices:
        check_stop()
        group = groups[g]
        prompt_ids_cache: dict | None = None
        completions = []
        for c, item in enumerate(completions_of(group)):
            where = f"groups[{g}].completions[{c}]"
            provenance = item.get("provenance") if recorded else None
            trajectory = item.get("trajectory")
            started = time.perf_counter()
            masks = None
            if trajectory:
                thinking, tools, kwargs = template_call(provenance, template_kwargs)
                try:
                    masks = build_trajectory_masks(
                        group["messages"],
                        trajectory,
                        render=hf_render(tokenizer, enable_thinking=thinking, tools=tools, **kwargs),
                        encode=hf_encode(tokenizer),
                        warning_filter=echo.warning_filter if echo else True,
                        env_mask_mode=echo.env_mask_mode if echo else "env_only",
                    )
                except (MaskBuildError, KeyError, TypeError) as exc:
                    raise schema_error(f"{where}.trajectory: {exc}") from exc
                timings["mask_build_ms"] = timings.get("mask_build_ms", 0.0) + _ms(started)
            started = time.perf_counter()
            if provenance is not None:
                encoded = _recorded(item, provenance, masks, g, c)
            elif masks is not None:
                encoded = EncodedCompletion(
                    input_ids=list(masks.input_ids),
                    action_positions=[i for i, on in enumerate(masks.action_mask) if on],
                    env_positions=[i for i, on in enumerate(masks.env_mask) if on],
                    observation_tokens=masks.observation_tokens,
                    reward=float(item["reward"]),
                    token_counts=dict(masks.token_counts),
                )
            else:
                if prompt_ids_cache is None:
                    prompt_ids_cache = {
                        "ids": render_prompt_ids(tokenizer, group["messages"], None, template_kwargs)
                    }
                prompt = prompt_ids_cache["ids"]
                text_ids = list(tokenizer.encode(item["text"], add_special_tokens=False))
                # A finished completion is trained with its end token; one cut off at max_tokens
                # (finish_reason "length") never produced one, and training one would teach every
                # truncated answer to stop there (or, with a negative advantage, never to stop).
                ended = item.get("finish_reason") != "length"
                ids = prompt + text_ids + ([eos] if ended and text_ids[-1:] != [eos] else [])
                encoded = EncodedCompletion(
                    input_ids=ids,
                    action_positions=list(range(len(prompt), len(ids))),
                    env_positions=[],
                    observation_tokens=0,
                    reward=float(item["reward"]),
                    token_counts=_plain_counts(len(prompt), len(ids) - len(prompt)),
                )
            if not encoded.action_positions and not encoded.env_positions:
                raise TrainingError(
                    "zero_action_tokens",
                    f"{where} has no trained tokens",
                    failure_reason="zero_action_tokens",
                )
            if encoded.action_positions and encoded.action_positions[0] < 1:
                raise schema_error(f"{where}: a trained token sits at position 0 (empty prompt)")
            timings["tokenize_ms"] = timings.get("tokenize_ms", 0.0) + _ms(started)
            completions.append(encoded)
        rewards = [c.reward for c in completions]
        out.append(EncodedGroup(g, rewards, completions, group_advantages(rewards, config.advantage_mode)))
    return out


def _recorded(item: dict, provenance: dict, masks, g: int, c: int) -> EncodedCompletion:
    ids = list(provenance["input_token_ids"])
    positions, behavior = action_layout(provenance)
    prompt_count = provenance["prompt_token_count"]
    env_positions, observation_tokens = [], 0
    counts = _plain_counts(prompt_count, len(ids) - prompt_count)
    counts["action_tokens"] = len(positions)
    counts["context_tokens"] = len(ids) - len(positions)
    if masks is not None:
        n = min(len(ids), len(masks.input_ids))
        if ids[:n] != list(masks.input_ids[:n]):
            raise RecordedProvenanceError(
                "recorded_provenance_drift",
                "trajectory drifted: the segments do not render to the recorded tokens",
                group_index=g,
                completion_index=c,
                drift="trajectory",
            )
        action_set = set(positions)
        env_positions = [i for i in range(n) if masks.env_mask[i] and i not in action_set]
        observation_tokens = masks.observation_tokens
        counts.update(
            env_tokens=len(env_positions),
            env_tokens_after_warning_filter=len(env_positions),
            env_tokens_before_warning_filter=masks.token_counts.get("env_tokens_before_warning_filter", 0),
        )
        counts["warning_tokens_filtered"] = counts["env_tokens_before_warning_filter"] - len(env_positions)
        counts["context_tokens"] = len(ids) - len(positions) - len(env_positions)
    return EncodedCompletion(
        input_ids=ids,
        action_positions=positions,
        env_positions=env_positions,
        observation_tokens=observation_tokens,
        reward=float(item["reward"]),
        behavior=behavior,
        provenance=provenance,
        token_counts=counts,
    )


def _plain_counts(prompt: int, completion: int) -> dict[str, int]:
    return {
        "action_tokens": completion,
        "env_tokens": 0,
        "env_tokens_before_warning_filter": 0,
        "env_tokens_after_warning_filter": 0,
        "warning_tokens_filtered": 0,
        "context_tokens": prompt,
    }


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
