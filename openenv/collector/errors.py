"""Typed failures of an OpenEnv collection, verification or replay (reference-spec §4.12).

Pure module: no Django, no torch. `CollectionError` extends the client's `OpenEnvError` with the
`stage` a run records (`admission`, `discovery`, `collection`, `identity_verification`,
`artifact_publication`); `code` is our stable code, `failure_code` the
`kiln.openenv-run-failure.v1` code. `as_failure()` gives that record.
"""

from __future__ import annotations

import time

from openenv.client.errors import OpenEnvError

FAILURE_SCHEMA = "kiln.openenv-run-failure.v1"
MAX_MESSAGE_BYTES = 4096


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
    def from_client(cls, exc: OpenEnvError, *, stage: str) -> CollectionError:
        """A client error (discovery, session, capacity) as the failure of a collection stage."""
        if isinstance(exc, CollectionError):
            return exc
        return cls(exc.code, exc.message, stage=stage, failure_code=exc.failure_code or "environment_protocol_error",
                   retryable=exc.retryable, hint=exc.hint, protocol_code=exc.protocol_code,
                   http_status=exc.http_status)

    def as_failure(self) -> dict:
        message = self.message.encode()[:MAX_MESSAGE_BYTES].decode(errors="ignore")
        out = {"schema": FAILURE_SCHEMA, "code": self.failure_code, "stage": self.stage, "retryable": self.retryable,
               "message": message, "hint": self.hint or "", "occurred_unix_ms": int(time.time() * 1000)}
        if self.protocol_code:
            out["protocol_code"] = self.protocol_code
        if self.http_status is not None:
            out["http_status"] = self.http_status
        return out


def invalid_config(message: str, hint: str | None = None) -> CollectionError:
    return CollectionError("openenv_invalid_collection", message, stage="admission",
                           failure_code="persisted_contract_invalid", hint=hint)
