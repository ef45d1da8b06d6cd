"""Shared by the dataset and suite tests: a private KILN_HOME, the API client, corpora and helpers.
(Imported by the test modules; not a conftest, so it shadows nothing of the other eval tests.)"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.training import conftest as training_conftest

api = training_conftest.api  # the fixture, re-exported to the modules that import it


@pytest.fixture
def home(settings, tmp_path):
    """A private KILN_HOME: datasets and suites land under it."""
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def group(i: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": str(2 * i + 1), "reward": 0.0}],
            **extra}


def jsonl(rows, *, blank_after: int | None = None) -> bytes:
    lines = [json.dumps(r) for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    return ("\n".join(lines) + "\n").encode()


def upload(client, name, data: bytes, fmt="grpo_groups", description="", filename="data.jsonl"):
    payload = {"name": name, "format": fmt, "description": description,
               "file": SimpleUploadedFile(filename, data, content_type="application/x-ndjson")}
    return client.post("/v1/eval/datasets/upload", data=payload)


def send(client, method, path, body=None):
    return getattr(client, method)(path, data=json.dumps(body if body is not None else {}),
                                content_type="application/json")


def error(response, status, code):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "hint"}
    assert body["error"]["code"] == code, body
    return body["error"]["message"]


def ok(response):
    assert response.status_code == 200, response.content
    return response.json()
