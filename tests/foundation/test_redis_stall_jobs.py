"""A stalled Redis (SIGSTOP) holds up neither a running job's steps nor a submission (real redis-server).

QA: with the private Redis stopped, each GRPO step took 20 s (every progress event's live-page
broadcast waited out the channel layer's socket timeout) and POST /v1/train/grpo answered only when
Redis came back (the queue's wake-up waited on it). Broadcasts now get a second and pause after a
failure; wake-ups go from a thread of their own, one per queue in flight."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from channels.layers import channel_layers

from core.jobs import broadcast, dispatch, tasks
from tests.foundation.test_redis_stall import RedisProcess

pytestmark = pytest.mark.django_db


@pytest.fixture
def stopped_redis(tmp_path, settings):
    server = RedisProcess(tmp_path).start()
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [{"address": server.url, "socket_timeout": 60}],
                                                      "prefix": "kiln:test"}}}
    channel_layers.backends.clear()
    os.kill(server.process.pid, signal.SIGSTOP)
    yield server
    server.stop()
    channel_layers.backends.clear()


def test_a_broadcast_to_a_stalled_redis_gives_up_and_the_next_ones_are_not_tried(stopped_redis, monkeypatch):
    monkeypatch.setattr(broadcast, "BROADCAST_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(broadcast, "_paused_until", 0.0)
    finished = threading.Event()

    def first():
        broadcast.broadcast_job_changed(job_id="j1", event="progress")
        finished.set()

    threading.Thread(target=first, daemon=True).start()
    assert finished.wait(30), "the broadcast waited on the stalled Redis (its socket timeout is 60 s)"
    assert broadcast._paused_until > 0  # paused after the failure

    layer = channel_layers["default"]
    calls = []
    monkeypatch.setattr(layer, "group_send", lambda *args: calls.append(args))
    broadcast.broadcast_job_changed(job_id="j1", event="progress")
    assert calls == []  # within the pause nothing is tried, so a job's next step is not held up


def test_a_wake_up_does_not_hold_up_the_submission_and_one_per_queue_is_in_flight(monkeypatch):
    release, sends = threading.Event(), []

    class StalledActor:
        def send(self):
            sends.append(1)
            release.wait(30)  # the broker's client on a stopped Redis

    monkeypatch.setitem(tasks.WAKE_ACTORS, "gpu", StalledActor())
    dispatch.wake_queue("gpu")  # returns at once
    dispatch.wake_queue("gpu")  # one is in flight: not a second thread stuck on the same Redis
    for _ in range(100):
        if sends:
            break
        threading.Event().wait(0.05)
    assert sends == [1] and "gpu" in dispatch._in_flight
    release.set()
    for _ in range(100):
        if "gpu" not in dispatch._in_flight:
            break
        threading.Event().wait(0.05)
    dispatch.wake_queue("gpu")  # the first one went: the next is sent
    for _ in range(100):
        if len(sends) == 2:
            break
        threading.Event().wait(0.05)
    assert sends == [1, 1]
