"""Fixtures for persisted OpenEnv runs: a throw-away KILN_HOME, an API client with a token, the
`[openenv]` bounds, a real openenv==0.10.0 server (tests/openenv/real_server.py; module scope) and
the deterministic fake policy (tests/openenv/collector_fakes.py) in place of the served model.
Jobs run in process (`run_queued_jobs("control")`)."""

from __future__ import annotations

import json
import types
from dataclasses import replace

import httpx
import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from kiln_project.cli import client as client_module
from kiln_project.cli.main import main
from tests.openenv.collector_fakes import FakeCounterPolicy
from tests.openenv.real_server import RealServer, openenv_python


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


@pytest.fixture
def bounds(settings):
    def set_bounds(**values):
        settings.KILN = replace(settings.KILN, **{f"openenv_{k}": v for k, v in values.items()})
    return set_bounds


@pytest.fixture
def api(db):
    user_create(username="operator", password="long-enough-pw")
    return Client(headers={"Authorization": f"Bearer {token_create(username='operator')[1]}"},
                  raise_request_exception=False)


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    server = RealServer(openenv_python(), tmp_path_factory.mktemp("openenv-runs"), max_sessions=8)
    with server:
        yield server


class PolicyFactory:
    """Stands in for openenv.runs.jobs.make_policy; `on_start(run)` runs in the job's thread."""

    def __init__(self, policy_type=FakeCounterPolicy, on_start=None):
        self.policy_type, self.on_start = policy_type, on_start
        self.started: list[str] = []
        self.policies = {}

    def __call__(self, run, ctx):
        self.started.append(str(run.id))
        if self.on_start is not None:
            self.on_start(run)
        policy = self.policies[str(run.id)] = self.policy_type()
        return policy


@pytest.fixture
def policies(monkeypatch):
    factory = PolicyFactory()
    monkeypatch.setattr("openenv.runs.jobs.make_policy", factory)
    return factory


def post_run(api, body):
    return api.post("/v1/openenv/runs", data=json.dumps(body), content_type="application/json")


def rollout_body(url, **overrides):
    body = {"kind": "rollout", "environment_urls": [url], "groups": 2, "group_size": 2, "max_steps": 4,
            "concurrency": 2, "seed_start": 100, "capacity_wait_seconds": 5, "reset_options": {"target": 4}}
    body.update(overrides)
    return body


def metric(api, name, **labels) -> float:
    """One series of GET /metrics as Prometheus's own parser reads it (counters by their `_total` name)."""
    from tests.support.metrics import sample

    response = api.get("/metrics")
    assert response.status_code == 200, response.content
    value = sample(response.content.decode(), name, **labels)
    assert value is not None, f"no series {name}{labels} in GET /metrics"
    return value


def error_of(response, status, code):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "hint"}, body
    assert body["error"]["code"] == code, body
    return body["error"]


def cli_through(api, monkeypatch, after_post):
    """`run(*argv)`: `kiln openenv ARGV --url http://kiln.test` (main) with KilnClient talking to this test's
    Django through `api`: an httpx transport hands each request to the test client, and calls
    `after_post(request)` once a POST is answered (the tests run the queued jobs there)."""

    def handle(request: httpx.Request) -> httpx.Response:
        response = api.generic(request.method, request.url.raw_path.decode(), data=request.content,
                               content_type=request.headers.get("content-type", "application/json"))
        if request.method == "POST":
            after_post(request)
        content = b"".join(response.streaming_content) if response.streaming else response.content
        return httpx.Response(response.status_code, headers=dict(response.items()), content=content)

    def make_client(*args, **kwargs):
        return httpx.Client(*args, transport=httpx.MockTransport(handle), **kwargs)

    # the names KilnClient uses from httpx (URL, InvalidURL: it checks --url before any request), Client faked
    monkeypatch.setattr(client_module, "httpx", types.SimpleNamespace(Client=make_client, URL=httpx.URL,
                                                                      InvalidURL=httpx.InvalidURL,
                                                                      TransportError=httpx.TransportError))
    guarded = getattr(client_module, "_GuardedHttp", None)
    if guarded is not None:  # KilnClient's own httpx.Client subclass (it checks every path): the same transport
        monkeypatch.setattr(client_module, "_GuardedHttp",
                            lambda *args, **kwargs: guarded(*args, transport=httpx.MockTransport(handle), **kwargs))
    monkeypatch.setenv("KILN_API_TOKEN", "unused-the-test-client-authenticates")
    return lambda *argv: main(["openenv", *argv, "--url", "http://kiln.test"])
