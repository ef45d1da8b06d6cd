"""Live sockets end with the session that opened them, and a jobs socket can follow one state.

Through the real ASGI router with session auth and the in-memory channel layer, as test_consumers.py.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from core.jobs import services
from core.jobs.broadcast import broadcast_job_changed
from kiln_project.asgi import application
from kiln_project.ui.sessions import SESSION_CLOSE_CODE

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://testserver")


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    channel_layers.backends.pop("default", None)
    yield
    channel_layers.backends.pop("default", None)


def _logged_in(user) -> tuple[Client, list]:
    client = Client()
    client.force_login(user)
    return client, [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()), ORIGIN]


def _submit(user):
    return services.job_submit(kind="test.steps", payload={"steps": 3}, user=user)


def test_logging_out_closes_every_socket_of_that_session_and_only_that_session(operator):
    job = _submit(operator)
    client, headers = _logged_in(operator)
    _, other_headers = _logged_in(operator)  # the same user in another browser

    async def scenario():
        sockets = [WebsocketCommunicator(application, path, headers=headers)
                   for path in ("/ws/ui/jobs/", f"/ws/ui/jobs/{job.uuid}/", "/ws/ui/training/queue/")]
        other = WebsocketCommunicator(application, "/ws/ui/jobs/", headers=other_headers)
        for socket in (*sockets, other):
            connected, _ = await socket.connect()
            assert connected
            await socket.receive_from(timeout=5)  # the snapshot

        response = await database_sync_to_async(client.post)("/ui/logout/")
        assert response.status_code == 302 and response["Location"] == "/ui/login/"
        for socket in sockets:
            assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": SESSION_CLOSE_CODE}

        # Job changes still reach the other session's socket, and nothing more reaches the closed ones.
        new = await database_sync_to_async(_submit)(operator)
        added = await other.receive_from(timeout=5)
        assert f'id="job-row-{new.uuid}"' in added
        for socket in sockets:
            assert await socket.receive_nothing(timeout=0.3)

        # The browser's reconnect with the ended session is refused at the handshake.
        again = WebsocketCommunicator(application, "/ws/ui/jobs/", headers=headers)
        connected, _ = await again.connect()
        assert not connected
        for socket in (*sockets, other, again):
            await socket.disconnect()

    async_to_sync(scenario)()


def test_a_state_socket_shows_jobs_in_that_state_and_drops_those_that_leave_it(operator):
    first = _submit(operator)
    cancelled = _submit(operator)
    services.job_cancel(job=cancelled, user=operator)
    _, headers = _logged_in(operator)

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/ui/jobs/?state=queued", headers=headers)
        connected, _ = await socket.connect()
        assert connected
        snapshot = await socket.receive_from(timeout=5)
        assert f'id="job-row-{first.uuid}"' in snapshot and f'id="job-row-{cancelled.uuid}"' not in snapshot

        new = await database_sync_to_async(_submit)(operator)
        added = await socket.receive_from(timeout=5)
        assert added.lstrip().startswith('<tbody hx-swap-oob="afterbegin:#jobs-body">')
        assert f'id="job-row-{new.uuid}"' in added

        await database_sync_to_async(services.job_cancel)(job=first, user=operator)
        removed = await socket.receive_from(timeout=5)
        assert removed == f'<tr id="job-row-{first.uuid}" hx-swap-oob="delete"></tr>'
        # A change of a job that is not queued and was never on this table sends nothing.
        await database_sync_to_async(broadcast_job_changed)(job_id=str(cancelled.uuid), event="cancelled")
        assert await socket.receive_nothing(timeout=0.3)
        await socket.disconnect()

        bad = WebsocketCommunicator(application, "/ws/ui/jobs/?state=bogus", headers=headers)
        connected, _ = await bad.connect()
        assert not connected
        await bad.disconnect()

    async_to_sync(scenario)()
