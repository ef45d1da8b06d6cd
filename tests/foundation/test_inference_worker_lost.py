"""An in-cluster chat completion whose GPU worker dies before answering (kill -9, out of memory).

Before the fix the caller (an OpenEnv run's policy, an eval job, rollout generation) waited the
whole first-event timeout (300 s) and failed with `inference_timeout`. The worker that takes a
request now records its id next to the request's event list; a waiting reader that finds that
worker dead sends the request once more to the worker that replaced it, and fails at once with a
503 `inference_worker_lost` when that one dies too. Real Redis; the `infer` actor's send is
replaced by workers that claim the request (and answer it, or not)."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace

import pytest
from django.utils import timezone

from adapters.serving import sync_client, tasks, transport
from adapters.serving.transport import WorkerEmitter, claim_key, events_key
from core.errors import KilnError
from core.jobs.models import WorkerHeartbeat
from tests.foundation.test_redis_timeouts import redis_url  # noqa: F401 - the real Redis fixture

pytestmark = pytest.mark.django_db
BODY = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "seed": 1, "max_tokens": 8}
RESPONSE = {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}


def _worker(worker_id: str, *, alive: bool) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.update_or_create(
        worker_id=worker_id, defaults={"hostname": socket.gethostname(), "pid": os.getpid(), "queues": ["gpu", "infer"],
                                       "started_at": now, "last_seen": now, "stopped": not alive,
                                       "status": {"model": {"loaded": True}}})


@pytest.fixture
def workers(settings, redis_url, monkeypatch):  # noqa: F811
    """`answers` lists, per send, the worker that claims it and whether it answers."""
    settings.KILN = replace(settings.KILN, redis_url=redis_url)
    monkeypatch.setattr(sync_client, "_clients", {})
    monkeypatch.setattr(transport, "LIVENESS_POLL_SECONDS", 1.0)
    _worker("gpu-b", alive=True)
    sent = []

    class Workers:
        answers: list[tuple[str, bool]] = []

    def send(request_id, body):
        worker_id, answers = Workers.answers[len(sent)]
        sent.append(request_id)
        emitter = WorkerEmitter(request_id)
        emitter.claim(worker_id)
        if answers:
            emitter.emit({"type": "done", "response": dict(RESPONSE, id=f"from-{worker_id}")})

    monkeypatch.setattr(tasks.run_chat_completion, "send", send)
    Workers.sent = sent
    return Workers


def test_a_request_whose_worker_died_is_sent_again_to_the_one_that_replaced_it(workers, redis_url):  # noqa: F811
    import redis

    _worker("gpu-a", alive=False)  # took the request, then was killed
    workers.answers = [("gpu-a", False), ("gpu-b", True)]
    started = time.monotonic()
    response = sync_client.chat_completion_sync(dict(BODY), timeout=120)
    assert response["id"] == "from-gpu-b"
    assert len(workers.sent) == 2 and time.monotonic() - started < 30
    # neither request leaves its event list or its claim behind
    client = redis.Redis.from_url(redis_url)
    assert not any(client.exists(events_key(r), claim_key(r)) for r in workers.sent)


def test_a_second_lost_worker_is_a_503_at_once_not_a_timeout(workers):
    _worker("gpu-a", alive=False)
    _worker("gpu-c", alive=False)
    workers.answers = [("gpu-a", False), ("gpu-c", False)]
    started = time.monotonic()
    with pytest.raises(KilnError) as caught:
        sync_client.chat_completion_sync(dict(BODY), timeout=120)
    assert (caught.value.code, caught.value.status) == ("inference_worker_lost", 503)
    assert "gpu-c" in caught.value.message and time.monotonic() - started < 30


def test_a_live_worker_that_is_slow_to_answer_is_waited_for(workers, redis_url, monkeypatch):  # noqa: F811
    import threading

    import redis

    workers.answers = [("gpu-b", False)]

    def answer_later():
        time.sleep(3.5)  # several liveness polls: the live claimant is not taken for lost
        request_id = workers.sent[0]
        redis.Redis.from_url(redis_url).rpush(events_key(request_id), json.dumps({"type": "done",
                                                                                  "response": RESPONSE}))

    thread = threading.Thread(target=answer_later, daemon=True)
    thread.start()
    assert sync_client.chat_completion_sync(dict(BODY), timeout=120)["id"] == "chatcmpl-1"
    thread.join()
    assert len(workers.sent) == 1


def test_the_http_routes_reader_stops_at_a_dead_claimant_not_at_the_timeout(settings, redis_url, monkeypatch):  # noqa: F811
    # POST /v1/chat/completions reads events with transport.read_events: a request whose worker died
    # answers 503 inference_worker_lost within a poll or two (it used to wait 300 s for a 504).
    import asyncio

    from adapters.serving.transport import WorkerLost, read_events

    settings.KILN = replace(settings.KILN, redis_url=redis_url)
    monkeypatch.setattr(transport, "LIVENESS_POLL_SECONDS", 1.0)
    WorkerEmitter("r-lost").claim("gpu-a")
    checked = []

    async def worker_dead(worker_id):
        checked.append(worker_id)
        return len(checked) >= 2  # alive at the first check, dead at the second

    async def first_event():
        async for event in read_events("r-lost", first_event_timeout=300, idle_timeout=120, worker_dead=worker_dead):
            return event

    started = time.monotonic()
    with pytest.raises(WorkerLost, match="gpu-a"):
        asyncio.run(first_event())
    assert checked == ["gpu-a", "gpu-a"] and time.monotonic() - started < 10


def test_the_route_answers_a_lost_worker_with_503(monkeypatch):
    from adapters.serving import api

    error = api._worker_lost(transport.WorkerLost("worker gpu-a"))
    assert (error.code, error.status) == ("inference_worker_lost", 503) and "gpu-a" in error.message


def test_a_redelivered_request_whose_reader_left_is_not_generated(workers, redis_url, monkeypatch):  # noqa: F811
    """The broker redelivers the message of a worker that died; once its reader was answered (here:
    503 after two lost workers) nobody waits for it, so the worker that gets it drops it instead of
    generating for nobody beside the client's retry. A request whose reader still waits runs."""
    _worker("gpu-a", alive=False)
    _worker("gpu-c", alive=False)
    workers.answers = [("gpu-a", False), ("gpu-c", False)]
    with pytest.raises(KilnError):
        sync_client.chat_completion_sync(dict(BODY), timeout=120)
    handled = []
    monkeypatch.setattr(tasks, "import_module", lambda name: type("Host", (), {
        "handle_chat_completion": staticmethod(lambda body, emit, reader_gone=None: handled.append(body))}))
    for request_id in workers.sent:  # both messages come back to a live worker
        tasks.run_chat_completion.fn(request_id, dict(BODY))
    assert handled == []
    tasks.run_chat_completion.fn("still-waited-for", dict(BODY))
    assert handled == [BODY]
