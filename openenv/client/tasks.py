"""The optional OpenEnv Task API (reference-spec §4.2): splits and task rows, read-only.

Pure module: no Django. `GET /{env}/splits`, `POST /{env}/num_tasks` and `POST /{env}/task_range`
(the environment name percent-encoded as one path segment). HTTP 501 means the environment does
not implement it, which is conforming: the catalog says `task_api: "unsupported"`. At most 16,384
items per raw collection, pages of 1..200. Catalog rows are untrusted data to show a person:
OpenEnv defines no portable row-to-reset mapping, so they are never turned into reset payloads.
"""

from __future__ import annotations

from typing import Any

from openenv.client.credentials import Credential
from openenv.client.discovery import check_health
from openenv.client.errors import OpenEnvInvalidTaskPage, OpenEnvInvalidTaskSelection, OpenEnvTaskApiFailed
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

CATALOG_SCHEMA = "kiln.openenv-task-catalog.v1"
MAX_COLLECTION_ITEMS = 16_384
MAX_PAGE = 200
DEFAULT_PAGE = 50


class _Unsupported(Exception):
    pass


async def _call(http, endpoint: Endpoint, credential, method: str, url: str, what: str, body=None) -> Any:
    status, data = await request_bounded(http, method, endpoint, url, credential=credential,
                                         limit=MAX_DISCOVERY_BYTES, json_body=body, what=what)
    if status == 501:
        raise _Unsupported(what)
    if status == 404:
        raise OpenEnvInvalidTaskSelection(f"{what} answered 404 (unknown environment or route)", http_status=404)
    if status == 400:
        raise OpenEnvInvalidTaskSelection(f"{what} answered 400 (invalid split or index)", http_status=400)
    if status != 200:
        raise status_error(status, what, url, credential=credential)
    try:
        return strict_json(data)
    except JsonError as exc:
        raise OpenEnvTaskApiFailed(f"{what} is not valid JSON: {str(exc)[:200]}") from None


def _collection(value: Any, key: str | None, what: str) -> list:
    items = value.get(key) if key and isinstance(value, dict) else value
    if not isinstance(items, list):
        raise OpenEnvTaskApiFailed(f"{what} did not return a list")
    if len(items) > MAX_COLLECTION_ITEMS:
        raise OpenEnvTaskApiFailed(f"{what} returned more than {MAX_COLLECTION_ITEMS} items")
    return items


async def task_catalog(url: Endpoint | str, *, credential: Credential | None = None,
                       environment_name: str | None = None, split: str | None = None,
                       start: int = 0, limit: int = DEFAULT_PAGE,
                       request_timeout: float = REQUEST_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
                       transport=None) -> dict:
    """One page of an environment's task catalog (or `task_api: "unsupported"`)."""
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise OpenEnvInvalidTaskPage("start must be a non-negative integer")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise OpenEnvInvalidTaskPage(f"limit must be between 1 and {MAX_PAGE}")
    endpoint = as_endpoint(url)
    async with new_client(request_timeout=request_timeout, connect_timeout=connect_timeout,
                          transport=transport) as http:
        await check_health(endpoint, credential=credential, http=http)
        if environment_name is None:
            names = _collection(await _call(http, endpoint, credential, "GET", endpoint.url("list_environments"),
                                            "GET /list_environments"), None, "GET /list_environments")
            if len(names) != 1 or not isinstance(names[0], str):
                raise OpenEnvInvalidTaskSelection(
                    f"the server lists {len(names)} environments; name one", hint="pass --environment-name")
            environment_name = names[0]
        catalog: dict[str, Any] = {"schema": CATALOG_SCHEMA, "base_url": endpoint.base_url,
                                   "environment_name": environment_name}
        try:
            splits = _collection(await _call(http, endpoint, credential, "GET",
                                             endpoint.task_url(environment_name, "splits"), "GET splits"),
                                 None, "GET splits")
            catalog.update(task_api="supported", splits=splits)
            if split is None:
                return catalog
            names = [s if isinstance(s, str) else s.get("name") for s in splits if isinstance(s, str | dict)]
            if names and split not in names:
                # Asked before num_tasks: an environment may answer an unknown split with a 500.
                raise OpenEnvInvalidTaskSelection(
                    f"split {split!r} is not one of the environment's splits ({', '.join(map(str, names))})",
                    hint=f"pick one of: {', '.join(map(str, names))}")
            body = {"split": split}
            count = await _call(http, endpoint, credential, "POST",
                                endpoint.task_url(environment_name, "num_tasks"), "POST num_tasks", body)
            total = count.get("num_tasks") if isinstance(count, dict) else None
            if isinstance(total, bool) or not isinstance(total, int) or total < 0:
                raise OpenEnvTaskApiFailed("POST num_tasks did not return a non-negative num_tasks")
            stop = min(start + limit, total)
            tasks: list = []
            if start < stop:
                page = await _call(http, endpoint, credential, "POST",
                                   endpoint.task_url(environment_name, "task_range"), "POST task_range",
                                   {"split": split, "start": start, "stop": stop})
                tasks = _collection(page, "tasks", "POST task_range")[: stop - start]
            catalog.update(split=split, num_tasks=total, start=start, limit=limit, tasks=tasks)
            return catalog
        except _Unsupported:
            return {"schema": CATALOG_SCHEMA, "base_url": endpoint.base_url,
                    "environment_name": environment_name, "task_api": "unsupported"}
