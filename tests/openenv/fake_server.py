"""Fake OpenEnv servers for the client tests: a `websockets` server in a background thread.

Plain GET routes (/health, /metadata, /schema, /list_environments, /openapi.json) are answered
from `process_request`; `/ws` runs a handler coroutine. `CounterEnv` speaks the protocol exactly
as the frames captured from openenv 0.10.0 in spec/openenv-protocol.md §4a show (compact JSON,
metadata inside the observation and copied to the top level, no reply to close, close code 1000,
CAPACITY_REACHED sent unprompted after the handshake and then close). Hostile handlers are
plain coroutines given to `FakeServer(ws_handler=...)`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import uuid

from websockets.asyncio.server import serve

COUNTER_ACTION_SCHEMA = {
    "additionalProperties": False,
    "properties": {
        "metadata": {"additionalProperties": True, "description": "Additional metadata for the action",
                     "title": "Metadata", "type": "object"},
        "delta": {"description": "Amount to add to the counter", "maximum": 3, "minimum": -3,
                  "title": "Delta", "type": "integer"},
    },
    "required": ["delta"], "title": "CounterAction", "type": "object",
}
OBSERVATION_SCHEMA = {
    "properties": {
        "done": {"default": False, "title": "Done", "type": "boolean"},
        "reward": {"anyOf": [{"type": "boolean"}, {"type": "integer"}, {"type": "number"}, {"type": "null"}],
                   "default": None, "title": "Reward"},
        "metadata": {"additionalProperties": True, "title": "Metadata", "type": "object"},
        "value": {"type": "integer"}, "target": {"type": "integer"}, "steps_left": {"type": "integer"},
        "message": {"type": "string"},
    },
    "title": "CounterObservation", "type": "object",
}
STATE_SCHEMA = {"additionalProperties": True, "properties": {"episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                                             "step_count": {"type": "integer"}},
                "title": "State", "type": "object"}


def counter_documents() -> dict[str, object]:
    """Fresh copies of the counter server's five documents (tests mutate them)."""
    return copy.deepcopy({
        "/health": {"status": "healthy"},
        "/metadata": {"name": "counter", "description": "Bring an integer counter to a target value.",
                      "readme_content": None, "version": "0.1.0", "author": None, "documentation_url": None},
        "/schema": {"action": COUNTER_ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA,
                    "reset_observation": OBSERVATION_SCHEMA},
        "/list_environments": ["counter"],
        "/openapi.json": {"openapi": "3.1.0", "info": {"title": "OpenEnv Environment HTTP API", "version": "1.0.0"},
                          "paths": {}, "components": {}, "tags": []},
    })


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))


class CounterEnv:
    """The counter environment of openenv-protocol.md §4a (one instance per socket)."""

    def __init__(self):
        self.episode_id = None
        self.step_count = 0
        self.value = 0
        self.target = 0
        self.max_steps = 10
        self.total_reward = 0.0
        self.started = False
        self.over = False

    def _observation(self, message, reward, done):
        meta = {"episode_id": self.episode_id, "step": self.step_count}
        obs = {"metadata": meta, "value": self.value, "target": self.target,
               "steps_left": self.max_steps - self.step_count, "message": message}
        return {"type": "observation", "data": {"observation": obs, "reward": reward, "done": done, "metadata": meta}}

    def reset(self, data):
        seed = data.get("seed")
        self.episode_id = data.get("episode_id") or str(uuid.UUID(int=(seed or 0) + 1))
        self.target = data.get("target", ((seed or 0) % 13) - 6)
        self.max_steps = data.get("max_steps", 10)
        self.step_count, self.value, self.total_reward = 0, 0, 0.0
        self.started, self.over = True, False
        return self._observation("reset: move the counter to the target", None, False)

    def step(self, data):
        if not self.started:
            return error("call reset before step", "EXECUTION_ERROR")
        if self.over:
            return error("episode is over; send reset", "EXECUTION_ERROR")
        delta = data.get("delta")
        extra = sorted(set(data) - {"delta", "metadata"})
        if extra:
            return {"type": "error", "data": {"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": [
                {"type": "extra_forbidden", "loc": [extra[0]], "msg": "Extra inputs are not permitted"}]}}
        if not isinstance(delta, int) or isinstance(delta, bool) or not -3 <= delta <= 3:
            return {"type": "error", "data": {"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": [
                {"type": "less_than_equal", "loc": ["delta"], "msg": "Input should be less than or equal to 3",
                 "input": delta, "ctx": {"le": 3}}]}}
        before = abs(self.target - self.value)
        self.value += delta
        self.step_count += 1
        distance = abs(self.target - self.value)
        reached = distance == 0
        reward = round((before - distance) - 0.1 + (10 if reached else 0), 6)
        self.total_reward = round(self.total_reward + reward, 6)
        done = reached or self.step_count >= self.max_steps
        self.over = done
        message = "target reached" if reached else f"distance {distance}"
        return self._observation(message, reward, done)

    def state(self):
        return {"type": "state", "data": {"episode_id": self.episode_id, "step_count": self.step_count,
                                          "value": self.value, "target": self.target, "max_steps": self.max_steps,
                                          "total_reward": self.total_reward}}


def error(message, code, **extra):
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


class FakeServer:
    """A websockets server on 127.0.0.1 (free port) in its own thread and event loop."""

    def __init__(self, *, ws_handler=None, documents=None, max_sessions: int | None = None,
                 health_status: int = 200, upgrade_status: int | None = None, env_factory=CounterEnv):
        self.documents = counter_documents() if documents is None else documents
        self.health_status = health_status
        self.upgrade_status = upgrade_status
        self.max_sessions = max_sessions
        self.env_factory = env_factory
        self.ws_handler = ws_handler or self.counter_handler
        self.active = 0
        self.received: list = []        # every client frame, in order, across sessions
        self.request_headers: list = []  # (path, Authorization header or None)
        self.sessions = 0
        self.refused = 0
        self.pongs = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = None

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> FakeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self):
        self._server = await serve(self._handle, "127.0.0.1", 0, process_request=self._process_request,
                                   max_size=16 * 1024 * 1024, ping_interval=None)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self):
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settle(self, timeout: float = 10.0) -> FakeServer:
        """Wait until every socket handler has finished (so `received` is complete)."""
        import time

        deadline = time.monotonic() + timeout
        while self.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.active == 0, "a fake-server handler is still running"
        return self

    def run(self, coro, timeout=10):
        """Run a coroutine on the server's loop (e.g. to change its behaviour between steps)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- HTTP ----------------------------------------------------------------------------------

    def _process_request(self, connection, request):
        self.request_headers.append((request.path, request.headers.get("Authorization")))
        if request.path == "/ws":
            return self._json(connection, self.upgrade_status, {"detail": "no"}) if self.upgrade_status else None
        if request.path == "/health" and self.health_status != 200:
            return self._json(connection, self.health_status, {"status": "unhealthy"})
        if request.path in self.documents:
            return self._json(connection, 200, self.documents[request.path])
        return self._json(connection, 404, {"detail": "Not Found"})

    @staticmethod
    def _json(connection, status, value):
        response = connection.respond(status, value if isinstance(value, str) else json.dumps(value))
        del response.headers["Content-Type"]
        response.headers["Content-Type"] = "application/json"
        return response

    # --- WebSocket -----------------------------------------------------------------------------

    async def _handle(self, ws):
        if self.max_sessions is not None and self.active >= self.max_sessions:
            self.refused += 1
            await ws.send(dumps(error(
                f"Server at capacity: {self.active}/{self.max_sessions} sessions active. Cannot accept new connections.",
                "CAPACITY_REACHED", active_sessions=self.active, max_sessions=self.max_sessions)))
            await ws.close(1000)
            return
        self.active += 1
        self.sessions += 1
        try:
            await self.ws_handler(self, ws)
        finally:
            self.active -= 1

    async def recv(self, ws):
        """The next client frame, parsed (None when the client closed)."""
        try:
            text = await ws.recv()
        except Exception:
            return None
        try:
            frame = json.loads(text)
        except (TypeError, ValueError):
            frame = {"unparsed": text}
        self.received.append(frame)
        return frame

    @staticmethod
    async def counter_handler(server: FakeServer, ws):
        env = server.env_factory()
        while True:
            frame = await server.recv(ws)
            if frame is None:
                return
            kind = frame.get("type")
            if kind == "reset":
                reply = env.reset(frame.get("data") or {})
            elif kind == "step":
                reply = env.step(frame.get("data") or {})
            elif kind == "state":
                reply = env.state()
            elif kind == "close":
                await ws.close(1000)
                return
            else:
                reply = error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
            await ws.send(dumps(reply))
