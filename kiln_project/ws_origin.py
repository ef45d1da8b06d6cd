"""The WebSocket origin check: a page on another site must not open the dashboard's live sockets
with the user's session cookie (cross-site WebSocket hijacking).

Channels' AllowedHostsOriginValidator follows ALLOWED_HOSTS, which is "*" (a proxy in front decides
exposure), so it let every origin through. This accepts a browser's Origin only when its host is
the host the request was sent to, a loopback name, the bind address, or one named in
`[server] allowed_hosts` / KILN_ALLOWED_HOSTS; the port does not matter. A client that sends no
Origin is not a browser and is let through to the consumer's own authentication.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier

LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def _host_name(value: str) -> str:
    return (urlsplit(f"//{value}").hostname or "").lower()


class SameSiteOriginValidator:
    def __init__(self, application, trusted_hosts):
        self.application = application
        self.trusted = LOOPBACK | {h.lower().strip("[]") for h in trusted_hosts if h}

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin")
        if origin is not None:
            origin_host = (urlsplit(origin.decode("latin-1")).hostname or "").lower()
            allowed = self.trusted | {_host_name(headers.get(b"host", b"").decode("latin-1"))}
            if not origin_host or origin_host not in allowed:
                return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
