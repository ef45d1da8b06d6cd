"""Bearer credentials for protected OpenEnv servers, bound to one exact origin (reference-spec §4.13).

Pure module: no Django. A token is read from an environment variable the caller names
(`--credential-env VAR`, or a server-side `bearer_token_env`); `-` is a public slot. The token
lives only inside `Credential`: its repr, `str()` and `identity()` never show it, it is sent only
to its own origin (on /health, discovery, the Task API and the WebSocket upgrade), and it is
never written to an artifact, a log or the database. Identities record only
`authentication: none|bearer`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from openenv.client.errors import OpenEnvCredentialInvalid
from openenv.client.urls import Endpoint, as_endpoint, normalize_url

PUBLIC_SLOT = "-"
VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# A server credential's handle (`[openenv.credentials.<id>]`, a request's credential_ids); "-" is
# reserved for a public slot.
CREDENTIAL_HANDLE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PUBLIC_SLOT = "-"  # in an aligned credential list: this URL needs none (as null); never a handle's name
_TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")  # visible ASCII: header-safe, no whitespace


@dataclass(frozen=True)
class Credential:
    origin: str
    _token: str = field(repr=False, compare=False)
    method: str = "bearer"

    def headers_for(self, endpoint: Endpoint) -> dict[str, str]:
        if endpoint.origin != self.origin:
            raise OpenEnvCredentialInvalid(
                f"a credential for {self.origin} cannot be sent to {endpoint.origin}",
                hint="credentials are bound to one exact origin (scheme, host and port)")
        return {"Authorization": f"Bearer {self._token}"}

    def reflected_in(self, data: bytes | str) -> bool:
        """Whether the token appears in a response or frame (which is then refused)."""
        needle = self._token if isinstance(data, str) else self._token.encode()
        return needle in data

    def __repr__(self) -> str:
        return f"Credential(origin={self.origin!r}, method={self.method!r}, token=<redacted>)"

    __str__ = __repr__


def authentication(credential: Credential | None) -> str:
    return "bearer" if credential is not None else "none"


def check_secure(endpoint: Endpoint) -> None:
    if endpoint.scheme != "https" and not endpoint.is_loopback:
        raise OpenEnvCredentialInvalid(
            f"a bearer token may only be sent over HTTPS (or to loopback), not to {endpoint.origin}",
            hint="use an https:// environment URL for a protected remote environment")


def _read_token(variable: str, environ: Mapping[str, str]) -> str:
    if not VARIABLE_NAME.match(variable):
        raise OpenEnvCredentialInvalid(f"{variable!r} is not an environment variable name")
    token = environ.get(variable, "")
    if not token:
        raise OpenEnvCredentialInvalid(f"the credential variable {variable} is not set or empty")
    if not _TOKEN.match(token):
        raise OpenEnvCredentialInvalid(
            f"the credential variable {variable} must hold one bearer token of visible ASCII characters")
    return token


def credential_from_env(url: Endpoint | str, variable: str, *,
                        environ: Mapping[str, str] | None = None) -> Credential | None:
    """The credential for `url` from `$variable`; `-` means a public slot (None)."""
    if variable == PUBLIC_SLOT:
        return None
    endpoint = as_endpoint(url)
    check_secure(endpoint)
    return Credential(origin=endpoint.origin, _token=_read_token(variable, os.environ if environ is None else environ))


def credential_for_origin(url: Endpoint | str, *, origin: str, bearer_token_env: str,
                          environ: Mapping[str, str] | None = None) -> Credential:
    """A server-configured credential (`[openenv.credentials.<id>]`): its origin must be the URL's exactly."""
    endpoint = as_endpoint(url)
    configured = normalize_url(origin)
    if configured.base_url != configured.origin:
        raise OpenEnvCredentialInvalid(f"the credential origin {origin!r} must not have a path")
    if configured.origin != endpoint.origin:
        raise OpenEnvCredentialInvalid(f"the credential for {configured.origin} does not match {endpoint.origin}")
    check_secure(endpoint)
    return Credential(origin=endpoint.origin,
                      _token=_read_token(bearer_token_env, os.environ if environ is None else environ))


def credentials_for_urls(urls: Sequence[Endpoint | str], variables: Sequence[str] | None, *,
                         environ: Mapping[str, str] | None = None) -> list[Credential | None]:
    """One credential slot per URL: `variables` is empty (all public) or aligned with `urls`."""
    if not variables:
        return [None] * len(urls)
    if len(variables) != len(urls):
        raise OpenEnvCredentialInvalid(
            f"{len(variables)} credential slots for {len(urls)} environment URLs",
            hint="repeat --credential-env once per --environment, using - for a public one")
    return [credential_from_env(url, variable, environ=environ) for url, variable in zip(urls, variables, strict=True)]
