"""Recorded-policy checks that run at submission, before anything is queued (no torch).

The corpus is held to core.contracts.recorded (the checker the trainer runs too) with the served
model's identity as the GPU worker reported it; the GPU worker then replays each prompt through
its pinned tokenizer and decodes the completion tokens before training starts.
"""

from __future__ import annotations

from core.contracts.recorded import RecordedDrift
from core.contracts.recorded import check_recorded_corpus as check_records
from core.errors import KilnError


def check_recorded_corpus(groups: list[dict], *, model_identity: dict | None, base_adapter: dict | None) -> int:
    """Raise a KilnError naming the first drift; return the number of records checked.

    `model_identity` is the served model's identity from the GPU worker (None if it has not
    reported one yet: those two checks then wait for the worker); `base_adapter` is
    {"name", "content_sha256"} of the warm-start adapter, or None for the base model."""
    identity = model_identity or {}
    try:
        return check_records(groups, tokenizer=identity.get("tokenizer"),
                             base_model_sha256=identity.get("base_model_sha256"), base_adapter=base_adapter)
    except RecordedDrift as exc:
        raise KilnError(exc.code, str(exc), status=400, field=f"{exc.where}.provenance",
                        hint="regenerate the rollouts with kiln rollout-generate; do not hand-edit recorded corpora"
                        ) from None
