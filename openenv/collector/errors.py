"""Typed failures of an OpenEnv collection, verification or replay (reference-spec §4.12).

Pure module: no Django, no torch. `CollectionError` extends the client's `OpenEnvError` with the
`stage` a run records (`admission`, `discovery`, `collection`, `identity_verification`,
`artifact_publication`); `code` is our stable code, `failure_code` the
`kiln.openenv-run-failure.v1` code. `as_failure()` gives that record.

`failure_record(...)` is the one place a run failure is built (`as_failure()`, and
openenv.runs.services.failure, which every other path uses; `run_transition` passes every stored
failure through `checked_failure`). The record's `code` is always one of the closed
`FAILURE_CODES` (the replay reference's stable codes) and its `stage` one of `FAILURE_STAGES`: a
code outside the vocabulary becomes the stage's own code (`STAGE_FALLBACK`, else `internal_error`)
with the original code kept at the head of the message. Every record carries a non-empty hint
(`DEFAULT_HINTS`), and a retryable one says that a new attempt needs a new idempotency key (an
exact retry of the same key returns the original terminal run).
"""

from __future__ import annotations

import logging
import time

from openenv.client.errors import OpenEnvError

log = logging.getLogger(__name__)

FAILURE_SCHEMA = "kiln.openenv-run-failure.v1"
MAX_MESSAGE_BYTES = 4096

# The closed vocabulary (docs/training/OPENENV_REPLAY_REFERENCE.md of the reference, "Persisted failure
# semantics"), with what each one means.
FAILURE_CODES = frozenset({
    "run_admission_failed",  # Kiln could not acquire or persist workflow admission
    "run_interrupted",  # a restart interrupted a non-resumable environment, trainer, or evaluator owner
    "persisted_contract_invalid",  # a retained request or sealed training contract cannot execute safely
    "environment_unavailable",  # discovery or the stateful transport could not reach a usable peer
    "environment_capacity_exhausted",  # fresh-session acquisition exhausted the bounded capacity wait
    "environment_protocol_error",  # the peer violated or terminally rejected the advertised protocol
    "environment_identity_changed",  # final discovery revalidation found a deployment change
    "collection_failed",  # episode collection or policy execution failed before a complete corpus existed
    "artifact_publication_failed",  # a complete collection could not publish its artifact bundle
    "training_submission_failed",  # native GRPO rejected or lost the training handoff
    "training_failed",  # the authoritative native trainer failed
    "training_evidence_invalid",  # trainer receipt, manifest, corpus digest or lineage failed validation
    "post_evaluation_failed",  # a requested static evaluation failed or never published
    "environment_evaluation_failed",  # paired held-out collection, evidence, or promotion failed
    "internal_error",  # no narrower safe category applies
})
FAILURE_STAGES = ("restoration", "admission", "discovery", "collection", "identity_verification",
                  "artifact_publication", "training_submission", "training", "post_evaluation",
                  "environment_evaluation", "orchestration")
# A code outside the vocabulary, at these stages, becomes the stage's own code (else internal_error).
STAGE_FALLBACK = {"admission": "run_admission_failed", "collection": "collection_failed",
                  "artifact_publication": "artifact_publication_failed",
                  "training_submission": "training_submission_failed", "training": "training_failed",
                  "post_evaluation": "post_evaluation_failed",
                  "environment_evaluation": "environment_evaluation_failed"}
NEW_ATTEMPT = "submit it as a new run with a new idempotency_key (the same key returns this failed run)"
DEFAULT_HINTS = {
    "run_admission_failed": "check the server's log and its [openenv] limits, then submit the run again",
    "run_interrupted": "the server or a worker restarted mid-run; check that kiln serve is running",
    "persisted_contract_invalid": "fix the request (URLs, credential_ids, adapter, training config) and submit "
                                  "a new run",
    "environment_unavailable": "check that the environment server is running and reachable from the control "
                               "worker",
    "environment_capacity_exhausted": "reduce concurrency, raise capacity_wait_seconds, or raise the "
                                      "environment's session limit",
    "environment_protocol_error": "the environment broke the OpenEnv protocol; inspect it with "
                                  "kiln openenv inspect URL and fix the server",
    "environment_identity_changed": "pin or stabilize the environment deployment, inspect it again",
    "collection_failed": "check that the model service (kiln serve's GPU worker and Redis) is running",
    "artifact_publication_failed": "check free disk space and permissions under KILN_HOME",
    "training_submission_failed": "see the refusal above (queue, memory, serving profile) and correct it",
    "training_failed": "see the training job (kiln train status JOB) for the trainer's error",
    "training_evidence_invalid": "the trainer's evidence does not match the run; do not use the adapter, "
                                 "inspect the run's artifacts",
    "post_evaluation_failed": "see the post-evaluation job (kiln eval status JOB); the adapter was not promoted",
    "environment_evaluation_failed": "see the message; the candidate adapter was not promoted",
    "internal_error": "an unexpected error ended the run; the control worker's log has the traceback",
}


# A model-server refusal seen from an episode: the chat route's hint speaks of messages and max_tokens,
# which an OpenEnv user does not write; these say what the user can change instead.
POLICY_REFUSAL_HINTS = {
    "context_length_exceeded": "the episode's prompt (the system prompt with the action schema, then every "
                               "observation so far) no longer fits the model's context: have the environment send "
                               "a short observation `input_text` (Kiln then shows it instead of the whole wire "
                               "JSON), make its observations smaller, lower --max-steps, or serve a model with a "
                               "longer context",
}


def policy_refusal_hint(code: str, hint: str | None) -> str | None:
    """The hint for an episode whose model request was refused with `code` (the route's own `hint` else)."""
    return POLICY_REFUSAL_HINTS.get(code) or hint or None


def failure_record(code: str, stage: str, message: str, *, retryable: bool = False, hint: str | None = None,
                   protocol_code: str | None = None, http_status: int | None = None,
                   occurred_unix_ms: int | None = None) -> dict:
    """A `kiln.openenv-run-failure.v1` record, always in the closed vocabulary, with a hint."""
    if stage not in FAILURE_STAGES:
        log.error("run failure at unknown stage %r recorded at stage orchestration", stage)
        message = f"[{stage}] {message}"
        stage = "orchestration"
    if code not in FAILURE_CODES:
        fallback = STAGE_FALLBACK.get(stage, "internal_error")
        log.error("run failure code %r is outside the closed vocabulary; recorded as %s", code, fallback)
        message = f"{code}: {message}" if code and not message.startswith(f"{code}:") else message
        code = fallback
    hint = (hint or "").strip() or DEFAULT_HINTS[code]
    if retryable and "idempotency_key" not in hint:
        hint = f"{hint.rstrip('.; ')}; then {NEW_ATTEMPT}"
    out = {"schema": FAILURE_SCHEMA, "code": code, "stage": stage, "retryable": bool(retryable),
           "message": message.encode()[:MAX_MESSAGE_BYTES].decode(errors="ignore"), "hint": hint,
           "occurred_unix_ms": int(time.time() * 1000) if occurred_unix_ms is None else occurred_unix_ms}
    if protocol_code:
        out["protocol_code"] = protocol_code
    if http_status is not None:
        out["http_status"] = http_status
    return out


def checked_failure(value: dict) -> dict:
    """A stored failure record normalized by `failure_record` (an already valid one is unchanged)."""
    return failure_record(value.get("code") or "", value.get("stage") or "orchestration", value.get("message") or "",
                          retryable=bool(value.get("retryable")), hint=value.get("hint"),
                          protocol_code=value.get("protocol_code"), http_status=value.get("http_status"),
                          occurred_unix_ms=value.get("occurred_unix_ms"))


class CollectionError(OpenEnvError):
    code = "openenv_collection_failed"
    failure_code = "environment_protocol_error"
    stage = "collection"

    def __init__(self, code: str, message: str, *, stage: str | None = None, failure_code: str | None = None,
                 retryable: bool | None = None, hint: str | None = None, protocol_code: str | None = None,
                 http_status: int | None = None):
        super().__init__(message, hint=hint, protocol_code=protocol_code, http_status=http_status)
        self.code = code
        if stage is not None:
            self.stage = stage
        if failure_code is not None:
            self.failure_code = failure_code
        if retryable is not None:
            self.retryable = retryable

    @classmethod
    def from_client(cls, exc: OpenEnvError, *, stage: str, environment_url: str | None = None) -> CollectionError:
        """A client error (discovery, session, capacity) as the failure of a collection stage; with
        `environment_url`, the message names the environment (with several, which one went away)."""
        if isinstance(exc, CollectionError):
            return exc
        message = exc.message
        if environment_url and environment_url not in message:
            message = f"environment {environment_url}: {message}"
        return cls(exc.code, message, stage=stage, failure_code=exc.failure_code or "environment_protocol_error",
                   retryable=exc.retryable, hint=exc.hint, protocol_code=exc.protocol_code,
                   http_status=exc.http_status)

    def as_failure(self) -> dict:
        return failure_record(self.failure_code or "", self.stage, self.message, retryable=self.retryable,
                              hint=self.hint, protocol_code=self.protocol_code, http_status=self.http_status)


# A collection setting out of bounds is the caller's to fix; OpenEnvError's default hint would blame the
# environment, which no request has reached yet.
INVALID_CONFIG_HINT = ("correct the collection setting the message names (on the command line, the option of that "
                       "name, e.g. --capacity-wait-seconds for capacity_wait_seconds; in a run request, that field)")


def invalid_config(message: str, hint: str | None = None) -> CollectionError:
    return CollectionError("openenv_invalid_collection", message, stage="admission",
                           failure_code="persisted_contract_invalid", hint=hint or INVALID_CONFIG_HINT)
