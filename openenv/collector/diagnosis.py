"""Why a collection taught nothing: a warning when most episodes ended at an action Kiln refused.

Pure module: no Django, no torch. An episode whose action cannot be parsed or breaks the action
schema ends `invalid_model_action` with the protocol-error reward, not the environment's. When that
is most episodes, every group's rewards are (nearly) all the same and GRPO has nothing to learn, yet
the numbers alone (`invalid 18`, `mean return -0.8`) do not say why. `invalid_action_warning(groups)`
names the harness error codes, one refusal's own message, and what to try; the CLI prints it
and a persisted run lists it among its warnings.
"""

from __future__ import annotations

from collections import Counter

from openenv.collector.selection import harness_error

WARN_AT_SHARE = 0.5  # warn when at least this share of the episodes ended at a refused action

# What to try, per harness error code (openenv.client.actions).
ADVICE = {
    "ACTION_SCHEMA_VALIDATION_FAILED": "the replies are JSON but break the action schema in the system prompt",
    "INVALID_MODEL_ACTION": "the replies are not one JSON object",
    "MODEL_ACTION_NO_OUTPUT": "generation ended while the policy was still thinking (raise --max-action-tokens "
                              "or --thinking-budget-tokens)",
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
    return (f"{len(refused)} of {len(completions)} episodes ended at an action Kiln refused ({counted}; e.g. "
            f"{example[:160] or common}): {advice}. Those episodes score the protocol-error reward, not the "
            "environment's, so most groups have nothing to learn from; check the model can follow the action "
            "schema (`kiln openenv inspect URL` shows it), or try --thinking the other way")
