"""OpenEnv URL normalisation (reference-spec §4.1). Pure module: no Django, no network.

A bare `host:port` gets `http://`; only http and https; userinfo, query and fragment are refused;
the host is lower-cased and a default port dropped; trailing slashes are trimmed; the WebSocket
URL is the same origin with scheme ws/wss and `/ws` appended to the path. The WebSocket URL itself
(ws/wss, or a path ending in `/ws`, as `kiln openenv inspect` prints it) is refused with the base
URL to give instead: taken as a base URL it would fail later as an unhealthy server (GET /ws/health).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from openenv.client.errors import OpenEnvUrlInvalid

MAX_URL_LENGTH = 2048
DEFAULT_PORTS = {"http": 80, "https": 443}
SOCKET_SCHEMES = {"ws": "http", "wss": "https"}
_PATH_CHARS = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*$")


@dataclass(frozen=True)
class Endpoint:
    """One normalised environment URL."""

    base_url: str        # scheme://host[:port][/path], no trailing slash
    websocket_url: str   # ws(s)://host[:port][/path]/ws
    origin: str          # scheme://host[:port]: what a credential is bound to
    scheme: str
    host: str            # lower-case; IPv6 without brackets
    port: int

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def task_url(self, environment_name: str, route: str) -> str:
        """`/{env}/{route}`, the environment name percent-encoded as one path segment."""
        return self.url(f"{quote(environment_name, safe='')}/{route}")

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)

    def __str__(self) -> str:
        return self.base_url


def is_loopback_host(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def normalize_url(raw: str) -> Endpoint:
    if not isinstance(raw, str):
        raise OpenEnvUrlInvalid("the environment URL must be a string")
    text = raw.strip()
    if not text:
        raise OpenEnvUrlInvalid("the environment URL is empty")
    if len(text) > MAX_URL_LENGTH:
        raise OpenEnvUrlInvalid(f"the environment URL is longer than {MAX_URL_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F or ch == "\\" for ch in text):
        raise OpenEnvUrlInvalid("the environment URL contains whitespace, control characters or a backslash")
    if "://" not in text:
        text = "http://" + text
    if "?" in text:
        raise OpenEnvUrlInvalid("the environment URL must not have a query")
    if "#" in text:
        raise OpenEnvUrlInvalid("the environment URL must not have a fragment")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise OpenEnvUrlInvalid(f"the environment URL does not parse: {exc}") from None
    scheme = parts.scheme.lower()
    socket_scheme = scheme in SOCKET_SCHEMES
    scheme = SOCKET_SCHEMES.get(scheme, scheme)
    if scheme not in DEFAULT_PORTS:
        raise OpenEnvUrlInvalid(f"the environment URL scheme must be http or https, not {parts.scheme!r}")
    if "@" in parts.netloc:
        raise OpenEnvUrlInvalid("the environment URL must not carry credentials (user@host)",
                                hint="give a bearer token instead: --credential-env VAR on the CLI, or a "
                                     "credential_ids handle for a server run")
    host = (parts.hostname or "").lower()
    if not host:
        raise OpenEnvUrlInvalid("the environment URL has no host")
    if port == 0:
        raise OpenEnvUrlInvalid("the environment URL port must be between 1 and 65535")
    path = parts.path.rstrip("/")
    if not _PATH_CHARS.match(path):
        raise OpenEnvUrlInvalid("the environment URL path has characters that are not allowed")
    port = port or DEFAULT_PORTS[scheme]
    host_part = f"[{host}]" if ":" in host else host
    authority = host_part if port == DEFAULT_PORTS[scheme] else f"{host_part}:{port}"
    origin = f"{scheme}://{authority}"
    if socket_scheme or path.endswith("/ws"):
        base = origin + (path[:-3] if path.endswith("/ws") else path)
        what = f"has the WebSocket scheme {parts.scheme!r}" if socket_scheme else "ends in /ws"
        raise OpenEnvUrlInvalid(f"the environment URL {what}: that is its WebSocket endpoint, not its base URL",
                                hint=f"give the base URL {base} (Kiln opens the WebSocket at /ws itself)")
    ws_scheme = "wss" if scheme == "https" else "ws"
    return Endpoint(
        base_url=origin + path,
        websocket_url=f"{ws_scheme}://{authority}{path}/ws",
        origin=origin,
        scheme=scheme,
        host=host,
        port=port,
    )


def as_endpoint(value: Endpoint | str) -> Endpoint:
    return value if isinstance(value, Endpoint) else normalize_url(value)
