"""The counter environment of counter_env.py behind a bearer token, as a protected deployment is.

Served by openenv==0.10.0 from its own virtual environment (tests/openenv/real_server.py copies this
file next to counter_env.py). Every HTTP request and the WebSocket upgrade must carry
`Authorization: Bearer $KILN_INTEROP_TOKEN`; anything else gets 401 (HTTP) or a refused upgrade
(403), before the environment sees it. Requests seen with and without the token are counted in
the log, so a test can tell that the token was sent where it belongs.
"""

import os
import sys

from counter_env import app as environment_app

TOKEN = os.environ["KILN_INTEROP_TOKEN"].encode()


async def app(scope, receive, send):
    if scope["type"] in ("http", "websocket"):
        authorization = dict(scope.get("headers") or []).get(b"authorization", b"")
        if authorization != b"Bearer " + TOKEN:
            print(f"refused {scope['type']} {scope.get('path')}", file=sys.stderr, flush=True)
            if scope["type"] == "http":
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"detail": "missing or wrong bearer token"}'})
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
    await environment_app(scope, receive, send)
