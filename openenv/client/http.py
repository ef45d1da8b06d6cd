"""Bounded HTTP requests to an OpenEnv server, and strict JSON parsing. Pure module (httpx, no Django).

Redirects are never followed, proxies and netrc from the environment are ignored (a credential
must reach its origin and nothing else), timeouts are 60 s per request and 10 s to connect, and a
body is read only up to its limit (2 MiB for discovery documents) after decompression.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx

from openenv.client.credentials import Credential
from openenv.client.errors import (
    OpenEnvCredentialReflected,
    OpenEnvHttpStatus,
    OpenEnvRedirectRefused,
    OpenEnvResponseTooLarge,
    OpenEnvUnauthorized,
    OpenEnvUnavailable,
)
from openenv.client.urls import Endpoint

REQUEST_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0
MAX_DISCOVERY_BYTES = 2 * 1024 * 1024
UNAVAILABLE_STATUSES = frozenset({408, 425, 429})


class JsonError(ValueError):
    pass


def _pairs(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise JsonError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _constant(name):
    raise JsonError(f"{name} is not JSON")


def strict_json(data: bytes | str) -> Any:
    """Parse UTF-8 JSON, refusing duplicate keys and NaN/Infinity (so a canonical hash is unambiguous)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise JsonError(str(exc)) from None


def new_client(*, request_timeout: float = REQUEST_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
               transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(request_timeout, connect=min(connect_timeout, request_timeout)),
        follow_redirects=False, trust_env=False, transport=transport,
    )


async def request_bounded(http: httpx.AsyncClient, method: str, endpoint: Endpoint, url: str, *,
                          credential: Credential | None, limit: int = MAX_DISCOVERY_BYTES,
                          json_body: Any = None, what: str) -> tuple[int, bytes]:
    """Send one request; return (status, body) with the body read up to `limit` bytes.

    Transport failures raise OpenEnvUnavailable; a redirect raises OpenEnvRedirectRefused; a body
    over the limit raises OpenEnvResponseTooLarge; a body that contains the token raises
    OpenEnvCredentialReflected. Status codes are for the caller to judge.
    """
    headers = {"Accept": "application/json"}
    if credential is not None:
        headers.update(credential.headers_for(endpoint))
    kwargs: dict[str, Any] = {"headers": headers}
    if json_body is not None:
        kwargs["content"] = json.dumps(json_body, separators=(",", ":"), ensure_ascii=False).encode()
        headers["Content-Type"] = "application/json"
    try:
        async with http.stream(method, url, **kwargs) as response:
            status = response.status_code
            if 300 <= status < 400:
                raise OpenEnvRedirectRefused(f"{what} answered a redirect (HTTP {status})",
                                             http_status=status, endpoint=url)
            declared = response.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > limit:
                raise OpenEnvResponseTooLarge(f"{what} is larger than {limit} bytes", endpoint=url)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    raise OpenEnvResponseTooLarge(f"{what} is larger than {limit} bytes", endpoint=url)
    except httpx.TimeoutException:
        raise OpenEnvUnavailable(f"{what} timed out", endpoint=url) from None
    except httpx.HTTPError as exc:
        raise transport_error(what, exc, url) from None
    data = bytes(body)
    if credential is not None and credential.reflected_in(data):
        raise OpenEnvCredentialReflected(f"{what} echoed the bearer token", endpoint=url)
    return status, data


TLS_PLAIN_HTTP_HINT = ("the server did not complete a TLS handshake: it may speak plain HTTP; give the URL with "
                       "http:// instead of https://")
TLS_CERTIFICATE_HINT = ("the server's TLS certificate did not verify (self-signed, expired or for another host "
                        "name); give a URL whose certificate this machine trusts")


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The ssl.SSLError under a transport failure (httpx wraps it as ConnectError), if any."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def transport_error(what: str, exc: BaseException, url: str) -> OpenEnvUnavailable:
    """A connection that failed below HTTP. A failed TLS handshake is named as such: `https://` against a
    plain-HTTP server fails there, and 'check that it is running' would send the user the wrong way."""
    tls = _ssl_error(exc)
    if tls is not None:
        # OpenSSL's short reason (WRONG_VERSION_NUMBER, certificate has expired): set only by the ssl module
        reason = getattr(tls, "verify_message", None) or getattr(tls, "reason", None) or type(tls).__name__
        if isinstance(tls, ssl.SSLCertVerificationError):
            return OpenEnvUnavailable(f"{what} failed: TLS certificate verification failed ({reason})",
                                      hint=TLS_CERTIFICATE_HINT, endpoint=url)
        return OpenEnvUnavailable(f"{what} failed: TLS handshake failed ({reason})", hint=TLS_PLAIN_HTTP_HINT,
                                  endpoint=url)
    return OpenEnvUnavailable(f"{what} failed: {type(exc).__name__}", endpoint=url)


def status_error(status: int, what: str, url: str, *,
                 credential: Credential | None = None) -> OpenEnvHttpStatus | OpenEnvUnavailable:
    if status in UNAVAILABLE_STATUSES or status >= 500:
        return OpenEnvUnavailable(f"{what} answered HTTP {status}", http_status=status, endpoint=url)
    if status in (401, 403):  # say what to fix (the credential), not that the server looks unhealthy
        why = ("the server refused the bearer token sent" if credential is not None
               else "the server requires credentials and none were given")
        return OpenEnvUnauthorized(f"{what} answered HTTP {status}: {why}", http_status=status, endpoint=url)
    return OpenEnvHttpStatus(f"{what} answered HTTP {status}", http_status=status, endpoint=url)
