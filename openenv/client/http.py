"""Bounded HTTP requests to an OpenEnv server, and strict JSON parsing. Pure module (httpx, no Django).

Redirects are never followed, proxies and netrc from the environment are ignored (a credential
must reach its origin and nothing else), timeouts are 60 s per request and 10 s to connect, and a
body is read only up to its limit (2 MiB for discovery documents) after decompression.
"""

from __future__ import annotations

import json
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
        raise OpenEnvUnavailable(f"{what} failed: {type(exc).__name__}", endpoint=url) from None
    data = bytes(body)
    if credential is not None and credential.reflected_in(data):
        raise OpenEnvCredentialReflected(f"{what} echoed the bearer token", endpoint=url)
    return status, data


def status_error(status: int, what: str, url: str, *,
                 credential: Credential | None = None) -> OpenEnvHttpStatus | OpenEnvUnavailable:
    if status in UNAVAILABLE_STATUSES or status >= 500:
        return OpenEnvUnavailable(f"{what} answered HTTP {status}", http_status=status, endpoint=url)
    if status in (401, 403):  # say what to fix (the credential), not that the server looks unhealthy
        why = ("the server refused the bearer token sent" if credential is not None
               else "the server requires credentials and none were given")
        return OpenEnvUnauthorized(f"{what} answered HTTP {status}: {why}", http_status=status, endpoint=url)
    return OpenEnvHttpStatus(f"{what} answered HTTP {status}", http_status=status, endpoint=url)
