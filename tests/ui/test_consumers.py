"""Live consumers through the real ASGI router with session auth and the in-memory channel layer.

Services broadcast on commit, so these tests use transactional databases. pytest-asyncio is not a
dependency: each test runs its async scenario with asgiref's async_to_sync, and database work inside
it goes through database_sync_to_async (which runs on the test's thread and connection).
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from core.jobs import services
from kiln_project.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """A new in-memory layer per test, so no group membership leaks from one test to the next."""
    channel_layers.backends.pop("default", None)
    yield
    channel_layers.backends.pop("default", None)


def _session_headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
            (b"origin", b"http://testserver")]


def _connect(path: str, headers=None) -> WebsocketCommunicator:
    """A socket to the real ASGI app; headers from _session_headers (made before any event loop runs)."""
    return WebsocketCommunicator(application, path, headers=headers or [(b"origin", b"http://testserver")])


def _submit(user, kind: str = "test.steps"):
    return services.job_submit(kind=kind, payload={"steps": 3}, user=user)


def _submit_running(user):
    job = _submit(user)
    claimed = services.job_claim_next(queue=job.queue, worker_id="test-worker")
    assert claimed.id == job.id
    return claimed


def test_anonymous_connections_are_refused(operator):
    job = _submit(operator)

    async def scenario():
        for path in ("/ws/ui/jobs/", f"/ws/ui/jobs/{job.uuid}/"):
            communicator = _connect(path)
            connected, _ = await communicator.connect()
            assert not connected, path
            await communicator.disconnect()

    async_to_sync(scenario)()


def test_jobs_socket_sends_snapshot_then_live_rows(operator):
    job = _submit_running(operator)
    headers = _session_headers(operator)

    async def scenario():
        communicator = _connect("/ws/ui/jobs/", headers)
        connected, _ = await communicator.connect()
        assert connected
        snapshot = await communicator.receive_from(timeout=5)
        assert snapshot.lstrip().startswith('<tbody id="jobs-body" hx-swap-oob="true" data-source="live">')
        assert f'id="job-row-{job.uuid}"' in snapshot
        assert 'badge state-running">running<' in snapshot

        await database_sync_to_async(services.job_report_progress)(job=job, progress=1 / 3, message="step 1/3")
        update = await communicator.receive_from(timeout=5)
        assert update.lstrip().startswith(f'<tr id="job-row-{job.uuid}" class="job state-running" hx-swap-oob="true">')
        assert '<span class="pct">33%</span>' in update
        assert "step 1/3" in update

        # A job the page has not shown yet is prepended to the table body.
        new = await database_sync_to_async(_submit)(operator)
        added = await communicator.receive_from(timeout=5)
        assert added.lstrip().startswith('<tbody hx-swap-oob="afterbegin:#jobs-body">')
        assert f'id="job-row-{new.uuid}"' in added
        assert 'badge state-queued">queued<' in added

        # Once shown, its next change swaps the row in place.
        await database_sync_to_async(services.job_cancel)(job=new, user=operator)
        cancelled = await communicator.receive_from(timeout=5)
        assert cancelled.lstrip().startswith(f'<tr id="job-row-{new.uuid}" class="job state-cancelled" hx-swap-oob="true">')
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_category_socket_ignores_jobs_of_other_categories(operator):
    headers = _session_headers(operator)

    async def scenario():
        communicator = _connect("/ws/ui/jobs/?category=openenv&limit=5", headers)
        connected, _ = await communicator.connect()
        assert connected
        snapshot = await communicator.receive_from(timeout=5)
        assert "No OpenEnv runs yet." in snapshot

        await database_sync_to_async(_submit)(operator, "test.steps")  # a training job
        assert await communicator.receive_nothing(timeout=0.5)
        env_job = await database_sync_to_async(_submit)(operator, "test.control_steps")
        added = await communicator.receive_from(timeout=5)
        assert f'id="job-row-{env_job.uuid}"' in added
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_job_socket_sends_live_detail_and_drops_cancel_form_when_done(operator):
    job = _submit_running(operator)
    other = _submit(operator)
    headers = _session_headers(operator)

    async def scenario():
        communicator = _connect(f"/ws/ui/jobs/{job.uuid}/", headers)
        connected, _ = await communicator.connect()
        assert connected
        snapshot = await communicator.receive_from(timeout=5)
        assert snapshot.lstrip().startswith('<div id="job-live" hx-swap-oob="true" data-source="live">')
        assert '<span class="pct">0%</span>' in snapshot
        assert 'id="job-actions"' not in snapshot  # the cancel form stays while the job runs

        await database_sync_to_async(services.job_report_progress)(
            job=job, progress=1 / 3, message="step 1/3", metrics={"loss": 0.5})
        update = await communicator.receive_from(timeout=5)
        assert '<span class="pct">33%</span>' in update and "step 1/3" in update
        assert "<dt>loss</dt>" in update

        # Changes of other jobs do not reach this page.
        await database_sync_to_async(services.job_cancel)(job=other, user=operator)
        assert await communicator.receive_nothing(timeout=0.3)

        await database_sync_to_async(services.job_mark_cancelled)(job=job)
        final = await communicator.receive_from(timeout=5)
        assert 'badge state-cancelled">cancelled<' in final
        assert '<div id="job-actions" hx-swap-oob="true"></div>' in final
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_job_socket_for_an_unknown_job_is_refused(operator):
    headers = _session_headers(operator)

    async def scenario():
        communicator = _connect("/ws/ui/jobs/22222222-2222-2222-2222-222222222222/", headers)
        connected, _ = await communicator.connect()
        assert not connected
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_a_page_on_another_site_cannot_open_a_live_socket_with_the_users_session(operator):
    client = Client()
    client.force_login(operator)
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())

    async def connect(origin: bytes, host: bytes = b"127.0.0.1:8420"):
        communicator = WebsocketCommunicator(application, "/ws/ui/jobs/",
                                             headers=[cookie, (b"origin", origin), (b"host", host)])
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(connect)(b"http://evil.example") is False
    assert async_to_sync(connect)(b"http://127.0.0.1.evil.example") is False
    assert async_to_sync(connect)(b"http://127.0.0.1:8420") is True  # the dashboard itself
    assert async_to_sync(connect)(b"https://kiln.internal", host=b"kiln.internal") is True  # behind a proxy


def test_a_push_to_a_socket_the_browser_closed_meanwhile_is_dropped_not_raised():
    """daphne raised "Attempt to send on a closed protocol" back into send_snapshot when a job page
    navigated away between a change and its update, and logged a traceback for it."""
    from kiln_project.ui.consumers import JobDetailConsumer

    consumer = JobDetailConsumer()

    def closed(message):  # the sync wrapper the consumer's __call__ installs raises it like this
        raise RuntimeError("Attempt to send on a closed protocol")

    consumer.base_send = closed
    consumer.send(text_data="<div></div>")  # dropped

    def broken(message):
        raise RuntimeError("something else")

    consumer.base_send = broken
    with pytest.raises(RuntimeError, match="something else"):
        consumer.send(text_data="<div></div>")
