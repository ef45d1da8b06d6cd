"""OpenEnv discovery and the environment identity (reference-spec §4.1-4.2, §4.7).

Pure module: no Django, no torch. `inspect` checks `GET /health` (exactly 200, status only), then
reads `/metadata`, `/schema`, `/list_environments` and `/openapi.json` concurrently (each body at
most 2 MiB), compiles the action schema once, and returns an `Inspection`:
- `schema_sha256`: over the canonical JSON of the typed `{action, observation, state}`;
- `discovery_sha256`: over the canonical JSON (RFC 8785: sorted keys, no whitespace) of
  `{"schema": "kiln.openenv-discovery.v1", "metadata", "schema_document", "environments",
  "openapi"}` holding the four raw documents, so key order and formatting do not matter and
  extension fields (e.g. `reset_observation`) do. This wrapper is frozen: changing it changes
  every identity.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from core.canonical import json_digest
from openenv.client.actions import ActionSchema
from openenv.client.credentials import Credential, authentication
from openenv.client.errors import OpenEnvInvalidDocument, OpenEnvRedirectRefused, OpenEnvUnhealthy
from openenv.client.http import (
    CONNECT_TIMEOUT_S,
    MAX_DISCOVERY_BYTES,
    REQUEST_TIMEOUT_S,
    JsonError,
    new_client,
    request_bounded,
    status_error,
    strict_json,
)
from openenv.client.urls import Endpoint, as_endpoint

IDENTITY_SCHEMA = "kiln.openenv-identity.v1"
INSPECTION_SCHEMA = "kiln.openenv-inspection.v1"
DISCOVERY_LABEL = "kiln.openenv-discovery.v1"
CLIENT_PROFILE = "openenv-http/1.x"
MAX_ENVIRONMENTS = 16_384
METADATA_OPTIONAL = ("readme_content", "version", "author", "documentation_url")


@dataclass(frozen=True)
class DiscoveryDocuments:
    """The four raw discovery documents, as parsed JSON."""

    metadata: dict
    schema_document: dict
    environments: list
    openapi: dict

    def labelled(self) -> dict:
        return {"schema": DISCOVERY_LABEL, "metadata": self.metadata, "schema_document": self.schema_document,
                "environments": self.environments, "openapi": self.openapi}


def discovery_sha256(documents: DiscoveryDocuments) -> str:
    try:
        return json_digest(documents.labelled())
    except Exception as exc:  # rfc8785 refuses numbers outside the safe JSON domain
        raise OpenEnvInvalidDocument(f"a discovery document cannot be canonicalised: {exc}") from None


def typed_schema(schema_document: dict) -> dict:
    return {key: schema_document[key] for key in ("action", "observation", "state")}


def schema_sha256(schema: dict) -> str:
    """The digest of the typed `{action, observation, state}` (extra keys of /schema do not count)."""
    return json_digest(typed_schema(schema))


@dataclass(frozen=True)
class Inspection:
    endpoint: Endpoint
    identity: dict           # kiln.openenv-identity.v1: never a token, handle or variable name
    schema: dict             # {action, observation, state}
    documents: DiscoveryDocuments
    action_schema: ActionSchema = field(compare=False, repr=False)

    @property
    def environment_name(self) -> str:
        return self.identity["metadata"]["name"]

    @property
    def discovery_sha256(self) -> str:
        return self.identity["discovery_sha256"]

    def to_json(self) -> dict:
        """An `OpenEnvInspection`: `{identity, schema}`."""
        return {"identity": self.identity, "schema": self.schema}


def _check_metadata(value: Any) -> dict:
    if not isinstance(value, dict):
        raise OpenEnvInvalidDocument("/metadata is not a JSON object")
    for key in ("name", "description"):
        if not isinstance(value.get(key), str):
            raise OpenEnvInvalidDocument(f"/metadata.{key} must be a string")
    if not value["name"].strip():
        raise OpenEnvInvalidDocument("/metadata.name is empty")
    for key in METADATA_OPTIONAL:
        if value.get(key) is not None and not isinstance(value[key], str):
            raise OpenEnvInvalidDocument(f"/metadata.{key} must be a string or null")
    return value


def _check_schema(value: Any) -> dict:
    if not isinstance(value, dict):
        raise OpenEnvInvalidDocument("/schema is not a JSON object")
    for key in ("action", "observation", "state"):
        if not isinstance(value.get(key), (dict, bool)):
            raise OpenEnvInvalidDocument(f"/schema.{key} must be a JSON Schema")
    return value


def _check_environments(value: Any) -> list:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise OpenEnvInvalidDocument("/list_environments must be an array of strings")
    if len(value) > MAX_ENVIRONMENTS:
        raise OpenEnvInvalidDocument(f"/list_environments has more than {MAX_ENVIRONMENTS} entries")
    return value


def _check_openapi(value: Any) -> dict:
    if not isinstance(value, dict):
        raise OpenEnvInvalidDocument("/openapi.json is not a JSON object")
    return value


async def check_health(endpoint: Endpoint, *, credential: Credential | None, http) -> None:
    """`GET /health` must answer exactly 200 (the body is not interpreted); 401/403 is named as a credential
    problem (openenv_unauthorized), not an unhealthy server."""
    url = endpoint.url("health")
    try:
        status, _ = await request_bounded(http, "GET", endpoint, url, credential=credential, what="GET /health")
    except OpenEnvRedirectRefused as exc:
        raise OpenEnvUnhealthy(f"GET /health answered HTTP {exc.http_status}, not 200",
                               http_status=exc.http_status, endpoint=url) from None
    if status != 200:
        if status >= 500 or status in (408, 425, 429, 401, 403):
            raise status_error(status, "GET /health", url, credential=credential)
        raise OpenEnvUnhealthy(f"GET /health answered HTTP {status}, not 200", http_status=status, endpoint=url)


async def _document(http, endpoint: Endpoint, path: str, credential: Credential | None, check):
    url = endpoint.url(path)
    what = f"GET /{path}"
    status, body = await request_bounded(http, "GET", endpoint, url, credential=credential,
                                         limit=MAX_DISCOVERY_BYTES, what=what)
    if status != 200:
        raise status_error(status, what, url, credential=credential)
    try:
        value = strict_json(body)
    except JsonError as exc:
        raise OpenEnvInvalidDocument(f"{what} is not valid JSON: {str(exc)[:200]}", endpoint=url) from None
    return check(value)


async def fetch_documents(endpoint: Endpoint, *, credential: Credential | None, http) -> DiscoveryDocuments:
    results = await asyncio.gather(
        _document(http, endpoint, "metadata", credential, _check_metadata),
        _document(http, endpoint, "schema", credential, _check_schema),
        _document(http, endpoint, "list_environments", credential, _check_environments),
        _document(http, endpoint, "openapi.json", credential, _check_openapi),
        return_exceptions=True,
    )
    for result in results:  # the first failure in document order, whatever finished first
        if isinstance(result, BaseException):
            raise result
    return DiscoveryDocuments(*results)


def build_inspection(endpoint: Endpoint, documents: DiscoveryDocuments, *,
                     credential: Credential | None = None) -> Inspection:
    digest = discovery_sha256(documents)
    action_schema = ActionSchema.compile(documents.schema_document["action"])
    info = documents.openapi.get("info")
    version = info.get("version") if isinstance(info, dict) else None
    metadata = documents.metadata
    identity = {
        "schema": IDENTITY_SCHEMA,
        "client_profile": CLIENT_PROFILE,
        "base_url": endpoint.base_url,
        "websocket_url": endpoint.websocket_url,
        "openapi_version": version if isinstance(version, str) else None,
        "environments": list(documents.environments),
        "metadata": {"name": metadata["name"], "description": metadata["description"],
                     **{key: metadata.get(key) for key in METADATA_OPTIONAL}},
        "schema_sha256": schema_sha256(documents.schema_document),
        "action_schema_sha256": action_schema.sha256,
        "discovery_sha256": digest,
        "authentication": authentication(credential),
    }
    return Inspection(endpoint=endpoint, identity=identity, schema=typed_schema(documents.schema_document),
                      documents=documents, action_schema=action_schema)


async def inspect(url: Endpoint | str, *, credential: Credential | None = None,
                  request_timeout: float = REQUEST_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
                  transport=None) -> Inspection:
    endpoint = as_endpoint(url)
    async with new_client(request_timeout=request_timeout, connect_timeout=connect_timeout,
                          transport=transport) as http:
        await check_health(endpoint, credential=credential, http=http)
        documents = await fetch_documents(endpoint, credential=credential, http=http)
    return build_inspection(endpoint, documents, credential=credential)


def inspect_sync(url: Endpoint | str, **kwargs) -> Inspection:
    """`inspect` for callers without an event loop (the CLI, a sync view's thread)."""
    return asyncio.run(inspect(url, **kwargs))


def identity_differences(before: Inspection, after: Inspection) -> list[str]:
    """The identity fields that changed between two inspections (empty: the same environment).

    Revalidation after the last episode (§4.7) requires every identity field, the discovery
    digest and the action, observation and state schemas to be equal.
    """
    changed = [key for key in sorted(set(before.identity) | set(after.identity))
               if before.identity.get(key) != after.identity.get(key)]
    for key in ("action", "observation", "state"):
        if before.schema.get(key) != after.schema.get(key):
            changed.append(f"schema.{key}")
    return changed
