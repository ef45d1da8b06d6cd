"""Typed errors of the OpenEnv client, each with a stable code.

Pure module: no Django, no torch. Every error carries `code` (stable, ours), `message`, `hint`,
and `failure_code`, the `kiln.openenv-run-failure.v1` code (reference-spec §4.12) a run records
when this error ends it, with `retryable`. Wire error codes sent by servers keep their own
spelling (`protocol_code`, e.g. "EXECUTION_ERROR"); model failures keep the harness codes
(`MODEL_ACTION_NO_OUTPUT`, `INVALID_MODEL_ACTION`, `ACTION_SCHEMA_VALIDATION_FAILED`).

No message ever contains a bearer token or the text of a frame that reflected one.
"""

from __future__ import annotations

from typing import Any

# The server's WSErrorCode vocabulary (openenv-protocol.md §4b), the same in every release seen.
RECOVERABLE_WIRE_CODES = frozenset({"INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "EXECUTION_ERROR"})
TERMINAL_WIRE_CODES = frozenset({"CAPACITY_REACHED", "FACTORY_ERROR", "SESSION_ERROR"})
WIRE_CODES = RECOVERABLE_WIRE_CODES | TERMINAL_WIRE_CODES

# The run-failure codes (§4.12) these errors map to.
FAILURE_UNAVAILABLE = "environment_unavailable"
FAILURE_PROTOCOL = "environment_protocol_error"
FAILURE_CAPACITY = "environment_capacity_exhausted"
FAILURE_CONTRACT = "persisted_contract_invalid"


class OpenEnvError(Exception):
    code = "openenv_error"
    failure_code: str | None = FAILURE_PROTOCOL
    retryable = False
    default_hint = ("the environment does not behave as an OpenEnv server (openenv-http/1.x); inspect it with "
                    "kiln openenv inspect URL and fix the server")

    def __init__(self, message: str, *, hint: str | None = None, http_status: int | None = None,
                 protocol_code: str | None = None, endpoint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = self.default_hint if hint is None else hint
        self.http_status = http_status
        self.protocol_code = protocol_code
        self.endpoint = endpoint

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message, "hint": self.hint}
        if self.failure_code:
            out["failure_code"] = self.failure_code
            out["retryable"] = self.retryable
        if self.protocol_code:
            out["protocol_code"] = self.protocol_code
        if self.http_status is not None:
            out["http_status"] = self.http_status
        return out

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# --- configuration: URLs and credentials -------------------------------------------------------

class OpenEnvUrlInvalid(OpenEnvError):
    code = "openenv_invalid_url"
    failure_code = FAILURE_CONTRACT
    default_hint = "give http(s)://host[:port][/path] (or host:port) without credentials, query or fragment"


class OpenEnvCredentialInvalid(OpenEnvError):
    code = "openenv_credential_invalid"
    failure_code = FAILURE_CONTRACT
    default_hint = "set the named variable to the bearer token, or pass - for a public environment"


# --- HTTP: health, discovery, Task API ---------------------------------------------------------

class OpenEnvUnavailable(OpenEnvError):
    """The server could not be reached (refused, reset, timed out) or answered 408/425/429/5xx."""

    code = "openenv_unavailable"
    failure_code = FAILURE_UNAVAILABLE
    retryable = True
    default_hint = "check that the environment server is running and reachable"


class OpenEnvHttpStatus(OpenEnvError):
    code = "openenv_http_status"
    default_hint = "the endpoint does not look like an OpenEnv server (openenv-http/1.x)"


class OpenEnvUnhealthy(OpenEnvHttpStatus):
    code = "openenv_unhealthy"
    default_hint = "GET /health must answer exactly 200 before discovery or a session"


class OpenEnvUnauthorized(OpenEnvHttpStatus):
    """The server answered 401/403: it wants a bearer token we did not send, or refused the one we sent.
    A configuration problem, like a bad credential, so not retryable."""

    code = "openenv_unauthorized"
    failure_code = FAILURE_CONTRACT
    default_hint = ("give the environment's bearer token: --credential-env VAR on the CLI (VAR holds the token), "
                    "credential_ids naming a server [openenv.credentials.<id>] for server runs and inspection")


class OpenEnvRedirectRefused(OpenEnvError):
    code = "openenv_redirect_refused"
    default_hint = "redirects are never followed; give the final URL of the environment"


class OpenEnvResponseTooLarge(OpenEnvError):
    code = "openenv_response_too_large"


class OpenEnvInvalidDocument(OpenEnvError):
    code = "openenv_invalid_discovery"


class OpenEnvActionSchemaInvalid(OpenEnvError):
    code = "openenv_action_schema_invalid"
    default_hint = "the action schema must compile, with internal #/... references only"


class OpenEnvTaskApiFailed(OpenEnvError):
    code = "openenv_task_catalog_failed"


class OpenEnvInvalidTaskPage(OpenEnvError):
    code = "openenv_invalid_task_page"
    failure_code = None
    default_hint = "start must be >= 0 and limit between 1 and 200"


class OpenEnvInvalidTaskSelection(OpenEnvError):
    code = "openenv_invalid_task_selection"
    failure_code = None
    default_hint = "list the environment's splits and task counts with kiln openenv tasks URL (no --split)"


# --- WebSocket sessions ------------------------------------------------------------------------

class OpenEnvUpgradeFailed(OpenEnvError):
    code = "openenv_upgrade_failed"
    default_hint = "the server refused the WebSocket upgrade on /ws"


class OpenEnvSessionPoisoned(OpenEnvError):
    """A lock-step session can no longer pair requests with replies; it is closed and never reused.

    Nothing is resent: the action that was in flight may or may not have reached the environment.
    """

    code = "openenv_session_poisoned"
    default_hint = "the episode cannot continue on this socket; actions are never resent"


class OpenEnvTimeout(OpenEnvSessionPoisoned):
    code = "openenv_timeout"
    failure_code = FAILURE_UNAVAILABLE
    retryable = True
    default_hint = ("the environment took longer than Kiln waits for one reply (the message says how long): check "
                    "its logs for a blocked or slow reset, step or state, or allow longer (kiln openenv rollout "
                    "--reply-timeout-seconds N; a server's runs: [openenv] reply_timeout_secs or "
                    "KILN_OPENENV_REPLY_TIMEOUT_SECS); the episode cannot continue on this socket, and actions are "
                    "never resent")


# Close codes (RFC 6455 §7.4) that say the peer went away or cannot serve now, as does a socket that
# dropped without a close frame (None, 1006): the transport could not keep a usable peer, so the failure
# is `environment_unavailable` (retryable). Any other close code is the peer ending the session while a
# request was pending (1000, 1002 protocol error, 1003, 1007, 1008 policy violation, ...): a protocol error.
UNAVAILABLE_CLOSE_CODES = frozenset({None, 1001, 1006, 1011, 1012, 1013, 1014})


class OpenEnvSocketClosed(OpenEnvSessionPoisoned):
    """The socket ended while a reply was pending. `close_code` is the peer's close code (None: the
    connection dropped or reset without a close frame)."""

    code = "openenv_socket_closed"
    unavailable_hint = ("the environment server went away mid-episode (it crashed, restarted or the network "
                        "dropped); check that it is running and reachable, and its logs")
    protocol_hint = ("the environment closed the session while a reply was pending; see its logs for why it "
                     "refused the episode")

    def __init__(self, message: str, *, close_code: int | None = None, **kwargs):
        self.close_code = close_code
        if close_code in UNAVAILABLE_CLOSE_CODES:
            self.failure_code, self.retryable = FAILURE_UNAVAILABLE, True
            kwargs.setdefault("hint", self.unavailable_hint)
        else:
            kwargs.setdefault("hint", self.protocol_hint)
        super().__init__(message, **kwargs)


class OpenEnvBinaryFrame(OpenEnvSessionPoisoned):
    code = "openenv_binary_frame"


class OpenEnvFrameTooLarge(OpenEnvSessionPoisoned):
    code = "openenv_frame_too_large"
    default_hint = ("an observation or state frame is larger than Kiln reads (the message says the limit): make "
                    "the environment's observations smaller, e.g. a short `input_text` for the model with bulky "
                    "data left out; the episode cannot continue on this socket")


class OpenEnvMalformedJson(OpenEnvSessionPoisoned):
    code = "openenv_malformed_json"


class OpenEnvInvalidMessage(OpenEnvSessionPoisoned):
    code = "openenv_invalid_message"
    default_hint = ("the environment sent a frame that breaks the OpenEnv wire format (the message says which); "
                    "fix how the environment serialises its replies; the episode cannot continue on this socket, "
                    "and actions are never resent")
    # an observation frame's own shape, the likeliest mistake in an environment's step or reset
    observation_hint = ("the environment sent an observation that breaks the OpenEnv wire format (its data is an "
                        "object with observation, reward (a number, a boolean or null) and done (a boolean)); fix "
                        "how the environment serialises its step and reset replies; the episode cannot continue "
                        "on this socket, and actions are never resent")


class OpenEnvUnknownFrameType(OpenEnvSessionPoisoned):
    code = "openenv_unknown_frame_type"


class OpenEnvUnsolicitedFrame(OpenEnvSessionPoisoned):
    code = "openenv_unsolicited_frame"


class OpenEnvUnexpectedResponse(OpenEnvSessionPoisoned):
    code = "openenv_unexpected_response"


class OpenEnvCredentialReflected(OpenEnvSessionPoisoned):
    """A response or frame contained our bearer token (on HTTP or on the socket); it is discarded."""

    code = "openenv_credential_reflected"
    default_hint = "the environment echoed the bearer token back; refusing its data"


class OpenEnvSessionClosed(OpenEnvError):
    code = "openenv_session_closed"
    default_hint = "open a new session"


class OpenEnvOutgoingTooLarge(OpenEnvError):
    """A client frame would exceed 16 MiB; nothing was sent and the session is still usable."""

    code = "openenv_outgoing_frame_too_large"


# What to do about each wire error code when it ends a session or an exchange.
PROTOCOL_HINTS = {
    "FACTORY_ERROR": "the environment could not create a session (its factory failed); see the environment "
                     "server's logs and fix its configuration",
    "SESSION_ERROR": "the environment ended the session; see the environment server's logs",
    "CAPACITY_REACHED": "the environment is at its session limit; reduce concurrency, raise "
                        "capacity_wait_seconds, or raise its max sessions",
    "EXECUTION_ERROR": "the environment failed to execute the request; see the environment server's logs "
                       "(for a reset: check the reset options and seed it accepts)",
    "VALIDATION_ERROR": "the environment rejected the request's fields; compare the action or reset options "
                        "with its advertised schema (kiln openenv inspect URL)",
    "INVALID_JSON": "the environment could not parse the request; report it, Kiln sends canonical JSON",
    "UNKNOWN_TYPE": "the environment does not know this message type; check that it speaks openenv-http/1.x",
}


class OpenEnvProtocolError(OpenEnvError):
    """The server answered a request with an error frame (`protocol_code` is its wire code)."""

    code = "openenv_protocol_error"

    def __init__(self, frame, *, hint: str | None = None):
        if hint is None:
            hint = PROTOCOL_HINTS.get(frame.code, "the environment answered an error frame; see its server's logs")
        super().__init__(f"the environment answered {frame.code}: {frame.message}", hint=hint,
                         protocol_code=frame.code)
        self.frame = frame

    @property
    def terminal(self) -> bool:
        return self.frame.code in TERMINAL_WIRE_CODES


class OpenEnvCapacityReached(OpenEnvProtocolError):
    code = "openenv_capacity_reached"
    failure_code = FAILURE_CAPACITY
    retryable = True


class OpenEnvCapacityExhausted(OpenEnvError):
    code = "openenv_capacity_exhausted"
    failure_code = FAILURE_CAPACITY
    retryable = True
    default_hint = "the environment stayed at capacity; raise capacity_wait_seconds or its max sessions"

    def __init__(self, message: str, *, retries: int, **kwargs):
        super().__init__(message, protocol_code="CAPACITY_REACHED", **kwargs)
        self.retries = retries


class OpenEnvResetDone(OpenEnvError):
    code = "openenv_reset_done"
    default_hint = "a reset must start an episode (done=false)"


class OpenEnvInvalidReward(OpenEnvError):
    code = "openenv_invalid_reward"


# --- the model's action ------------------------------------------------------------------------

class ActionError(OpenEnvError):
    """The model's output is not a valid action; the server is never contacted for it.

    `code` is the harness code; `errors` holds bounded evidence for a schema miss: closed JSON
    Schema keywords and JSON-Pointer paths only, never values from the action.
    """

    failure_code = None

    def __init__(self, code: str, message: str, *, errors: list[dict] | None = None):
        super().__init__(message)
        self.code = code
        self.errors = errors or []

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        if self.errors:
            out["errors"] = self.errors
        return out
