"""Lock-step OpenEnv WebSocket sessions over `websockets` (reference-spec §4.3-4.4, openenv-protocol.md §4).

Pure module: no Django, no torch. One request, one application reply, in order; there are no
request ids, so anything that breaks the pairing poisons the session for good, with a typed
error: a timeout, a socket close, a binary or oversized (> 512 KiB) frame, malformed JSON, an
unknown frame type, an unsolicited frame, a reply of the wrong type, or a frame that reflects
our bearer token. A poisoned session is closed; nothing is ever resent.

Error frames: a recoverable code (INVALID_JSON, UNKNOWN_TYPE, VALIDATION_ERROR, EXECUTION_ERROR)
in reply to `step` comes back as an `ErrorFrame` (same-socket feedback; the caller counts them);
a terminal code (CAPACITY_REACHED, FACTORY_ERROR, SESSION_ERROR) ends the session and raises
(`OpenEnvCapacityReached` for capacity). A server refuses a connection at capacity by sending
that error frame unprompted and closing; it surfaces from the next request. `open_episode`
retries capacity on fresh sessions with bounded back-off (250 ms x retries, capped at 2 s and at
the remaining `capacity_wait_seconds`), counting the retries apart.

Ping/Pong is answered by the library's reader at any time; `keep_alive_while` also sends
read-only `state` exchanges while the model thinks (some servers renew leases only on data).

Cancellation: a close that is cancelled (or fails) aborts the TCP connection at once instead of
leaving the closing handshake to a loop that may be about to end, so no socket outlives an
aborted collection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from openenv.client.credentials import Credential
from openenv.client.discovery import check_health
from openenv.client.errors import (
    TERMINAL_WIRE_CODES,
    OpenEnvBinaryFrame,
    OpenEnvCapacityExhausted,
    OpenEnvCapacityReached,
    OpenEnvCredentialReflected,
    OpenEnvError,
    OpenEnvFrameTooLarge,
    OpenEnvOutgoingTooLarge,
    OpenEnvProtocolError,
    OpenEnvRedirectRefused,
    OpenEnvResetDone,
    OpenEnvSessionClosed,
    OpenEnvSessionPoisoned,
    OpenEnvSocketClosed,
    OpenEnvTimeout,
    OpenEnvUnavailable,
    OpenEnvUnexpectedResponse,
    OpenEnvUnsolicitedFrame,
    OpenEnvUpgradeFailed,
)
from openenv.client.frames import ErrorFrame, Observation, parse_server_frame, protocol_error
from openenv.client.http import (
    CONNECT_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    new_client,
    status_error,
    transport_error,
)
from openenv.client.urls import Endpoint, as_endpoint

MAX_SERVER_FRAME_BYTES = 512 * 1024
MAX_CLIENT_FRAME_BYTES = 16 * 1024 * 1024
KEEPALIVE_INTERVAL_S = 10.0
CLOSE_TIMEOUT_S = 5.0
CAPACITY_BACKOFF_STEP_S = 0.25
CAPACITY_BACKOFF_CAP_S = 2.0


class _NoRedirects(connect):
    def process_redirect(self, exc: Exception) -> Exception:
        return exc


class Session:
    """One lock-step episode socket. Use `open_session` (or `open_episode`) to make one."""

    def __init__(self, ws: ClientConnection, endpoint: Endpoint, *, credential: Credential | None,
                 request_timeout: float):
        self.endpoint = endpoint
        self._ws = ws
        self._credential = credential
        self._timeout = request_timeout
        self._pending: asyncio.Future | None = None
        self._poison: OpenEnvSessionPoisoned | None = None
        self._ended_by: ErrorFrame | None = None  # a terminal error frame: the server ends the session
        self._closed = False
        self._dead = asyncio.Event()
        self.exchanges = 0
        self.keepalive_exchanges = 0
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    # --- state -----------------------------------------------------------------------------

    @property
    def poisoned(self) -> OpenEnvSessionPoisoned | None:
        return self._poison

    @property
    def usable(self) -> bool:
        return self._poison is None and self._ended_by is None and not self._closed

    def _ensure_usable(self) -> None:
        if self._poison is not None:
            raise self._poison
        if self._ended_by is not None:
            raise protocol_error(self._ended_by)
        if self._closed:
            raise OpenEnvSessionClosed("the session is closed")

    def _fail(self, error: OpenEnvSessionPoisoned) -> OpenEnvSessionPoisoned:
        if self._poison is None and not self._closed:
            self._poison = error
        self._dead.set()
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(self._poison or error)
        return self._poison or error

    # --- the reader ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            async for message in self._ws:
                self._on_message(message)
                if self._poison is not None or self._closed:
                    break
        except ConnectionClosed as exc:
            self._on_close(exc)
        except Exception as exc:  # the transport failed in a way websockets did not classify
            self._fail(OpenEnvSocketClosed(f"the socket failed: {type(exc).__name__}"))
        else:
            self._on_close(None)
        if self._poison is not None:
            await self._close_socket()

    def _on_message(self, message: str | bytes) -> None:
        if self._closed:
            return
        if isinstance(message, (bytes, bytearray, memoryview)):
            self._fail(OpenEnvBinaryFrame("the server sent a binary frame; OpenEnv frames are JSON text"))
            return
        if len(message) > MAX_SERVER_FRAME_BYTES:
            self._fail(OpenEnvFrameTooLarge(f"a server frame exceeded {MAX_SERVER_FRAME_BYTES} bytes"))
            return
        if self._credential is not None and self._credential.reflected_in(message):
            self._fail(OpenEnvCredentialReflected("a server frame echoed the bearer token"))
            return
        try:
            kind, value = parse_server_frame(message)
        except OpenEnvSessionPoisoned as exc:
            self._fail(exc)
            return
        terminal = kind == "error" and value.code in TERMINAL_WIRE_CODES
        if terminal:
            self._ended_by = value
            self._dead.set()
        pending = self._pending
        if pending is None or pending.done():
            if not terminal:  # an unprompted terminal error is how a server refuses or ends a session
                self._fail(OpenEnvUnsolicitedFrame(f"the server sent an unsolicited {kind} frame"))
            return
        pending.set_result((kind, value))

    def _on_close(self, exc: ConnectionClosed | None) -> None:
        if self._closed:
            return
        self._dead.set()
        if exc is not None and exc.sent is not None and exc.sent.code == 1009:
            self._fail(OpenEnvFrameTooLarge(f"a server frame exceeded {MAX_SERVER_FRAME_BYTES} bytes"))
        elif self._ended_by is not None:
            if self._pending is not None and not self._pending.done():
                self._pending.set_exception(protocol_error(self._ended_by))
        elif exc is not None and exc.rcvd is None and exc.sent is not None and exc.sent.code == 1011:
            # we closed it: the server stopped answering our keepalive pings (stalled, SIGSTOP, a
            # dead network path). A timeout, not a protocol fault of the server.
            self._fail(OpenEnvTimeout(f"the environment stopped answering: {exc.sent.reason or 'keepalive ping timeout'}"))
        else:
            # the iterator ends without an exception on a normal close (1000/1001): the frame is on the socket
            protocol = getattr(self._ws, "protocol", None)
            received = exc.rcvd if exc is not None else getattr(protocol, "close_rcvd", None)
            code = received.code if received is not None else None
            how = "the connection dropped without a close frame" if code is None else \
                f"the server closed the socket (close code {code})"
            self._fail(OpenEnvSocketClosed(how, close_code=code))

    def _abort(self) -> None:
        """Drop the TCP connection now, without the closing handshake, and stop the reader.

        Used when a close is cancelled or fails: a cancelled candidate must leave no socket open
        (once the caller's event loop ends, a socket still in the closing handshake would stay
        open until the server gives up on it).
        """
        transport = getattr(self._ws, "transport", None)
        if transport is not None:
            transport.abort()
        if self._reader is not asyncio.current_task() and not self._reader.done():
            self._reader.cancel()

    async def _close_socket(self) -> None:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._ws.close()
        except asyncio.CancelledError:
            self._abort()
            raise
        except Exception:
            self._abort()

    async def _shutdown(self) -> None:
        try:
            await self._close_socket()
            if self._reader is not asyncio.current_task() and not self._reader.done():
                self._reader.cancel()
                # asyncio.wait never raises the reader's own CancelledError, only ours if we are cancelled
                await asyncio.wait({self._reader}, timeout=CLOSE_TIMEOUT_S)
        except asyncio.CancelledError:
            self._abort()
            raise

    # --- exchanges -------------------------------------------------------------------------

    async def _exchange(self, frame: dict, expect: str, what: str, *, feedback: bool = False):
        self._ensure_usable()
        text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        if len(text.encode("utf-8")) > MAX_CLIENT_FRAME_BYTES:
            raise OpenEnvOutgoingTooLarge(f"the {what} frame is larger than {MAX_CLIENT_FRAME_BYTES} bytes")
        pending = asyncio.get_running_loop().create_future()
        self._pending = pending
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    await self._ws.send(text)
                except ConnectionClosed:
                    # The server closed first. Its last frames (a capacity refusal) may still be queued.
                    await asyncio.wait({self._reader}, timeout=1.0)
                    self._ensure_usable()
                    raise self._fail(OpenEnvSocketClosed(f"the socket closed before {what} was sent")) from None
                kind, value = await pending
        except TimeoutError:
            error = self._fail(OpenEnvTimeout(f"{what} got no reply within {self._timeout:g} s"))
            await self._shutdown()
            raise error from None
        except OpenEnvSessionPoisoned:
            await self._shutdown()
            raise
        except OpenEnvProtocolError:
            self._closed = True
            await self._shutdown()
            raise
        finally:
            self._pending = None
        self.exchanges += 1
        if kind == "error":
            if value.code in TERMINAL_WIRE_CODES:
                self._closed = True
                await self._shutdown()
                raise protocol_error(value)
            if feedback:
                return value
            raise OpenEnvProtocolError(value)
        if kind != expect:
            error = self._fail(OpenEnvUnexpectedResponse(f"{what} was answered with a {kind} frame"))
            await self._shutdown()
            raise error
        return value

    async def reset(self, payload: dict | None = None) -> Observation:
        frame: dict[str, Any] = {"type": "reset"}
        if payload is not None:
            frame["data"] = payload
        return await self._exchange(frame, "observation", "reset")

    async def step(self, action: dict) -> Observation | ErrorFrame:
        """Send one action; a recoverable error frame is returned (the socket stays usable)."""
        if not isinstance(action, dict):
            raise TypeError("an OpenEnv action must be a JSON object")
        return await self._exchange({"type": "step", "data": action}, "observation", "step", feedback=True)

    async def state(self) -> Any:
        return await self._exchange({"type": "state"}, "state", "state")

    async def close(self) -> None:
        """Best effort: send `{"type":"close"}` (no reply is awaited) and close the socket."""
        send = self.usable
        self._closed = True
        self._dead.set()
        try:
            if send:
                try:
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await self._ws.send('{"type":"close"}')
                except Exception:
                    pass
            await self._shutdown()
        except asyncio.CancelledError:  # cancelled mid-close (a collection aborting): drop the socket now
            self._abort()
            raise

    async def keep_alive_while(self, work: Awaitable, *, interval_s: float = KEEPALIVE_INTERVAL_S):
        """Await `work` (the model's generation), exchanging read-only `state` every `interval_s`.

        If the session dies meanwhile, `work` is cancelled and the session's error is raised.
        """
        try:
            self._ensure_usable()
        except BaseException:
            if asyncio.iscoroutine(work):
                work.close()
            raise
        task = asyncio.ensure_future(work)
        dead = asyncio.ensure_future(self._dead.wait())
        try:
            while True:
                done, _ = await asyncio.wait({task, dead}, timeout=interval_s,
                                             return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    return task.result()
                self._ensure_usable()
                await self.state()
                self.keepalive_exchanges += 1
        finally:
            dead.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # never swallows our own cancellation
            if not task.cancelled():
                task.exception()  # retrieved: the outcome that matters is the one being raised

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _upgrade_error(exc: Exception, url: str, credential: Credential | None = None) -> OpenEnvError:
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status in (401, 403):  # as on HTTP: the credential is what to fix (openenv.client.http.status_error)
            return status_error(status, "the WebSocket upgrade", url, credential=credential)
        if 300 <= status < 400:
            return OpenEnvRedirectRefused(f"the WebSocket upgrade answered a redirect (HTTP {status})",
                                          http_status=status, endpoint=url)
        if status >= 500 or status in (408, 425, 429):
            return OpenEnvUnavailable(f"the WebSocket upgrade answered HTTP {status}", http_status=status,
                                      endpoint=url)
        return OpenEnvUpgradeFailed(f"the WebSocket upgrade answered HTTP {status}", http_status=status,
                                    endpoint=url)
    if isinstance(exc, TimeoutError):
        return OpenEnvUnavailable("the WebSocket upgrade timed out", endpoint=url)
    if isinstance(exc, InvalidHandshake):
        return OpenEnvUpgradeFailed(f"the WebSocket upgrade failed: {type(exc).__name__}", endpoint=url)
    return transport_error("the WebSocket connection", exc, url)


async def open_session(url: Endpoint | str, *, credential: Credential | None = None,
                       request_timeout: float = REQUEST_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
                       ping_interval: float | None = 20.0) -> Session:
    """`GET /health` (exactly 200), then the WebSocket upgrade on `/ws` (the credential on both)."""
    endpoint = as_endpoint(url)
    async with new_client(request_timeout=request_timeout, connect_timeout=connect_timeout) as http:
        await check_health(endpoint, credential=credential, http=http)
    headers = credential.headers_for(endpoint) if credential is not None else None
    try:
        ws = await _NoRedirects(
            endpoint.websocket_url, additional_headers=headers, open_timeout=connect_timeout,
            max_size=MAX_SERVER_FRAME_BYTES, proxy=None, user_agent_header="kiln-openenv/1",
            ping_interval=ping_interval, ping_timeout=ping_interval, close_timeout=CLOSE_TIMEOUT_S,
        )
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise _upgrade_error(exc, endpoint.websocket_url, credential) from None
    return Session(ws, endpoint, credential=credential, request_timeout=request_timeout)


@dataclass
class EpisodeStart:
    session: Session
    observation: Observation
    capacity_retries: int


async def open_episode(url: Endpoint | str, reset_payload: dict, *, credential: Credential | None = None,
                       capacity_wait_seconds: float = 300.0, request_timeout: float = REQUEST_TIMEOUT_S,
                       connect_timeout: float = CONNECT_TIMEOUT_S,
                       sleep: Callable[[float], Awaitable] = asyncio.sleep,
                       clock: Callable[[], float] = time.monotonic) -> EpisodeStart:
    """A fresh session and its reset observation, retrying CAPACITY_REACHED on new sessions.

    Retries never become observations; after `capacity_wait_seconds` it raises
    OpenEnvCapacityExhausted. A reset answered with done=true raises OpenEnvResetDone.
    """
    deadline = clock() + capacity_wait_seconds
    retries = 0
    while True:
        session = await open_session(url, credential=credential, request_timeout=request_timeout,
                                     connect_timeout=connect_timeout)
        try:
            observation = await session.reset(reset_payload)
        except OpenEnvCapacityReached as exc:
            await session.close()
            retries += 1
            remaining = deadline - clock()
            if remaining <= 0:
                raise OpenEnvCapacityExhausted(
                    f"the environment stayed at capacity for {capacity_wait_seconds:g} s ({retries} retries)",
                    retries=retries) from exc
            await sleep(min(CAPACITY_BACKOFF_STEP_S * retries, CAPACITY_BACKOFF_CAP_S, remaining))
            if clock() >= deadline:
                raise OpenEnvCapacityExhausted(
                    f"the environment stayed at capacity for {capacity_wait_seconds:g} s ({retries} retries)",
                    retries=retries) from exc
            continue
        except BaseException:
            await session.close()
            raise
        if observation.done:
            await session.close()
            raise OpenEnvResetDone("the reset observation says done=true")
        return EpisodeStart(session, observation, retries)
