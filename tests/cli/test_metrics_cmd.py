"""`kiln metrics` prints the server's GET /metrics as it is, one family prefix of it, or JSON samples;
a refusal (no credentials) is the usual one-line error with a non-zero exit."""

from __future__ import annotations

import json

import httpx
import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from core.metrics.services import counter_add
from kiln_project.cli import metrics_cmd
from tests.cli.recording_server import run_cli, serve_commands

pytestmark = pytest.mark.django_db


def _through(client: Client):
    """A fake transport that hands each CLI request to this test's Django."""
    def answer(request: httpx.Request) -> httpx.Response:
        response = client.get(request.url.raw_path.decode())
        return httpx.Response(response.status_code, headers=dict(response.items()), content=response.content)
    return answer


@pytest.fixture
def api():
    user_create(username="alice", password="long-enough-pw")
    return Client(headers={"Authorization": f"Bearer {token_create(username='alice')[1]}"})


def test_kiln_metrics_prints_the_exposition_a_family_or_json(api, monkeypatch, capsys):
    server = serve_commands(monkeypatch, (metrics_cmd,), _through(api))
    counter_add("kiln_openenv_runs_total", 2, status="accepted")
    code, out, _ = run_cli(capsys, "metrics")
    assert code == 0 and out == api.get("/metrics").content.decode()
    assert server.requests == [("GET", "/metrics")]

    code, out, _ = run_cli(capsys, "metrics", "--family", "kiln_openenv_runs_total")
    assert code == 0 and out.splitlines() == [
        "# HELP kiln_openenv_runs_total OpenEnv run submissions: new runs accepted, and exact retries answered "
        "with the run their idempotency key names.",
        "# TYPE kiln_openenv_runs_total counter",
        'kiln_openenv_runs_total{status="accepted"} 2',
        'kiln_openenv_runs_total{status="idempotent_replay"} 0']

    code, out, _ = run_cli(capsys, "metrics", "--family", "kiln_openenv_runs_total", "--json")
    assert code == 0 and json.loads(out) == [
        {"name": "kiln_openenv_runs_total", "labels": {"status": "accepted"}, "value": 2.0},
        {"name": "kiln_openenv_runs_total", "labels": {"status": "idempotent_replay"}, "value": 0.0}]

    # A misspelt family printed nothing and exited 0 (QA): refused, naming some that exist.
    code, out, err = run_cli(capsys, "metrics", "--family", "kiln_nope")
    assert code == 1 and out == ""
    assert err.startswith("error: metric_family_not_found: no metric family starts with 'kiln_nope' (hint: the "
                          "families: ") and "kiln_" in err.split("the families: ")[1]


def test_kiln_metrics_without_credentials_is_one_line_and_fails(monkeypatch, capsys):
    serve_commands(monkeypatch, (metrics_cmd,), _through(Client()))
    code, out, err = run_cli(capsys, "metrics")
    assert code != 0 and out == ""
    assert err.strip().splitlines() == [err.strip()] and err.startswith("error: unauthorized: authentication required")


def test_a_server_that_is_not_kiln_is_named(monkeypatch, capsys):
    serve_commands(monkeypatch, (metrics_cmd,), lambda request: httpx.Response(200, html="<html>hi</html>"))
    code, _, err = run_cli(capsys, "metrics")
    assert code != 0 and "not_a_kiln_server" in err
