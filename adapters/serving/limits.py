"""What both entry points to inference (the HTTP route and the in-cluster client) share:
the request caps, the hint each worker error code carries, and how a worker's error event becomes a
KilnError."""

from __future__ import annotations

from adapters.serving.schemas import ChatCompletionRequest
from core.contracts.sampling import MAX_N, MAX_TOKENS_CAP
from core.errors import KilnError

# The fix for each code a chat completion can fail with on the GPU worker: an error event (and so a
# streamed error, which no API exception handler fills in) never carries an empty hint.
ERROR_HINTS = {
    "invalid_request": "check the request against /v1/docs: the GPU worker refused one of its values",
    "adapter_not_found": "list published adapters with GET /v1/adapters; leave adapter out for the active one, "
                         "or send \"base\" for the base model",
    "adapter_content_mismatch": "the adapter's files changed after publication: republish it under a new name, "
                                "or restore its files (kiln adapters verify NAME says which changed)",
    "adapter_load_failed": "the adapter's config and weights do not fit this model: check the adapter folder",
    "context_length_exceeded": "shorten the messages or lower max_tokens",
    "registry_unavailable": "the database behind the adapter registry did not answer: check that it is up "
                            "(GET /health), then send the request again",
    "server_shutting_down": "the GPU worker is stopping (kiln serve is shutting down or restarting it): "
                            "send the request again once GET /health says the model is loaded",
    "sampler_stopped": "the GPU worker's sampler stopped: send the request again once GET /health says the "
                       "model is loaded",
    "model_unavailable": "set KILN_MODEL_PATH or [model] path in kiln.toml, then restart",
    "model_loading": "retry in a few seconds; /health shows progress",
    "inference_timeout": "the GPU worker may be busy or stopped; see /health",
    "inference_worker_lost": "kiln serve restarts it; send the request again",
}
_DEFAULT_HINT = "see the GPU worker's log for details, then send the request again"


def hint_for(code: str) -> str:
    return ERROR_HINTS.get(code, _DEFAULT_HINT)


def check_caps(body: ChatCompletionRequest) -> None:
    if body.n > MAX_N:
        raise KilnError("n_too_large", f"n is {body.n}; at most {MAX_N} choices per request", status=400,
                        hint="send several requests instead")
    if (body.effective_max_tokens or 0) > MAX_TOKENS_CAP:
        raise KilnError("max_tokens_too_large", f"max_tokens is {body.effective_max_tokens}; the cap is "
                        f"{MAX_TOKENS_CAP}", status=400)


def error_from_event(event: dict) -> KilnError:
    try:
        status = int(event.get("status", 500))
    except (TypeError, ValueError):
        status = 500
    # A 503 from the worker (it is stopping, the model is loading) passes after a wait: say how long.
    headers = {"Retry-After": "5"} if status == 503 else None
    code = event.get("code") or "inference_failed"
    return KilnError(code, event.get("message") or "inference failed",
                     hint=event.get("hint") or hint_for(code), status=status, headers=headers)
