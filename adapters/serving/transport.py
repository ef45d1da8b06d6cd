"""Carries one inference request's events from the GPU worker to the web process over Redis.

The web process enqueues the request on the `infer` queue and reads events from a Redis list
named after the request; the worker appends them: zero or more `delta` events, then exactly one
`done` (the full response) or `error` ({code, message, hint, status}). The list expires, so an
abandoned request leaves nothing behind. A worker that takes a request first records its worker id
under `claim_key`, so a reader can tell a request whose worker died (kill -9, out of memory) from
one that is only waiting behind other work.

A Redis that stalls (paused, swapping, a slow disk under its AOF) must not cost an answer: the worker
waits up to EMIT_PATIENCE_SECONDS for it, sending a command again when a read timed out. Every event
carries its number (`seq`), so an event a stalled Redis took twice is read once.
"""

from __future__ import annotations

import json
import logging
import math
import time

from core.redis_clients import blocking_client_options

log = logging.getLogger(__name__)

EVENT_TTL_SECONDS = 600
# How long a reader waits for the worker: for the first event (a busy GPU worker may finish a
# training group first), then between events. The HTTP route and the in-cluster client share them.
FIRST_EVENT_TIMEOUT = 300.0
IDLE_TIMEOUT = 120.0
# How long a worker keeps trying to hand an event to a Redis that does not answer (a stall, a restart
# by kiln serve) before it gives the request up. A single command waits EMIT_READ_SECONDS.
EMIT_PATIENCE_SECONDS = 120.0
EMIT_READ_SECONDS = 15.0


def events_key(request_id: str) -> str:
    return f"kiln:infer:{request_id}"


def claim_key(request_id: str) -> str:
    return f"kiln:infer:{request_id}:worker"


def closed_key(request_id: str) -> str:
    """Set when the request's reader has left (answered, timed out, worker lost, client gone): a message
    the broker redelivers after its worker died is then dropped, not generated for nobody."""
    return f"kiln:infer:{request_id}:closed"


def close_request(client, request_id: str):
    """The reader's last word on a request (sync client, or the awaitable of an asyncio one)."""
    pipe = client.pipeline()
    pipe.delete(events_key(request_id), claim_key(request_id))
    pipe.set(closed_key(request_id), 1, ex=EVENT_TTL_SECONDS)
    return pipe.execute()


def _redis_url() -> str:
    from django.conf import settings

    return settings.KILN.effective_redis_url


class WorkerEmitter:
    """Worker side: append events for one request (sync redis client)."""

    def __init__(self, request_id: str, client=None, *, patience: float = EMIT_PATIENCE_SECONDS):
        import redis

        self.key = events_key(request_id)
        self.client = client or redis.Redis.from_url(_redis_url(), **blocking_client_options(EMIT_READ_SECONDS))
        self.patience = patience
        self._seq = 0

    def _patiently(self, command):
        """Run `command()`, again while Redis does not answer (up to `patience` seconds in all)."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        deadline, delay = time.monotonic() + self.patience, 0.25
        while True:
            try:
                return command()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("Redis did not answer for %s (%s); trying again", self.key, exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def claim(self, worker_id: str) -> None:
        """Say which worker answers this request (before any work on it)."""
        self._patiently(lambda: self.client.set(claim_key(self.key.removeprefix("kiln:infer:")), worker_id,
                                                ex=EVENT_TTL_SECONDS))

    def reader_gone(self) -> bool:
        """Whether nobody waits for this request any more (see closed_key). A Redis that does not answer
        says nothing about the reader: the work goes on."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        try:
            return bool(self.client.exists(closed_key(self.key.removeprefix("kiln:infer:"))))
        except (RedisConnectionError, RedisTimeoutError):
            return False

    def emit(self, event: dict) -> None:
        self._seq += 1
        data = json.dumps({**event, "seq": self._seq})

        def push():
            pipe = self.client.pipeline()
            pipe.rpush(self.key, data)
            pipe.expire(self.key, EVENT_TTL_SECONDS)
            pipe.execute()

        self._patiently(push)


def first_time(event: dict, last_seq: int) -> bool:
    """Whether a reader that has read events up to `last_seq` reads `event` for the first time (an event
    a stalled Redis took twice comes again with the same `seq`; events without one are always new)."""
    seq = event.get("seq")
    return not isinstance(seq, int) or seq > last_seq


class WorkerLost(Exception):
    """The worker that took the request is dead and never answered (kill -9, out of memory)."""


LIVENESS_POLL_SECONDS = 5.0  # how often a waiting reader checks that the request's worker lives


async def read_events(request_id: str, *, first_event_timeout: float, idle_timeout: float, worker_dead=None):
    """Web side: yield events until `done` or `error`; raise TimeoutError if the worker goes quiet,
    and WorkerLost as soon as `await worker_dead(worker_id)` says the worker that claimed the request
    died (checked every LIVENESS_POLL_SECONDS while no event comes)."""

    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(_redis_url(), **blocking_client_options(max(first_event_timeout, idle_timeout)))
    key = events_key(request_id)
    timeout, quiet_since, last_seq = first_event_timeout, time.monotonic(), 0
    try:
        while True:
            left = timeout - (time.monotonic() - quiet_since)
            if left <= 0:
                raise TimeoutError(f"no answer from the GPU worker within {timeout:.0f}s")
            step = min(left, LIVENESS_POLL_SECONDS) if worker_dead is not None else left
            item = await client.blpop([key], timeout=max(1, math.ceil(step)))
            if item is None:
                claimant = await client.get(claim_key(request_id))
                if claimant is not None and worker_dead is not None:
                    claimant = claimant.decode() if isinstance(claimant, bytes) else str(claimant)
                    if await worker_dead(claimant):
                        raise WorkerLost(f"worker {claimant}")
                continue
            event = json.loads(item[1])
            if not first_time(event, last_seq):
                continue
            last_seq = event.get("seq") if isinstance(event.get("seq"), int) else last_seq
            yield event
            if event["type"] in ("done", "error"):
                return
            timeout, quiet_since = idle_timeout, time.monotonic()
    finally:
        await close_request(client, request_id)
        await client.aclose()
