"""Why a collection taught nothing: a warning when most episodes ended at an action Kiln refused,
and one when the environment refused every action most episodes sent.

Pure module: no Django, no torch. An episode whose action cannot be parsed or breaks the action
schema ends `invalid_model_action` with the protocol-error reward, not the environment's. When that
is most episodes, every group's rewards are (nearly) all the same and GRPO has nothing to learn, yet
the numbers alone (`invalid 18`, `mean return -0.8`) do not say why. `invalid_action_warning(groups)`
names the harness error codes, one refusal's own message, and what to try.

The other way round, an environment whose `step` refuses actions its own published schema accepts
(Kiln validated them before sending) answers every action with a recoverable error: the episodes
end `protocol_error` or run out of steps, every return is the same sum of protocol-error rewards,
and the model is blameless. `environment_refusal_warning(groups)` says so. `collection_warnings`
gives both; the CLI prints them and a persisted run lists them among its warnings.
"""

from __future__ import annotations

import json
from collections import Counter

from openenv.collector.selection import harness_error, select_for_training

WARN_AT_SHARE = 0.5  # warn when at least this share of the episodes ended at a refused action

# What to try, per harness error code (openenv.client.actions).
ADVICE = {
    "ACTION_SCHEMA_VALIDATION_FAILED": "the replies are JSON but break the action schema in the system prompt",
    "INVALID_MODEL_ACTION": "the replies are not one JSON object",
    # a thinking budget is what closes the reasoning early enough to leave tokens for the action
    "MODEL_ACTION_NO_OUTPUT": "generation ended while the policy was still thinking (raise --max-action-tokens, "
                              "or set --thinking-budget-tokens below it so the reasoning closes with room left "
                              "for the action)",
}


def invalid_action_warning(groups: list[dict]) -> str | None:
    """One line when at least WARN_AT_SHARE of the episodes in `groups` (canonical AgenticGroups)
    ended `invalid_model_action`; None otherwise."""
    completions = [c for group in groups for c in group.get("completions") or []]
    refused = [c for c in completions if (c.get("openenv") or {}).get("termination") == "invalid_model_action"]
    if not completions or len(refused) < WARN_AT_SHARE * len(completions):
        return None
    errors = [harness_error(c) or {"code": "UNKNOWN", "message": ""} for c in refused]
    codes = Counter(str(error.get("code")) for error in errors)
    common = codes.most_common(1)[0][0]
    example = next(str(e.get("message") or "") for e in errors if str(e.get("code")) == common)
    counted = ", ".join(f"{code} {count}" for code, count in codes.most_common())
    advice = ADVICE.get(common, "the policy's replies were refused")
    # The groups training would skip (no usable completion, or all remaining returns equal): in a multi-step
    # game, episodes that end at a refused action may still have earned differing rewards first
    flat = len(groups) - len(select_for_training(groups).groups)
    if flat == len(groups):
        groups_left = "no group has anything to learn from"
    elif flat == 0:
        groups_left = "the groups learn less, though every group's returns still differ"
    else:
        groups_left = (f"{flat} of {len(groups)} groups (those whose returns are all the same) have nothing to "
                       "learn from and the rest less")
    # Measured on four unseen flat schemas (docs/tiny-model.md): two were 4-5x as valid with thinking off,
    # two 1.3-1.6x with it on, so the advice is "the other way"; nested values it cannot write either way
    try_next = ("check the model can follow the action schema (`kiln openenv inspect URL` shows it), or try "
                "--thinking the other way" + ("; a small model may not manage fields that hold a list, an object "
                                              "or a nested model" if common == "ACTION_SCHEMA_VALIDATION_FAILED"
                                              else ""))
    # the guide: a completion cut off while thinking has no action to score and is left out of training
    consequence = ("Those completions have no action to score and are left out of training"
                   if common == "MODEL_ACTION_NO_OUTPUT" else
                   "Those episodes end with the protocol-error reward, not the environment's")
    return (f"{len(refused)} of {len(completions)} episodes ended at an action Kiln refused ({counted}; e.g. "
            f"{example[:160] or common}): {advice}. {consequence}, so {groups_left}; {try_next}")


def _environment_errors(completion: dict) -> tuple[int, list[dict]]:
    """(actions the episode sent, the environment's error for each one it refused)."""
    actions, errors = 0, []
    for segment in completion.get("trajectory") or []:
        if segment.get("kind") == "action":
            actions += 1
            continue
        try:
            value = json.loads(segment.get("content") or "")
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("openenv_error"), dict):
            errors.append(value["openenv_error"])
    return actions, errors


def environment_refusal_warning(groups: list[dict]) -> str | None:
    """One line when at least WARN_AT_SHARE of the episodes had every action they sent refused by the
    environment's `step` (a recoverable protocol error each time); None otherwise."""
    completions = [c for group in groups for c in group.get("completions") or []]
    refused = []
    for completion in completions:
        actions, errors = _environment_errors(completion)
        if actions and len(errors) >= actions:
            refused.append(errors)
    if not completions or len(refused) < WARN_AT_SHARE * len(completions):
        return None
    errors = [error for episode in refused for error in episode]
    codes = Counter(str(error.get("code") or "UNKNOWN") for error in errors)
    common = codes.most_common(1)[0][0]
    example = next(str(e.get("message") or "") for e in errors if str(e.get("code") or "UNKNOWN") == common)
    counted = ", ".join(f"{code} {count}" for code, count in codes.most_common())
    return (f"in {len(refused)} of {len(completions)} episodes the environment refused every action ({counted}; e.g. "
            f"{example[:160] or common}). Kiln checked each of them against the action schema the environment "
            "publishes before sending it, so its step accepts something else than its /schema says (or fails "
            "for its own reasons): the returns are protocol-error rewards, not the environment's; fix the "
            "environment (`kiln openenv inspect URL` shows the schema it publishes)")


def collection_warnings(groups: list[dict]) -> list[str]:
    return [w for w in (invalid_action_warning(groups), environment_refusal_warning(groups)) if w]
