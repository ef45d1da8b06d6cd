"""Server-side OpenEnv credentials: a request's `credential_ids` to bearer Credentials (reference-spec §4.13).

The server holds handles, not tokens: `[openenv.credentials.<id>] origin = "https://host[:port]",
bearer_token_env = "VAR"` (kiln_project.config). A request names a handle per URL (null = a public
slot). `check_handles` is what admission checks (the handle exists and is bound to that URL's exact
origin) without touching a token; `resolve` is what the process that connects calls right before it
connects: it reads the token from VAR in its own environment. Nothing here stores or shows a token
(openenv.client.credentials keeps it out of every repr), and the run record keeps only the handles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from openenv.client.credentials import Credential, credential_from_env
from openenv.client.errors import FAILURE_CONTRACT, OpenEnvCredentialInvalid, OpenEnvError
from openenv.client.urls import Endpoint, as_endpoint

CONFIG_HINT = ('configure [openenv.credentials.<id>] origin = "https://host[:port]" and bearer_token_env = "VAR" '
               "in kiln.toml (or KILN_OPENENV_CREDENTIALS), or use null for a public slot")


class CredentialNotFound(OpenEnvError):
    """A handle the server has no `[openenv.credentials.<id>]` for (400 openenv_credential_not_found)."""

    code = "openenv_credential_not_found"
    failure_code = FAILURE_CONTRACT

    def __init__(self, handle: str):
        super().__init__(f"no server credential named {handle[:64]!r}", hint=CONFIG_HINT)


def _table() -> Mapping[str, Mapping[str, str]]:
    from django.conf import settings

    return settings.KILN.openenv_credentials


def _entry(handle: str, endpoint: Endpoint, table: Mapping[str, Mapping[str, str]]) -> Mapping[str, str]:
    entry = table.get(handle)
    if entry is None:
        raise CredentialNotFound(handle)
    if entry["origin"] != endpoint.origin:
        raise OpenEnvCredentialInvalid(
            f"the credential {handle!r} is bound to {entry['origin']}, not to {endpoint.origin}",
            hint="credentials are bound to one exact origin (scheme, host and port): name the handle "
                 "configured for this URL's origin")
    return entry


def check_handles(handles: Sequence[str | None], urls: Sequence[Endpoint | str], *,
                  table: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Every handle exists and is bound to its URL's origin (no token is read)."""
    table = _table() if table is None else table
    for handle, url in zip(handles, urls, strict=True):
        if handle is not None:
            _entry(handle, as_endpoint(url), table)


def resolve(handles: Sequence[str | None] | None, urls: Sequence[Endpoint | str], *,
            table: Mapping[str, Mapping[str, str]] | None = None,
            environ: Mapping[str, str] | None = None) -> list[Credential | None]:
    """The Credential (or None) for each URL, the tokens read now from this process's environment."""
    table = _table() if table is None else table
    handles = list(handles or [None] * len(urls))
    out: list[Credential | None] = []
    for handle, url in zip(handles, urls, strict=True):
        if handle is None:
            out.append(None)
            continue
        endpoint = as_endpoint(url)
        entry = _entry(handle, endpoint, table)
        try:
            out.append(credential_from_env(endpoint, entry["bearer_token_env"], environ=environ))
        except OpenEnvCredentialInvalid as exc:
            raise OpenEnvCredentialInvalid(
                f"the credential {handle!r}: {exc.message}",
                hint="set the variable its bearer_token_env names in the environment of the Kiln server "
                     "and its workers") from None
    return out
