"""A small HTTP client for the Kiln API used by every client command.

It reads --url (default KILN_URL, else http://127.0.0.1:8420) and KILN_API_TOKEN, and turns the
API's error envelope into CliError so the command prints one line and exits non-zero. Without
KILN_API_TOKEN, a command talking to a loopback server uses the token `./scripts/serve` saved for
this machine's user in KILN_HOME/cli-token (never sent to any other host). A request answered
`model_loading` (the server just started) is retried until the model is ready, for at most
KILN_WAIT_READY_SECONDS (default 300), with one progress line on stderr.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from core.artifacts import HomeLayout

DEFAULT_URL = "http://127.0.0.1:8420"
DEFAULT_WAIT_READY_SECONDS = 300.0
READY_POLL_SECONDS = 2.0


class CliError(Exception):
    def __init__(self, code: str, message: str, hint: str = "", exit_code: int = 1):
        super().__init__(message)
        self.code, self.message, self.hint, self.exit_code = code, message, hint, exit_code

    def line(self) -> str:
        text = f"error: {self.code}: {self.message}"
        return f"{text} (hint: {self.hint})" if self.hint else text


def default_url() -> str:
    return os.environ.get("KILN_URL") or DEFAULT_URL


def _wait_ready_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get("KILN_WAIT_READY_SECONDS", DEFAULT_WAIT_READY_SECONDS)))
    except ValueError:
        return DEFAULT_WAIT_READY_SECONDS


def local_token(url: str) -> str | None:
    """The token saved in KILN_HOME/cli-token, for a server on this machine only."""
    host = (urlsplit(url).hostname or "").lower()
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    home = Path(os.environ.get("KILN_HOME") or Path.home() / ".kiln").expanduser()
    try:
        return HomeLayout(home).cli_token.read_text().strip() or None
    except OSError:
        return None


def raise_for_stream_error(response) -> None:
    """A streamed download's refusal (status >= 400) as a CliError with the server's code, message and hint
    (`http_<status>` and the start of the body when it is not the error envelope); reads the body first."""
    if response.status_code >= 400:
        response.read()
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            raise CliError(f"http_{response.status_code}", response.text[:200]) from None
        raise CliError(error["code"], error["message"], error.get("hint", ""))


class KilnClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url = (url or default_url()).rstrip("/")
        try:
            parsed = httpx.URL(self.url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise CliError("invalid_url", f"the server URL {self.url!r} is not valid: {exc}",
                           "e.g. --url http://127.0.0.1:8420 (or KILN_URL)") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise CliError("invalid_url", f"the server URL {self.url!r} is not an http(s) URL with a host",
                           "e.g. --url http://127.0.0.1:8420 (or KILN_URL)")
        token = token if token is not None else os.environ.get("KILN_API_TOKEN") or local_token(self.url)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._announce_lock = threading.Lock()
        self._announced = False

    def request(self, method: str, path: str, **kwargs):
        """Send one request; while the server answers model_loading, wait (bounded) and send again."""
        deadline = time.monotonic() + _wait_ready_seconds()
        waited = False  # this request waited (concurrent requests share one announcement)
        while True:
            try:
                result = self._send(method, path, **kwargs)
            except CliError as exc:
                if exc.code != "model_loading" or time.monotonic() + READY_POLL_SECONDS > deadline:
                    raise
                waited = True
                with self._announce_lock:
                    if not self._announced:
                        self._announced = True
                        print(f"kiln: waiting for the model to load at {self.url} (up to "
                              f"{_wait_ready_seconds():.0f} s; KILN_WAIT_READY_SECONDS)", file=sys.stderr, flush=True)
                time.sleep(READY_POLL_SECONDS)
                continue
            if waited:
                with self._announce_lock:
                    if self._announced:
                        self._announced = False
                        print("kiln: the model is ready", file=sys.stderr, flush=True)
            return result

    def _send(self, method: str, path: str, **kwargs):
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise CliError("connection_failed", f"cannot reach Kiln at {self.url}: {exc}",
                           "is `kiln serve` running? pass --url or set KILN_URL") from None
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise CliError(error["code"], error["message"], error.get("hint", ""))
            except (ValueError, KeyError, TypeError):
                raise CliError(f"http_{response.status_code}", response.text[:200] or response.reason_phrase) from None
        return response.json() if response.content else None

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs):
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs):
        return self.request("DELETE", path, **kwargs)
