"""What both entry points to inference (the HTTP route and the in-cluster client) share:
the request caps, and how a worker's error event becomes a KilnError."""

from __future__ import annotations

from adapters.serving.schemas import ChatCompletionRequest
from core.contracts.sampling import MAX_N, MAX_TOKENS_CAP
from core.errors import KilnError


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
    return KilnError(event.get("code") or "inference_failed", event.get("message") or "inference failed",
                     hint=event.get("hint") or "", status=status, headers=headers)
