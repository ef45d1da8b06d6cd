"""POST /v1/openenv/inspect and /v1/openenv/tasks against the fake servers (reference-spec §1.6).

Loopback-only unless `[openenv] allow_remote_environments`; client errors keep their stable codes
in the error envelope (400 for a bad request, 502 for an environment that failed); both routes are
in the OpenAPI document.
"""

import dataclasses
import json

import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from openenv import api as openenv_api
from openenv.client.tasks import task_catalog
from openenv.client.urls import normalize_url
from tests.openenv.fake_server import FakeServer, counter_documents
from tests.openenv.test_tasks import TASKS
from tests.openenv.test_tasks import transport as task_transport

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]


@pytest.fixture
def api():
    user_create(username="operator", password="long-enough-pw")
    return Client(headers={"Authorization": f"Bearer {token_create(username='operator')[1]}"},
                  raise_request_exception=False)


@pytest.fixture
def allow_remote(settings):
    settings.KILN = dataclasses.replace(settings.KILN, openenv_allow_remote_environments=True)


def post(api, route, body):
    return api.post(f"/v1/openenv/{route}", data=json.dumps(body), content_type="application/json")


def error_of(response):
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "hint"}, body
    return body["error"]


def test_inspect_returns_the_identity_like_the_cli(api):
    with FakeServer() as server:
        response = post(api, "inspect", {"url": server.url})
    assert response.status_code == 200, response.content
    report = response.json()
    assert report["schema"] == "kiln.openenv-inspection.v1"
    [environment] = report["environments"]
    identity = environment["identity"]
    assert identity["base_url"] == server.url and identity["authentication"] == "none"
    assert identity["discovery_sha256"].startswith("sha256:")
    assert environment["schema"]["action"]["title"] == "CounterAction"


def test_inspect_takes_several_urls_in_order(api):
    documents = counter_documents()
    documents["/metadata"]["name"] = "second"
    with FakeServer() as a, FakeServer(documents=documents) as b:
        response = post(api, "inspect", {"environments": [a.url, f"localhost:{b.port}"]})
    assert response.status_code == 200, response.content
    environments = response.json()["environments"]
    assert [e["identity"]["metadata"]["name"] for e in environments] == ["counter", "second"]
    assert environments[1]["identity"]["base_url"] == f"http://localhost:{b.port}"


@pytest.mark.parametrize("url", ["http://10.0.0.1:8990", "https://example.com", "http://0.0.0.0:8990",
                                 "http://[fe80::1]:8990", "http://app.localhost.example:80"])
def test_a_remote_environment_is_refused_before_any_connection(api, url):
    for route in ("inspect", "tasks"):
        response = post(api, route, {"url": url})
        assert response.status_code == 403, response.content
        error = error_of(response)
        assert error["code"] == "openenv_remote_environment_refused"
        assert "[openenv] allow_remote_environments" in error["message"]
        assert "KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS" in error["hint"]


def test_one_remote_url_among_loopback_ones_refuses_the_request(api):
    with FakeServer() as server:
        response = post(api, "inspect", {"environment_urls": [server.url, "http://192.0.2.7:80"]})
        assert response.status_code == 403
        assert server.request_headers == []  # nothing was contacted, not even the loopback one


def test_the_setting_allows_remote_environments(api, allow_remote):
    with FakeServer() as server:  # 0.0.0.0 is not loopback, yet reaches this machine's listeners
        response = post(api, "inspect", {"url": f"http://0.0.0.0:{server.port}"})
    assert response.status_code == 200, response.content


def test_loopback_hosts():
    for url in ("http://127.0.0.1:1", "http://127.9.8.7", "http://[::1]:8990", "localhost:8990", "http://LOCALHOST"):
        assert openenv_api.is_loopback_only(normalize_url(url)), url
    for url in ("http://0.0.0.0", "http://10.1.1.1", "http://[::ffff:10.0.0.1]", "http://example.com",
                "http://127.0.0.1.nip.io", "http://localhost.example.com"):
        assert not openenv_api.is_loopback_only(normalize_url(url)), url


def test_the_setting_is_read_from_the_environment_and_the_file(tmp_path):
    from kiln_project.config import ConfigError, load_config

    base = {"KILN_HOME": str(tmp_path)}
    assert load_config(base).openenv_allow_remote_environments is False
    assert load_config({**base, "KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS": "true"}).openenv_allow_remote_environments
    toml = tmp_path / "kiln.toml"
    toml.write_text("[openenv]\nallow_remote_environments = true\n")
    assert load_config({**base, "KILN_CONFIG": str(toml)}).openenv_allow_remote_environments is True
    assert load_config({**base, "KILN_CONFIG": str(toml),
                        "KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS": "0"}).openenv_allow_remote_environments is False
    with pytest.raises(ConfigError):
        load_config({**base, "KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS": "maybe"})


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"url": "ftp://127.0.0.1"}, 400, "openenv_invalid_url"),
    ({"url": "http://user:pw@127.0.0.1:1"}, 400, "openenv_invalid_url"),
    ({}, 400, "openenv_invalid_request"),
    ({"url": "http://127.0.0.1:1", "environment_urls": ["http://127.0.0.1:1"]}, 400, "openenv_invalid_request"),
    ({"url": "http://127.0.0.1:1", "extra": 1}, 400, "openenv_invalid_request"),
    ({"environment_urls": []}, 400, "openenv_invalid_request"),
    ({"environment_urls": ["http://127.0.0.1:1"], "credential_ids": [None, None]}, 400, "openenv_invalid_request"),
    ({"url": 5}, 400, "openenv_invalid_request"),
    ({"url": "http://127.0.0.1:1", "credential_id": "prod"}, 400, "openenv_credential_not_found"),
])
def test_bad_requests_are_400_with_stable_codes(api, body, status, code):
    response = post(api, "inspect", body)
    assert response.status_code == status, response.content
    assert error_of(response)["code"] == code


def test_an_environment_that_fails_is_502_inspection_failed_naming_the_client_code(api):
    with FakeServer(health_status=404) as server:
        response = post(api, "inspect", {"url": server.url})
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "openenv_inspection_failed" and error["hint"]
    assert error["message"].startswith("openenv_unhealthy: ")
    with FakeServer(health_status=401) as server:  # a server that wants a token: the route's 502, what to give
        response = post(api, "inspect", {"url": server.url})
    assert response.status_code == 502 and error_of(response)["code"] == "openenv_inspection_failed"
    assert error_of(response)["message"].startswith("openenv_unauthorized: ")
    assert "credential_ids" in error_of(response)["hint"]
    documents = counter_documents()
    documents["/schema"] = ["not", "an", "object"]
    with FakeServer(documents=documents) as server:
        response = post(api, "inspect", {"url": server.url})
    assert response.status_code == 502 and error_of(response)["code"] == "openenv_inspection_failed"
    assert error_of(response)["message"].startswith("openenv_invalid_discovery: ")


def test_an_unreachable_environment_is_502_unavailable(api):
    with FakeServer() as server:
        port = server.port
    response = post(api, "inspect", {"url": f"http://127.0.0.1:{port}"})
    assert response.status_code == 502 and error_of(response)["code"] == "openenv_inspection_failed"
    assert error_of(response)["message"].startswith("openenv_unavailable: ")


def test_tasks_lists_splits_from_a_real_socket(api):
    documents = counter_documents()
    documents["/counter/splits"] = [{"name": "train", "type": "train"}]
    with FakeServer(documents=documents) as server:
        response = post(api, "tasks", {"url": server.url})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["schema"] == "kiln.openenv-task-catalog.v1"
    [entry] = body["catalogs"]
    assert entry["base_url"] == server.url
    assert entry["catalog"]["task_api"] == "supported" and entry["catalog"]["splits"][0]["name"] == "train"


def test_tasks_pages_through_the_task_api(api, monkeypatch):
    seen = []

    async def with_transport(url, **kwargs):
        return await task_catalog(url, transport=task_transport(seen=seen), **kwargs)

    monkeypatch.setattr(openenv_api, "task_catalog", with_transport)
    response = post(api, "tasks", {"url": "http://127.0.0.1:8990", "split": "train", "start": 1, "limit": 2})
    assert response.status_code == 200, response.content
    catalog = response.json()["catalogs"][0]["catalog"]
    assert catalog["tasks"] == TASKS[1:3] and catalog["num_tasks"] == 4
    assert ("POST", "/counter/task_range", {"split": "train", "start": 1, "stop": 3}) in seen


@pytest.mark.parametrize(("body", "code"), [
    ({"limit": 0}, "openenv_invalid_task_page"),
    ({"limit": 201}, "openenv_invalid_task_page"),
    ({"start": -1}, "openenv_invalid_task_page"),
    ({"start": "1"}, "openenv_invalid_task_page"),
    ({"environment_name": ""}, "openenv_invalid_request"),
])
def test_task_page_errors_are_400(api, body, code):
    response = post(api, "tasks", {"url": "http://127.0.0.1:1", **body})
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == code


def test_an_environment_without_the_task_api_routes_is_a_selection_error(api):
    with FakeServer() as server:  # the fake answers 404 for /{env}/splits
        response = post(api, "tasks", {"url": server.url})
    assert response.status_code == 400 and error_of(response)["code"] == "openenv_invalid_task_selection"
    with FakeServer(health_status=503) as server:
        response = post(api, "tasks", {"url": server.url})
    assert response.status_code == 502 and error_of(response)["code"] == "openenv_task_catalog_failed"


def test_the_routes_need_an_authenticated_user_with_submit_job():
    assert Client().post("/v1/openenv/inspect", data="{}", content_type="application/json").status_code == 401
    user_create(username="viewer", password="long-enough-pw", can_submit=False)
    viewer = Client(headers={"Authorization": f"Bearer {token_create(username='viewer')[1]}"})
    response = post(viewer, "inspect", {"url": "http://127.0.0.1:1"})
    assert response.status_code == 403 and error_of(response)["code"] == "permission_denied"


def test_openapi_documents_both_routes(api):
    doc = api.get("/v1/openapi.json").json()
    for route, request_title in (("inspect", "OpenEnvInspectRequest"), ("tasks", "OpenEnvTasksRequest")):
        operation = doc["paths"][f"/v1/openenv/{route}"]["post"]
        assert "requestBody" in operation and "200" in operation["responses"]
        assert "openenv" in operation["tags"]
        schema = doc["components"]["schemas"][request_title]
        assert {"url", "credential_id", "environment_urls", "credential_ids"} <= set(schema["properties"])
    tasks = doc["components"]["schemas"]["OpenEnvTasksRequest"]["properties"]
    assert tasks["limit"] == {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}
