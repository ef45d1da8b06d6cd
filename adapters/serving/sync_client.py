"""A synchronous, in-cluster /v1/chat/completions for worker-side jobs (no HTTP, no event loop).

A control-queue job (e.g. `rollouts.generate`) may not know the web server's URL, so it talks to
the GPU worker the way the web process does: validate the body with the server's own contract
(`schemas.ChatCompletionRequest`), check the serving profile and that a live GPU worker has the
model loaded, send the `infer` actor message, and BLPOP the request's Redis event list
(transport.py) until `done` (the response) or `error` (raised as KilnError with the event's
code, message, hint and status). Non-streaming only.

Imports no torch and no gpu_runtime (the actor module imports them only inside its function).
Thread-safe: jobs call it from several threads at once.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid

from pydantic import ValidationError

from adapters.serving import transport
from adapters.serving.limits import check_caps, error_from_event
from adapters.serving.schemas import ChatCompletionRequest
from adapters.serving.transport import (
    FIRST_EVENT_TIMEOUT,
    IDLE_TIMEOUT,
    WorkerLost,
    claim_key,
    events_key,
    first_time,
)
from core.errors import KilnError
from core.redis_clients import blocking_client_options

_clients: dict[str, object] = {}
_clients_lock = threading.Lock()


def _redis():
    """One sync client (and connection pool) per Redis URL for the process."""
    import redis

    from adapters.serving.transport import _redis_url

    url = _redis_url()
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(url, **blocking_client_options(
                max(FIRST_EVENT_TIMEOUT, IDLE_TIMEOUT)))
    return client


def validate_body(body) -> ChatCompletionRequest:
    """The server's own parse of `body`, with the API's caps; KilnError on a refusal."""
    if not isinstance(body, dict):
        raise KilnError("validation_error", "the chat completion body must be a JSON object", status=422)
    try:
        parsed = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg", "invalid request")
        raise KilnError("validation_error", message, status=422,
                        hint=f"{len(exc.errors())} problem(s) in the request") from None
    check_caps(parsed)
    if parsed.stream:
        raise KilnError("stream_unsupported", "the in-cluster client answers whole responses only; send "
                        "stream=false", status=400)
    return parsed




def chat_completion_sync(body: dict, timeout: float = 900.0, *, activity: str = "inference") -> dict:
    """Run one chat completion on the GPU worker and return the OpenAI-shaped response.

    `timeout` bounds the whole call (queueing included); within it the worker must answer within
    FIRST_EVENT_TIMEOUT and then go no longer than IDLE_TIMEOUT between events. When the worker that
    took the request dies before answering (kill -9, out of memory), or Redis goes down with the
    request in it (kiln serve restarts a crashed private Redis, empty), the request is sent once more
    once a worker serves again (a seeded request answers the same); a second loss is a 503
    `inference_worker_lost`. `activity` is what the serving profile must admit: the serving canary
    of an adapter change says "adapter_change", which maintenance admits.
    """
    from adapters.serving.selectors import require_inference_ready, require_servable_adapter
    from core.profiles import require_profile_allows

    require_profile_allows(activity)
    parsed = validate_body(body)
    if activity == "inference":  # the canary is how a quarantined adapter is judged again
        require_servable_adapter(parsed.adapter)
    require_inference_ready()
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    deadline = time.monotonic() + timeout
    payload = parsed.model_dump(mode="json")
    from redis.exceptions import ConnectionError as RedisConnectionError

    for attempt in range(RESEND_ATTEMPTS + 1):
        try:
            return _send_and_wait(payload, deadline)
        except (WorkerLost, RedisConnectionError) as lost:
            if attempt == RESEND_ATTEMPTS:
                raise KilnError("inference_worker_lost", f"the GPU worker stopped while answering ({lost})",
                                status=503, hint="kiln serve restarts it; submit the request again") from None
            if isinstance(lost, RedisConnectionError):
                _wait_for_redis(deadline)
            _wait_for_a_worker(deadline)
    raise AssertionError("unreachable")


RESEND_ATTEMPTS = 1


def _claimed_by_dead_worker(client, request_id: str) -> str | None:
    """The id of the dead worker that took this request, or None (not taken yet, or its worker lives)."""
    from adapters.serving.selectors import worker_dead

    worker_id = client.get(claim_key(request_id))
    if worker_id is None:
        return None
    worker_id = worker_id.decode() if isinstance(worker_id, bytes) else str(worker_id)
    return worker_id if worker_dead(worker_id) else None


REDIS_RETURN_SECONDS = 30.0  # kiln serve restarts a crashed private Redis within about a second


def _wait_for_redis(deadline: float) -> None:
    """Until Redis answers again (at most REDIS_RETURN_SECONDS, and not past the call's deadline)."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    give_up = min(deadline, time.monotonic() + REDIS_RETURN_SECONDS)
    while True:
        try:
            _redis().ping()
            return
        except (RedisConnectionError, RedisTimeoutError):
            if time.monotonic() + 0.5 > give_up:
                return  # the resend then says what is wrong
            time.sleep(0.5)


def _wait_for_a_worker(deadline: float) -> None:
    """Until a live GPU worker has the model loaded again (kiln serve restarts a dead one)."""
    from adapters.serving.selectors import require_inference_ready

    while True:
        try:
            require_inference_ready()
            return
        except KilnError:
            if time.monotonic() + transport.LIVENESS_POLL_SECONDS > deadline:
                raise
        time.sleep(1.0)


def _send_and_wait(payload: dict, deadline: float) -> dict:
    from adapters.serving.tasks import run_chat_completion

    client = _redis()
    request_id = uuid.uuid4().hex
    key = events_key(request_id)
    wait, last_seq = FIRST_EVENT_TIMEOUT, 0
    try:
        run_chat_completion.send(request_id, payload)
        quiet_since = time.monotonic()
        while True:
            remaining = deadline - time.monotonic()
            step = min(wait - (time.monotonic() - quiet_since), remaining, transport.LIVENESS_POLL_SECONDS)
            if remaining <= 0:
                raise KilnError("inference_timeout", "no complete answer from the GPU worker within the call's "
                                "timeout", status=504, hint="the GPU worker may be busy or stopped; see /health")
            if step <= 0:
                raise KilnError("inference_timeout", f"no answer from the GPU worker within {wait:.0f}s",
                                status=504, hint="the GPU worker may be busy or stopped; see /health")
            # Whole seconds (at least 1): BLPOP's timeout 0 would block forever.
            item = client.blpop([key], timeout=max(1, math.ceil(step)))
            if item is None:
                dead = _claimed_by_dead_worker(client, request_id)
                if dead is not None:
                    raise WorkerLost(f"worker {dead}")
                continue
            event = json.loads(item[1])
            if not first_time(event, last_seq):
                continue  # a stalled Redis took this event twice
            last_seq = event["seq"] if isinstance(event.get("seq"), int) else last_seq
            if event.get("type") == "done":
                return event["response"]
            if event.get("type") == "error":
                raise error_from_event(event)
            wait, quiet_since = IDLE_TIMEOUT, time.monotonic()
    finally:
        try:
            transport.close_request(client, request_id)
        except Exception:  # noqa: BLE001 - the keys expire anyway (transport.EVENT_TTL_SECONDS)
            pass
