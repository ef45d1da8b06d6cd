"""Errors the GRPO trainer raises, each with a stable `code` (API) and a receipt `failure_reason`.

Pure Python: imports neither torch nor Django, so admission code can catch them cheaply.

- `TrainingError`: the base. `code` is the stable machine-readable cause, `failure_reason` the
  spec §2.9 receipt value (data_schema_error, zero_groups, nan_loss, ...), `receipt` /
  `receipt_path` are attached by the trainer once the failure receipt is written.
- `RecordedProvenanceError`: a recorded-policy completion whose provenance is missing, invalid,
  or drifted from what the pinned tokenizer/template/adapter reproduce. `group_index` and
  `completion_index` are 0-based positions in the request's `groups`; `drift` names what moved.
- `CheckpointError`: a checkpoint that cannot be published, loaded or resumed from.
"""

from __future__ import annotations

from typing import Any


class TrainingError(Exception):
    def __init__(
        self,
        code: str,
        message: str,
        *,
        failure_reason: str = "training_error",
        hint: str | None = None,
    ):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.failure_reason = failure_reason
        self.hint = hint
        self.receipt: dict[str, Any] | None = None
        self.receipt_path: str | None = None


class RecordedProvenanceError(TrainingError):
    """Codes: recorded_provenance_missing, recorded_provenance_invalid, recorded_provenance_drift."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        group_index: int,
        completion_index: int,
        drift: str | None = None,
    ):
        where = f"groups[{group_index}].completions[{completion_index}]"
        super().__init__(
            code,
            f"{where}: {message}",
            failure_reason="data_schema_error",
            hint="Regenerate the rollouts (kiln rollout-generate); do not hand-edit recorded completions, "
            "prompts, sampling controls or provenance.",
        )
        self.group_index = group_index
        self.completion_index = completion_index
        self.drift = drift


class CheckpointError(TrainingError):
    """Codes: checkpoint_not_found, checkpoint_invalid, checkpoint_exists, checkpoint_adapter_mismatch,
    checkpoint_source_mismatch, checkpoint_config_mismatch, checkpoint_base_model_mismatch,
    checkpoint_tokenizer_mismatch, checkpoint_precision_mismatch, checkpoint_data_mismatch."""

    def __init__(self, code: str, message: str):
        super().__init__(code, message, failure_reason="training_error")


class StopRequested(Exception):
    """A stop (cancel, or the worker shutting down) seen inside a long pass over the corpus: the
    trainer ends the run as stopped, so a shutdown is not cut off at the worker's grace period."""


def stop_check(should_stop):
    """A callable for a long loop: raises StopRequested once `should_stop()` says so (None: never)."""
    def check() -> None:
        if should_stop is not None and should_stop():
            raise StopRequested()
    return check
