"""Query and echo guards: an unknown job kind is refused like an unknown state (it listed nothing, as if
no job of it ran), and `kiln jobs list --kind` prints that refusal; a validation message keeps the
field's name on routes with their own code (it said `request: ...`); an error quotes a megabyte
adapter name bounded."""

from __future__ import annotations

import json

import httpx
import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from core.jobs.kinds import registered_kinds
from kiln_project.cli import jobs_cmd
from tests.cli.recording_server import run_cli, serve_commands

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    user_create(username="alice", password="long-enough-pw")
    return Client(headers={"Authorization": f"Bearer {token_create(username='alice')[1]}"},
                  raise_request_exception=False)


def refused(response, status, code) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["hint"], error
    return error


def test_jobs_list_refuses_an_unknown_kind_and_names_the_kinds(api):
    error = refused(api.get("/v1/jobs?kind=abc"), 400, "invalid_kind")
    assert error["message"] == f"kind must be one of {', '.join(k.name for k in registered_kinds())}"
    assert "training.grpo" in error["message"]
    assert api.get("/v1/jobs?kind=training.grpo").json() == []  # a known kind with no jobs is still a list


def test_cli_jobs_list_prints_the_unknown_kind_refusal(api, monkeypatch, capsys):
    def through_django(request: httpx.Request) -> httpx.Response:
        answer = api.get(request.url.raw_path.decode())
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"content-type": answer["Content-Type"]})

    serve_commands(monkeypatch, (jobs_cmd,), through_django)
    code, out, err = run_cli(capsys, "jobs", "list", "--kind", "abc")
    assert (code, out) == (1, "")
    assert err.strip().splitlines()[-1].startswith("error: invalid_kind: kind must be one of adapter.activate, ")


def test_a_mapped_routes_validation_message_keeps_the_field_name(api):
    job = "3f1f8c5e-0000-4000-8000-000000000002"
    error = refused(api.get(f"/v1/eval/jobs/{job}?examples=maybe"), 400, "eval_invalid_request")
    assert error["message"].startswith("examples: Input should be a valid boolean"), error


def test_validation_messages_name_the_field_as_a_json_path(api):
    error = refused(api.get("/v1/jobs?limit=x"), 422, "validation_error")  # not `query.limit`
    assert error["message"].startswith("limit: Input should be a valid integer"), error
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}
    error = refused(api.post("/v1/chat/completions", data=json.dumps(chat), content_type="application/json"),
                    422, "validation_error")
    assert error["message"].startswith("messages[1].role: "), error  # not `messages.1.role`


def test_a_megabyte_adapter_name_is_quoted_bounded(api):
    name = "a" * 1_000_000
    body = {"messages": [{"role": "user", "content": "hi"}], "adapter": name}
    error = refused(api.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json"),
                    404, "adapter_not_found")
    assert error["message"] == f"no published adapter is named {'a' * 80 + '…'!r}"


def test_an_error_message_never_repeats_megabytes_the_client_sent(api):
    """POST /v1/promotions with a 1 MB candidate answered 404 with the whole name in its message."""
    response = api.post("/v1/promotions", data={"candidate": "x" * 1_000_000, "reason": "r"},
                        content_type="application/json")
    assert response.status_code in (400, 404, 422)
    assert len(response.content) < 5000
    assert "more characters)" in response.json()["error"]["message"]
