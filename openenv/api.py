"""/v1/openenv/inspect and /v1/openenv/tasks: OpenEnv discovery and task catalogs run by the server
(reference-spec §1.6, §4.1-4.2).

Web-facing: no torch. The handlers call the pure client (`openenv.client`) on their own event
loop. The server reaches only loopback environments (127.0.0.0/8, ::1, localhost) unless
`[openenv] allow_remote_environments` (KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS) is set: a request
that names any other host is refused with 403 `openenv_remote_environment_refused` before any
connection (SSRF protection; redirects are never followed, so a loopback URL cannot bounce
elsewhere). The CLI (`kiln openenv inspect|tasks`) is unrestricted.

Requests: `{url}` or `{environment_urls: [...]}` (alias `environments`, 1..64 URLs), with an
optional server-configured `credential_id` / aligned `credential_ids` (`[openenv.credentials.<id>]`,
openenv/server_credentials.py: an unknown handle is 400 `openenv_credential_not_found`, one bound to
another origin or without its token variable 400 `openenv_credential_invalid`).
Persisted runs (/v1/openenv/runs) live in openenv/runs/api.py. With `[openenv] enabled = false`
every route answers 404 `openenv_disabled`. Client errors keep their stable codes in the `{"error": {code, message, hint}}` envelope: a bad URL,
credential, task page or selection is 400; an environment that failed (unreachable, unhealthy,
bad discovery, Task API failure) is 502.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

from django.conf import settings
from ninja import Router

from core.accounts.auth import require_permission
from core.errors import KilnError
from openenv.api_support import Documented, check_body_size, documented
from openenv.client.credentials import PUBLIC_SLOT
from openenv.client.discovery import INSPECTION_SCHEMA, inspect
from openenv.client.errors import (
    OpenEnvCredentialInvalid,
    OpenEnvError,
    OpenEnvInvalidTaskPage,
    OpenEnvInvalidTaskSelection,
    OpenEnvUrlInvalid,
)
from openenv.client.tasks import CATALOG_SCHEMA, DEFAULT_PAGE, MAX_PAGE, task_catalog
from openenv.client.urls import Endpoint, normalize_url
from openenv.runs.api import require_enabled
from openenv.runs.api import router as runs_router
from openenv.training.api import router as training_router

router = Router(tags=["openenv"])
router.add_router("/runs", runs_router)  # /v1/openenv/runs (openenv/runs/api.py)
router.add_router("/training", training_router)  # /v1/openenv/training/preflight (openenv/training/api.py)

MAX_URLS = 64
REMOTE_SETTING = "[openenv] allow_remote_environments"
REMOTE_VARIABLE = "KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS"
BAD_REQUEST = (OpenEnvUrlInvalid, OpenEnvCredentialInvalid, OpenEnvInvalidTaskPage, OpenEnvInvalidTaskSelection)

_URLS_SCHEMA: dict[str, Any] = {
    "url": {"type": "string", "description": "one environment base URL, e.g. http://127.0.0.1:8990"},
    "credential_id": {"type": ["string", "null"], "description": "a server credential handle for url"},
    "environment_urls": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_URLS,
                         "description": "several environment base URLs (alias environments); instead of url"},
    "credential_ids": {"type": "array", "items": {"type": ["string", "null"]},
                       "description": "empty, or one handle (or null) per environment URL"},
}
INSPECT_REQUEST = {"type": "object", "additionalProperties": False, "properties": _URLS_SCHEMA,
                   "description": "give url or environment_urls (alias environments)"}
TASKS_REQUEST = {"type": "object", "additionalProperties": False, "properties": {
    **_URLS_SCHEMA,
    "environment_name": {"type": ["string", "null"], "description": "required when the server lists several"},
    "split": {"type": ["string", "null"]},
    "start": {"type": "integer", "minimum": 0, "default": 0},
    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE},
}, "description": "give url or environment_urls (alias environments)"}
INSPECTION_RESPONSE = {"type": "object", "required": ["schema", "environments"], "properties": {
    "schema": {"const": INSPECTION_SCHEMA},
    "environments": {"type": "array", "items": {"type": "object", "required": ["identity", "schema"]},
                     "description": "one OpenEnvInspection {identity, schema} per URL, in request order"}}}
CATALOGS_RESPONSE = {"type": "object", "required": ["schema", "catalogs"], "properties": {
    "schema": {"const": CATALOG_SCHEMA},
    "catalogs": {"type": "array", "items": {"type": "object", "required": ["base_url", "catalog"]},
                 "description": "one {base_url, catalog} per URL, in request order"}}}


OpenEnvInspectRequest = documented("OpenEnvInspectRequest", INSPECT_REQUEST, __name__)
OpenEnvTasksRequest = documented("OpenEnvTasksRequest", TASKS_REQUEST, __name__)
OpenEnvInspectionOut = documented("OpenEnvInspectionOut", INSPECTION_RESPONSE, __name__, title="OpenEnvInspectionList")
OpenEnvCatalogsOut = documented("OpenEnvCatalogsOut", CATALOGS_RESPONSE, __name__, title="OpenEnvTaskCatalogs")


# --- request checks ---------------------------------------------------------------------------

def _invalid(message: str, hint: str = "") -> KilnError:
    return KilnError("openenv_invalid_request", f"request: {message}", status=400,
                     hint=hint or "give url (or environment_urls) and only the documented fields")


def _fields(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _invalid(f"unknown field {unknown[0]!r}")


def _targets(body: dict) -> tuple[list[str], list[str | None]]:
    """The URLs and their credential handles: `url` (+ `credential_id`) or the aligned lists."""
    if "environment_urls" in body and "environments" in body:
        raise _invalid("give environment_urls or its alias environments, not both")
    many = body.get("environment_urls", body.get("environments"))
    if ("url" in body) == (many is not None):
        raise _invalid("give exactly one of url and environment_urls")
    if "url" in body:
        if "credential_ids" in body:
            raise _invalid("credential_ids goes with environment_urls; use credential_id with url")
        handle = body.get("credential_id")
        if handle is not None and not isinstance(handle, str):
            raise _invalid("credential_id must be a string or null")
        urls, handles = [body["url"]], [handle]
    else:
        if "credential_id" in body:
            raise _invalid("credential_id goes with url; use credential_ids with environment_urls")
        if not isinstance(many, list) or not 1 <= len(many) <= MAX_URLS:
            raise _invalid(f"environment_urls must be a list of 1 to {MAX_URLS} URLs")
        handles = body.get("credential_ids") or []
        if not isinstance(handles, list) or not all(h is None or isinstance(h, str) for h in handles):
            raise _invalid("credential_ids must be a list of strings or nulls")
        if handles and len(handles) != len(many):
            raise _invalid(f"{len(handles)} credential_ids for {len(many)} environment URLs",
                           "give no credential_ids, or one (or null) per URL")
        urls, handles = list(many), list(handles) or [None] * len(many)
    if not all(isinstance(url, str) for url in urls):
        raise _invalid("every environment URL must be a string")
    return urls, [None if handle == PUBLIC_SLOT else handle for handle in handles]  # "-": a public slot


def is_loopback_only(endpoint: Endpoint) -> bool:
    """127.0.0.0/8, ::1 or the name localhost: hosts that cannot leave this machine."""
    if endpoint.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(endpoint.host).is_loopback
    except ValueError:
        return False


def _endpoints(urls: list[str]) -> list[Endpoint]:
    try:
        endpoints = [normalize_url(url) for url in urls]
    except OpenEnvUrlInvalid as exc:
        raise _client_error(exc, "openenv_invalid_url") from None  # a bad URL is a 400 (BAD_REQUEST)
    if not settings.KILN.openenv_allow_remote_environments:
        for endpoint in endpoints:
            if not is_loopback_only(endpoint):
                raise KilnError(
                    "openenv_remote_environment_refused",
                    f"{endpoint.base_url} is not a loopback address; this server reaches only loopback "
                    f"environments unless {REMOTE_SETTING} is set", status=403,
                    hint=f"set {REMOTE_SETTING} = true in kiln.toml (or {REMOTE_VARIABLE}=true), or run "
                         "kiln openenv inspect from a machine that can reach it")
    return endpoints


def _credentials(handles: list[str | None], endpoints, *, read_tokens: bool = True, operation: str = "") -> list:
    """The Credential (or None) per URL for the server's handles (`[openenv.credentials.<id>]`): 400
    `openenv_credential_not_found` for an unknown handle, 400 `openenv_credential_invalid` for one bound
    to another origin or whose token variable is unset. `read_tokens=False` checks only (admission);
    `operation` names what the credentials are read for (GET /metrics counts it)."""
    from openenv import server_credentials

    try:
        if not read_tokens:
            server_credentials.check_handles(handles, endpoints)
            return [None] * len(handles)
        credentials = server_credentials.resolve(handles, endpoints)
    except OpenEnvError as exc:
        raise KilnError(exc.code, exc.message, status=400, hint=exc.hint or "") from None
    if operation:
        from openenv.metrics import count_authenticated

        count_authenticated(operation, credentials)
    return credentials


def _client_error(exc: OpenEnvError, failed_code: str) -> KilnError:
    """A bad request keeps the client's own 400 code; an environment that failed is the route's 502
    code (reference-spec §1.6), the client's code first in the message (what exactly went wrong)."""
    if isinstance(exc, BAD_REQUEST):
        return KilnError(exc.code, exc.message, status=400, hint=exc.hint or "")
    return KilnError(failed_code, f"{exc.code}: {exc.message}", status=502, hint=exc.hint or "")


def _run(coroutine, failed_code: str):
    try:
        return asyncio.run(coroutine)
    except OpenEnvError as exc:
        raise _client_error(exc, failed_code) from None


def _body(request, model: Documented, allowed: set[str]) -> dict:
    check_body_size(request, "an OpenEnv request")
    body = model.as_dict()
    _fields(body, allowed)
    return body


# --- routes -----------------------------------------------------------------------------------

@router.post("/inspect", summary="Check /health and read an OpenEnv environment's discovery documents",
             response=OpenEnvInspectionOut)
def openenv_inspect(request, body: OpenEnvInspectRequest):
    require_enabled()
    require_permission(request, "submit_job")
    values = _body(request, body, set(_URLS_SCHEMA) | {"environments"})
    urls, handles = _targets(values)
    endpoints = _endpoints(urls)
    credentials = _credentials(handles, endpoints, operation="inspect")

    async def inspect_all():
        return await asyncio.gather(*(inspect(e, credential=c) for e, c in zip(endpoints, credentials, strict=True)))

    inspections = _run(inspect_all(), "openenv_inspection_failed")
    return {"schema": INSPECTION_SCHEMA, "environments": [i.to_json() for i in inspections]}


@router.post("/tasks", summary="One page of an OpenEnv environment's task catalog (read-only)",
             response=OpenEnvCatalogsOut)
def openenv_tasks(request, body: OpenEnvTasksRequest):
    require_enabled()
    require_permission(request, "submit_job")
    values = _body(request, body, set(TASKS_REQUEST["properties"]) | {"environments"})
    urls, handles = _targets(values)
    name, split = values.get("environment_name"), values.get("split")
    for field, value in (("environment_name", name), ("split", split)):
        if value is not None and (not isinstance(value, str) or not value):
            raise _invalid(f"{field} must be a non-empty string or null")
    start, limit = values.get("start", 0), values.get("limit", DEFAULT_PAGE)
    for field, value in (("start", start), ("limit", limit)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise KilnError("openenv_invalid_task_page", f"request: {field} must be an integer", status=400,
                            hint=OpenEnvInvalidTaskPage.default_hint)
    endpoints = _endpoints(urls)
    credentials = _credentials(handles, endpoints, operation="task_catalog")

    async def catalogs():
        return await asyncio.gather(*(task_catalog(e, credential=c, environment_name=name, split=split,
                                                   start=start, limit=limit)
                                      for e, c in zip(endpoints, credentials, strict=True)))

    pages = _run(catalogs(), "openenv_task_catalog_failed")
    return {"schema": CATALOG_SCHEMA,
            "catalogs": [{"base_url": e.base_url, "catalog": page} for e, page in zip(endpoints, pages, strict=True)]}
