"""A stalled Redis (SIGSTOP) holds up neither a running job's steps nor a submission (real redis-server).

QA: with the private Redis stopped, each GRPO step took 20 s (every progress event's live-page
broadcast waited out the channel layer's socket timeout) and POST /v1/train/grpo answered only when
Redis came back (the queue's wake-up waited on it). Broadcasts now get a second and pause after a
failure; wake-ups go from a sender thread per queue, every one of them sent."""

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

    async def recorded(*args):
        calls.append(args)

    monkeypatch.setattr(layer, "group_send", recorded)
    broadcast.broadcast_job_changed(job_id="j1", event="progress")
    assert calls == []  # within the pause no progress is tried, so a job's next step is not held up
    broadcast.broadcast_job_changed(job_id="j1", event="completed")
    assert len(calls) == 2  # a job's end is always tried (the page waits for it)


def _until(condition) -> bool:
    for _ in range(200):
        if condition():
            return True
        threading.Event().wait(0.05)
    return False


def test_a_wake_up_does_not_hold_up_the_submission_and_none_is_lost(monkeypatch):
    """Each control job runs on its own message, so every wake-up is sent (one sender thread per queue,
    not one thread per wake-up stuck on the same Redis); a caller waits for its own at most
    WAKE_WAIT_SECONDS (a short-lived process that submits and exits sees it sent when Redis answers)."""
    release, sends = threading.Event(), []

    class StalledActor:
        def send(self):
            sends.append(threading.current_thread().name)
            release.wait(30)  # the broker's client on a stopped Redis

    monkeypatch.setitem(tasks.WAKE_ACTORS, "control", StalledActor())
    monkeypatch.setattr(dispatch, "WAKE_WAIT_SECONDS", 0.05)
    before = dispatch._sent.get("control", 0)
    for _ in range(3):
        dispatch.wake_queue("control")  # each gives up waiting after WAKE_WAIT_SECONDS
    assert sends == ["kiln-wake-control"]  # one thread, stuck on the first; two wait behind it
    assert dispatch._requested["control"] - dispatch._sent.get("control", 0) == 3
    release.set()
    assert _until(lambda: dispatch._sent.get("control", 0) == before + 3 and "control" not in dispatch._senders)
    assert sends == ["kiln-wake-control"] * 3  # none merged away

    class Answering:
        def send(self):
            sends.append("answered")

    monkeypatch.setitem(tasks.WAKE_ACTORS, "control", Answering())
    monkeypatch.setattr(dispatch, "WAKE_WAIT_SECONDS", 30)
    dispatch.wake_queue("control")  # a Redis that answers: sent before the call returns
    assert sends[-1] == "answered"
