"""The optional Task API: 501 means unsupported; pages are bounded; rows stay data."""

import asyncio
import json

import httpx
import pytest

from openenv.client import errors
from openenv.client.tasks import task_catalog

URL = "http://127.0.0.1:8990"
TASKS = [{"split": "train", "index": i, "start_target": [0, i]} for i in range(4)]


def transport(*, supported=True, seen=None, environments=("counter",)):
    def handle(request: httpx.Request) -> httpx.Response:
        path, body = request.url.raw_path.decode(), json.loads(request.content or b"null")
        if seen is not None:
            seen.append((request.method, path, body))
        if path == "/health":
            return httpx.Response(200, json={"status": "healthy"})
        if path == "/list_environments":
            return httpx.Response(200, json=list(environments))
        name, _, route = path.lstrip("/").partition("/")
        if name not in ("counter", "my%2Fenv"):
            return httpx.Response(404, json={"detail": f"unknown environment {name!r}"})
        if not supported:
            return httpx.Response(501, json={"detail": "list_splits is not supported for this environment"})
        if route == "splits":
            return httpx.Response(200, json=[{"name": "train", "type": "train"}, {"name": "test", "type": "test"}])
        if route == "num_tasks":
            return httpx.Response(200, json={"num_tasks": len(TASKS)})
        if route == "task_range":
            return httpx.Response(200, json={"tasks": TASKS[body["start"]:body["stop"]]})
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(handle)


def catalog(**kwargs):
    return asyncio.run(task_catalog(URL, **kwargs))


def test_unsupported_is_conforming():
    result = catalog(transport=transport(supported=False), split="train")
    assert result == {"schema": "kiln.openenv-task-catalog.v1", "base_url": URL, "environment_name": "counter",
                      "task_api": "unsupported"}


def test_splits_and_a_page_of_tasks():
    seen = []
    result = catalog(transport=transport(seen=seen))
    assert result["task_api"] == "supported" and [s["name"] for s in result["splits"]] == ["train", "test"]
    page = catalog(transport=transport(seen=seen), split="train", start=1, limit=2)
    assert page["num_tasks"] == 4 and page["tasks"] == TASKS[1:3] and page["start"] == 1 and page["limit"] == 2
    assert ("POST", "/counter/task_range", {"split": "train", "start": 1, "stop": 3}) in seen
    assert catalog(transport=transport(), split="train", start=10)["tasks"] == []


def test_the_environment_name_is_one_encoded_segment():
    seen = []
    catalog(transport=transport(seen=seen), environment_name="my/env")
    assert ("GET", "/my%2Fenv/splits", None) in seen


def test_selection_and_page_errors():
    with pytest.raises(errors.OpenEnvInvalidTaskSelection):
        catalog(transport=transport(), environment_name="other")
    with pytest.raises(errors.OpenEnvInvalidTaskSelection):
        catalog(transport=transport(environments=("a", "b")))
    for bad in ({"limit": 0}, {"limit": 201}, {"start": -1}):
        with pytest.raises(errors.OpenEnvInvalidTaskPage):
            catalog(transport=transport(), **bad)


def test_an_unknown_split_is_named_before_the_environment_is_asked_for_it():
    """Some environments answer num_tasks for an unknown split with a 500; the split list is known
    by then, so the refusal names the split and the ones that exist."""
    seen = []
    with pytest.raises(errors.OpenEnvInvalidTaskSelection) as caught:
        catalog(transport=transport(seen=seen), split="nope")
    assert "'nope' is not one of the environment's splits (train, test)" in caught.value.message
    assert caught.value.hint == "pick one of: train, test"
    assert not any(path.endswith("/num_tasks") for _, path, _ in seen)
