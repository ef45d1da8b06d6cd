"""Live training markup through the real ASGI router: the job page's training section and the GRPO queue.

Same pattern as test_consumers.py: transactional database (services broadcast on commit), a fresh
in-memory channel layer per test, the async scenario run with asgiref's async_to_sync.
"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from core.jobs import services
from kiln_project.asgi import application
from training.services import grpo_submit

pytestmark = pytest.mark.django_db(transaction=True)

GROUP = {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
         "completions": [{"text": "5", "reward": 1.0}, {"text": "6", "reward": 0.0}]}


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    channel_layers.backends.pop("default", None)
    yield
    channel_layers.backends.pop("default", None)


def _session_headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
            (b"origin", b"http://testserver")]


def _submit(user, name: str):
    job, _ = grpo_submit(body={"groups": [GROUP], "config": {"output_name": name}}, user=user)
    return job


def _points(html: str, curve: str) -> int:
    figure = html[html.index(f'id="curve-{curve}"'):]
    figure = figure[:figure.index("</figure>")]
    match = re.search(r'<polyline class="line" points="([^"]*)"', figure)
    return len(match.group(1).split()) if match else 0


def test_job_socket_pushes_the_training_section_with_new_metrics(operator):
    job = _submit(operator, "math-r001")
    job = services.job_claim_next(queue="gpu", worker_id="gpu-worker")
    headers = _session_headers(operator)

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/ui/jobs/{job.uuid}/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        snapshot = await communicator.receive_from(timeout=5)
        assert snapshot.lstrip().startswith('<div id="job-live" hx-swap-oob="true" data-source="live">')
        assert 'id="training-section"' in snapshot and snapshot.count("No points yet") == 3

        metrics = {"loss": 0.6931, "step": 1, "total_steps": 8, "kept_groups": 1, "filtered_groups": 0,
                   "loss_history": [{"step": 1, "loss": 0.6931}],
                   "reward_history": [{"step": 1, "reward_mean": 0.5}],
                   "kl_history": [{"step": 1, "kl_mean": 0.0}]}
        await database_sync_to_async(services.job_report_progress)(
            job=job, progress=1 / 8, message="group 1/8", metrics=metrics)
        first = await communicator.receive_from(timeout=5)
        assert 'id="curve-loss-last">0.6931<' in first and "step 1 / 8" in first
        assert _points(first, "loss") == 1

        metrics = {**metrics, "loss": 0.4242, "step": 2,
                   "loss_history": metrics["loss_history"] + [{"step": 2, "loss": 0.4242}],
                   "reward_history": metrics["reward_history"] + [{"step": 2, "reward_mean": 0.75}]}
        await database_sync_to_async(services.job_report_progress)(
            job=job, progress=2 / 8, message="group 2/8", metrics=metrics)
        second = await communicator.receive_from(timeout=5)
        assert 'id="curve-loss-last">0.4242<' in second and "step 2 / 8" in second
        assert (_points(second, "loss"), _points(second, "reward"), _points(second, "kl")) == (2, 2, 1)
        assert "loss_history" not in second[second.index('id="job-metrics"'):]
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_queue_socket_follows_training_jobs_only(operator):
    running = _submit(operator, "run-1")
    services.job_claim_next(queue="gpu", worker_id="gpu-worker")
    headers = _session_headers(operator)

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/ui/training/queue/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        snapshot = await communicator.receive_from(timeout=5)
        assert snapshot.lstrip().startswith('<div id="training-queue" hx-swap-oob="true" data-source="live">')
        assert f"queue-row-{running.uuid}" in snapshot and "Nothing is waiting." in snapshot

        queued = await database_sync_to_async(_submit)(operator, "wait-1")
        update = await communicator.receive_from(timeout=5)
        waiting = update[update.index('id="queue-queued"'):]
        assert f"queue-row-{queued.uuid}" in waiting and "#1" in waiting

        # Jobs of other kinds do not touch the training queue.
        await database_sync_to_async(services.job_submit)(kind="test.control_steps", payload={}, user=operator)
        assert await communicator.receive_nothing(timeout=0.3)

        await database_sync_to_async(services.job_cancel)(job=queued, user=operator)
        cancelled = await communicator.receive_from(timeout=5)
        finished = cancelled[cancelled.index('id="queue-finished"'):]
        assert f"queue-row-{queued.uuid}" in finished and "Nothing is waiting." in cancelled
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_queue_socket_refuses_anonymous_users(operator):
    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/ui/training/queue/",
                                             headers=[(b"origin", b"http://testserver")])
        connected, _ = await communicator.connect()
        assert not connected
        await communicator.disconnect()

    async_to_sync(scenario)()
