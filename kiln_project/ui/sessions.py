"""Logging out closes the live sockets that the session opened.

A consumer checks the user once, at the handshake; afterwards it only pushes. So every consumer
also joins its session's channel-layer group (`session_group`), and the `user_logged_out` signal
(the dashboard's Log out, the admin's, any `django.contrib.auth.logout`) sends that group
{"type": "session.ended"}: each socket leaves its groups and closes with SESSION_CLOSE_CODE. The
browser's reconnect then meets a session that no longer exists and is refused at the handshake.
Other sessions of the same user (another browser) stay open: only this session ended.
Web-facing: never imports torch, transformers, peft or gpu_runtime.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync

log = logging.getLogger(__name__)

SESSION_CLOSE_CODE = 4401  # an application close code: "the session ended; log in again"


def session_group(session_key: str) -> str:
    return f"session.{session_key}"


def close_session_sockets(*, session_key: str | None) -> None:
    """Tell every socket of this session to close. Never fails the logout that calls it."""
    if not session_key:
        return
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(session_group(session_key), {"type": "session.ended"})
    except Exception as exc:  # noqa: BLE001 - Redis down: the logout still happens
        log.warning("could not close the live sockets of a session that logged out: %s", exc)


def on_user_logged_out(sender, request=None, user=None, **kwargs) -> None:
    """The user_logged_out receiver: Django sends it before it flushes the session, so the key is known."""
    session = getattr(request, "session", None)
    close_session_sockets(session_key=getattr(session, "session_key", None))
