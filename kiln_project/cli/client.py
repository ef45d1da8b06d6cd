"""A small HTTP client for the Kiln API used by every client command.

It reads --url (default KILN_URL, else http://127.0.0.1:8420) and KILN_API_TOKEN, and turns the
API's error envelope into CliError so the command prints one line and exits non-zero. Without
KILN_API_TOKEN, a command talking to a loopback server uses the token `./scripts/serve` saved for
this machine's user in KILN_HOME/cli-token (never sent to any other host). A request answered
`model_loading` (the server just started) is retried until the model is ready, for at most
KILN_WAIT_READY_SECONDS (default 300), with one progress line on stderr.

Names and ids go into paths through `api_path` (each one percent-encoded as one segment), and every
request's path is checked before it is sent (`check_path`): a "." or ".." segment, a "#", a backslash or
a URL is refused (`invalid_path_segment`), so `kiln jobs cancel ../adapters/x` can never become
DELETE /v1/adapters/x. An answer that is not Kiln's JSON API (a wrong --url) is one
`not_a_kiln_server` line. A body holding NaN or Infinity (not JSON) is `invalid_json_value` and a token
that cannot go into an HTTP header is `invalid_token`, both before anything is sent.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import httpx

from core.artifacts import HomeLayout
from core.contracts.names import is_valid_name

DEFAULT_URL = "http://127.0.0.1:8420"
DEFAULT_WAIT_READY_SECONDS = 300.0
READY_POLL_SECONDS = 2.0


class CliError(Exception):
    def __init__(self, code: str, message: str, hint: str = "", exit_code: int = 1):
        super().__init__(message)
        self.code, self.message, self.hint, self.exit_code = code, message, hint, exit_code
        self.retry_after: float | None = None  # seconds, from a refusal's Retry-After header

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


_DOT_SEGMENTS = (".", "..")


def api_path(base: str, *segments) -> str:
    """`base` (a fixed route such as "/v1/jobs") followed by each segment percent-encoded as ONE path
    segment: a user's name or id can never add a "/" or climb with ".." (`api_path("/v1/jobs", job_id,
    "events")`). An empty, "." or ".." segment is refused: no encoding stops a server or proxy from
    resolving it."""
    parts = [base.rstrip("/")]
    for segment in segments:
        text = str(segment)
        if text in ("", *_DOT_SEGMENTS):
            raise CliError("invalid_path_segment", f"{text!r} cannot be a name or id in a URL path",
                           "give the name or id exactly as `list` shows it")
        parts.append(quote(text, safe=""))
    return "/".join(parts)


def check_path(method: str, path: str) -> None:
    """Refuse to send a request whose path is not a plain server-relative path, or has a "." or ".."
    segment (percent-encoded or not): httpx resolves `/v1/jobs/../adapters/x` to `/v1/adapters/x`, so an
    id spliced into a path unescaped could aim a DELETE at another route. Every request goes through
    this (KilnClient._send and its httpx client), whatever built the path."""
    text = str(path)
    where = text.split("?", 1)[0]
    if not where.startswith("/") or where.startswith("//") or "\\" in where or "#" in text:
        raise CliError("invalid_path_segment", f"refusing to send {method} {text[:200]!r}: not a path on the "
                       "Kiln server", "names and ids must not contain '/', '\\', '#' or a URL")
    for segment in where.split("/"):
        decoded = unquote(segment)
        if decoded in _DOT_SEGMENTS or unquote(decoded) in _DOT_SEGMENTS:
            raise CliError("invalid_path_segment", f"refusing to send {method} {text[:200]!r}: a path segment "
                           f"is {decoded!r}, which would change the route it reaches",
                           "names and ids cannot be '.' or '..' or contain '/'")


_LISTINGS = {"training job": "kiln train status", "eval job": "kiln eval status"}


def job_id_arg(value: str, what: str = "job") -> str:
    """A job id as the server issues it (a UUID), canonical; anything else is `invalid_job_id` before any
    request (the id is also a URL path segment)."""
    try:
        return str(uuid.UUID(str(value).strip()))
    except (ValueError, AttributeError):
        article = "an" if what[:1] in "aeiou" else "a"
        raise CliError("invalid_job_id", f"{str(value)[:100]!r} is not {article} {what} id (ids are UUIDs such as "
                       "3f1f8c5e-0000-4000-8000-000000000000)",
                       f"list {what}s and their ids with: {_LISTINGS.get(what, 'kiln jobs list')}") from None


def adapter_name_arg(name: str) -> str:
    """An adapter name as the server accepts it; "", "." and ".." are `invalid_path_segment` (as for any
    name in a path), any other malformed name `invalid_adapter_name`, before any request."""
    api_path("/v1/adapters", name)
    if not is_valid_name(name, reserved=("base",)):  # the server's rule (adapters.services.validate_adapter_name)
        raise CliError("invalid_adapter_name", f"{name[:100]!r} is not a valid adapter name",
                       "use letters, digits, '.', '_' and '-' (at most 64), e.g. math-r001; list them with: "
                       "kiln adapters list")
    return name


def _non_finite_at(value) -> tuple[str, float] | None:
    """Where in a JSON body the first NaN or Infinity is ("$.groups[0].reward"), and the value; None if none.
    Iterative, and each container once: a deeply nested file must not end in RecursionError here, nor a
    cyclic value (httpx's own ValueError for it stands) loop forever."""
    stack, seen = [("$", value)], set()
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where, item
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            stack.extend((f"{where}.{key}", child) for key, child in reversed(list(item.items())))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def check_json_body(body) -> None:
    """Refuse a body that JSON cannot carry: NaN and Infinity (from a float option such as --temperature nan,
    or a file Python's json module read) are not JSON numbers, and httpx refuses them with a bare ValueError."""
    found = _non_finite_at(body)
    if found is not None:
        where, number = found
        raise CliError("invalid_json_value", f"the request holds {number!r} at {where[:200]}: NaN and Infinity "
                       "are not JSON numbers", "give a finite number (in the option or the file it came from)")


def check_token(token: str, source: str) -> None:
    """A bearer token goes into an HTTP header: a non-ASCII or control character there is a UnicodeEncodeError
    (or a header that ends early), never a request. The token itself is never echoed: it is a secret."""
    if not token.isascii() or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in token):
        raise CliError("invalid_token", f"the API token from {source} holds a character that is not printable ASCII",
                       "tokens are ASCII (they start with kiln_); create one with: kiln token create USER")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # server text is not allowed to drive the terminal


# The server whose 2xx JSON answer this process last read: a command that then finds the answer is not
# the shape Kiln sends (a KeyError or TypeError while it prints it) names that server (cli.main).
last_answered_by: str | None = None


def require_fields(answer, *fields: str, url: str):
    """`answer` when it is an object with `fields` (what Kiln's API always sends), else the one line
    `unexpected_answer`: for a command that reads the answer with defaults and would print nothing."""
    if isinstance(answer, dict) and all(field in answer for field in fields):
        return answer
    raise CliError("unexpected_answer", f"the answer from {url} is not what Kiln's API sends (no "
                   f"{', '.join(fields)})", "check --url or KILN_URL names a Kiln server of this version")


def _content_type(response) -> str:
    kind = (response.headers.get("content-type") or "").split(";", 1)[0].strip()
    return _CONTROL.sub("?", kind)[:100] or "no content type"


def not_kiln(response, url: str) -> CliError:
    """The one line for an answer that is not Kiln's JSON API (a wrong --url: another web server)."""
    status = f"{response.status_code} {response.reason_phrase}".strip()
    location = _CONTROL.sub("?", response.headers.get("location") or "")
    moved = f" (redirecting to {location[:200]})" if location and 300 <= response.status_code < 400 else ""
    return CliError("not_a_kiln_server", f"{url} answered {status}{moved} with {_content_type(response)}, "
                    "not Kiln's JSON API", "check --url or KILN_URL: it should name the Kiln server, "
                    "e.g. http://127.0.0.1:8420")


def _envelope_error(response) -> CliError | None:
    """Kiln's error envelope {"error": {"code", "message", "hint"}} as a CliError, or None."""
    try:
        error = response.json()["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(code, str) or not isinstance(message, str):
        return None
    hint = error.get("hint") if isinstance(error.get("hint"), str) else ""
    return CliError(code, _CONTROL.sub("?", " ".join(message.splitlines())), _CONTROL.sub("?", " ".join(hint.splitlines())))


def _retry_after_seconds(response) -> float | None:
    """A Retry-After header in seconds (Kiln sends seconds, never an HTTP date); None when absent or not a number."""
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86400 else None


def raise_for_stream_error(response, url: str | None = None) -> None:
    """A streamed download's refusal (status >= 400) as a CliError with the server's code, message and hint,
    or `not_a_kiln_server` when the body is not the error envelope (or the answer is a redirect, which
    Kiln's API never sends); reads the body first."""
    if 300 <= response.status_code < 400:
        response.read()
        raise not_kiln(response, url or _origin(response))
    if response.status_code >= 400:
        response.read()
        error = _envelope_error(response)
        if error is None:
            raise not_kiln(response, url or _origin(response))
        raise error


def _origin(response) -> str:
    try:
        request_url = response.request.url
        return f"{request_url.scheme}://{request_url.netloc.decode()}"
    except RuntimeError:
        return "the server"


class _GuardedHttp(httpx.Client):
    """httpx.Client that checks every relative path it is asked for (also `client._http.stream(...)`)."""

    def build_request(self, method, url, *args, **kwargs):
        if isinstance(url, str) and "://" not in url:
            check_path(method, url)
        try:
            return super().build_request(method, url, *args, **kwargs)
        except ValueError:
            # httpx encodes json= with allow_nan=False; name the value instead of its bare ValueError
            # (checked only on failure: a large inline GRPO body is not walked twice)
            if kwargs.get("json") is not None:
                check_json_body(kwargs["json"])
            raise


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
        if token is not None:
            source = "the command"
        elif os.environ.get("KILN_API_TOKEN"):
            token, source = os.environ["KILN_API_TOKEN"], "KILN_API_TOKEN"
        else:
            token, source = local_token(self.url), "KILN_HOME/cli-token"
        if token:
            check_token(token, source)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = _GuardedHttp(base_url=self.url, headers=headers, timeout=timeout)
        self._announce_lock = threading.Lock()
        self._announced = False

    def request(self, method: str, path: str, *, with_status: bool = False, **kwargs):
        """Send one request; while the server answers model_loading, wait (bounded) and send again.
        Returns the answer's JSON; with `with_status`, (the JSON, the HTTP status), for a caller that
        tells a 202 (created) from a 200 (the resource a retry named)."""
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
            return result if with_status else result[0]

    def _answered(self, method: str, path: str, **kwargs) -> httpx.Response:
        """The server's 2xx answer; a transport failure, a refusal (the envelope as a CliError) or an answer
        that is not Kiln's raise."""
        check_path(method, path)
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise CliError("connection_failed", f"cannot reach Kiln at {self.url}: {exc}",
                           "is `kiln serve` running? pass --url or set KILN_URL") from None
        if response.status_code >= 400:
            error = _envelope_error(response)
            if error is None:
                raise not_kiln(response, self.url)
            error.retry_after = _retry_after_seconds(response)
            raise error
        if response.status_code >= 300:  # Kiln's API never redirects: another server answered
            raise not_kiln(response, self.url)
        return response

    def _send(self, method: str, path: str, **kwargs) -> tuple[object, int]:
        """(the answer's JSON, its HTTP status)."""
        response = self._answered(method, path, **kwargs)
        if not response.content:
            return None, response.status_code
        try:
            data = response.json()
        except ValueError:
            raise not_kiln(response, self.url) from None
        global last_answered_by
        last_answered_by = self.url
        return data, response.status_code

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def text(self, path: str, *, content_type: str) -> str:
        """GET a route that answers text (GET /metrics), refused like any other route's answer."""
        response = self._answered("GET", path)
        if not response.headers.get("content-type", "").startswith(content_type):
            raise not_kiln(response, self.url)
        return response.text

    def post(self, path: str, **kwargs):
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs):
        return self.request("DELETE", path, **kwargs)
