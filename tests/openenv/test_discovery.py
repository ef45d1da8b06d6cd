"""Discovery: /health then four documents, the identity hashes, and its failures (reference-spec §4.2).

Most tests serve the documents through httpx.MockTransport (no sockets); one reads them from a
real HTTP server (the fake OpenEnv server).
"""

import asyncio
import json

import httpx
import pytest

from openenv.client import errors
from openenv.client.credentials import credential_from_env
from openenv.client.discovery import (
    DiscoveryDocuments,
    discovery_sha256,
    identity_differences,
    inspect,
    inspect_sync,
    schema_sha256,
)
from openenv.client.http import MAX_DISCOVERY_BYTES
from tests.openenv.fake_server import FakeServer, counter_documents

URL = "http://127.0.0.1:8990"
TOKEN = "s3cret-token-value"


def transport(documents=None, *, raw=None, status=None, seen=None, headers=None):
    """A MockTransport serving JSON documents; `raw` overrides bodies, `status` overrides codes."""
    documents = counter_documents() if documents is None else documents
    raw, status, headers = raw or {}, status or {}, headers or {}

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if seen is not None:
            seen.append((request.method, path, request.headers.get("authorization")))
        body = raw.get(path)
        if body is None:
            body = json.dumps(documents[path]).encode() if path in documents else b'{"detail":"Not Found"}'
        code = status.get(path, 200 if path in documents or path in raw else 404)
        return httpx.Response(code, content=body, headers={"content-type": "application/json", **headers.get(path, {})})

    return httpx.MockTransport(handle)


def run_inspect(**kwargs):
    return asyncio.run(inspect(URL, **kwargs))


def test_inspection_reports_the_identity():
    seen = []
    result = run_inspect(transport=transport(seen=seen))
    identity = result.identity
    assert identity["schema"] == "kiln.openenv-identity.v1"
    assert identity["client_profile"] == "openenv-http/1.x"
    assert identity["base_url"] == URL and identity["websocket_url"] == "ws://127.0.0.1:8990/ws"
    assert identity["openapi_version"] == "1.0.0"
    assert identity["environments"] == ["counter"]
    assert identity["metadata"]["name"] == "counter"
    assert identity["authentication"] == "none"
    for key in ("schema_sha256", "action_schema_sha256", "discovery_sha256"):
        assert identity[key].startswith("sha256:") and len(identity[key]) == 71
    assert set(result.schema) == {"action", "observation", "state"}
    assert result.to_json() == {"identity": identity, "schema": result.schema}
    json.dumps(result.to_json())  # plain JSON
    assert seen[0][1] == "/health"
    assert sorted(p for _, p, _ in seen[1:]) == ["/list_environments", "/metadata", "/openapi.json", "/schema"]


def test_hashes_ignore_key_order_and_whitespace():
    documents = counter_documents()
    reordered = {path: (dict(reversed(list(doc.items()))) if isinstance(doc, dict) else doc)
                 for path, doc in documents.items()}
    reordered["/schema"]["action"] = dict(reversed(list(documents["/schema"]["action"].items())))
    raw = {path: json.dumps(doc, indent=7).encode() for path, doc in reordered.items()}
    first = run_inspect(transport=transport(documents))
    second = run_inspect(transport=transport(documents, raw=raw))
    assert first.identity == second.identity
    assert identity_differences(first, second) == []


def test_an_extension_field_changes_the_discovery_digest_but_not_the_schema_digest():
    base = run_inspect(transport=transport())
    extended_metadata = counter_documents()
    extended_metadata["/metadata"]["x-vendor"] = {"tier": 1}
    extended_schema = counter_documents()
    extended_schema["/schema"]["x-extra"] = True
    openapi = counter_documents()
    openapi["/openapi.json"]["paths"] = {"/step": {}}
    for documents in (extended_metadata, extended_schema, openapi):
        other = run_inspect(transport=transport(documents))
        assert other.identity["discovery_sha256"] != base.identity["discovery_sha256"]
        assert other.identity["schema_sha256"] == base.identity["schema_sha256"]
        assert identity_differences(base, other) == ["discovery_sha256"]


def test_a_changed_action_schema_changes_every_schema_digest():
    base = run_inspect(transport=transport())
    documents = counter_documents()
    documents["/schema"]["action"]["properties"]["delta"]["maximum"] = 4
    other = run_inspect(transport=transport(documents))
    assert set(identity_differences(base, other)) == {
        "action_schema_sha256", "discovery_sha256", "schema_sha256", "schema.action"}


def test_digest_functions_directly():
    documents = counter_documents()
    docs = DiscoveryDocuments(documents["/metadata"], documents["/schema"], documents["/list_environments"],
                              documents["/openapi.json"])
    same = DiscoveryDocuments(dict(sorted(documents["/metadata"].items())), documents["/schema"],
                              list(documents["/list_environments"]), documents["/openapi.json"])
    assert discovery_sha256(docs) == discovery_sha256(same)
    assert discovery_sha256(docs) != discovery_sha256(
        DiscoveryDocuments(docs.metadata, docs.schema_document, ["counter", "other"], docs.openapi))
    typed_only = {k: documents["/schema"][k] for k in ("action", "observation", "state")}
    assert schema_sha256(documents["/schema"]) == schema_sha256(typed_only)


@pytest.mark.parametrize("code, expected", [(204, errors.OpenEnvUnhealthy), (404, errors.OpenEnvUnhealthy),
                                            (302, errors.OpenEnvUnhealthy), (503, errors.OpenEnvUnavailable),
                                            (429, errors.OpenEnvUnavailable)])
def test_health_must_be_exactly_200(code, expected):
    seen = []
    with pytest.raises(expected) as info:
        run_inspect(transport=transport(status={"/health": code}, seen=seen))
    assert info.value.http_status == code
    assert [p for _, p, _ in seen] == ["/health"]  # nothing else is read


@pytest.mark.parametrize("code", [401, 403])
def test_a_health_check_that_wants_credentials_says_so(code):
    """401/403 is a credential to give (not retryable, a configuration problem), not an unhealthy server."""
    seen = []
    with pytest.raises(errors.OpenEnvUnauthorized) as info:
        run_inspect(transport=transport(status={"/health": code}, seen=seen))
    error = info.value
    assert error.code == "openenv_unauthorized" and error.http_status == code
    assert "requires credentials" in error.message and "--credential-env VAR" in error.hint
    assert "credential_ids" in error.hint and not error.retryable
    assert error.failure_code == "persisted_contract_invalid" and [p for _, p, _ in seen] == ["/health"]
    credential = credential_from_env(URL, "KILN_TEST_TOKEN", environ={"KILN_TEST_TOKEN": TOKEN})
    with pytest.raises(errors.OpenEnvUnauthorized) as info:
        run_inspect(transport=transport(status={"/health": code}), credential=credential)
    assert "refused the bearer token" in info.value.message and TOKEN not in info.value.message


def test_redirects_are_never_followed():
    with pytest.raises(errors.OpenEnvRedirectRefused):
        run_inspect(transport=transport(status={"/schema": 307},
                                        headers={"/schema": {"location": "http://evil.example/schema"}}))


@pytest.mark.parametrize("path", ["/metadata", "/schema", "/list_environments", "/openapi.json"])
def test_each_document_is_bounded(path):
    big = b'{"pad":"' + b"x" * MAX_DISCOVERY_BYTES + b'"}'
    with pytest.raises(errors.OpenEnvResponseTooLarge):
        run_inspect(transport=transport(raw={path: big}))


def test_a_body_over_the_limit_is_refused_without_a_content_length():
    async def chunks():
        for _ in range(3):
            yield b" " * (MAX_DISCOVERY_BYTES // 2)
        yield b"{}"

    def handle(request):
        if request.url.path == "/openapi.json":
            return httpx.Response(200, content=chunks())
        return httpx.Response(200, json=counter_documents()[request.url.path])

    with pytest.raises(errors.OpenEnvResponseTooLarge):
        run_inspect(transport=httpx.MockTransport(handle))


@pytest.mark.parametrize("path, body", [
    ("/metadata", b"{not json"),
    ("/metadata", b'{"name": "a", "name": "b", "description": "d"}'),
    ("/metadata", b'{"description": "no name"}'),
    ("/metadata", b'{"name": "x", "description": "d", "version": 3}'),
    ("/schema", b'{"action": {}, "observation": {}}'),
    ("/list_environments", b'{"counter": 1}'),
    ("/list_environments", b'["a", 1]'),
    ("/openapi.json", b"[]"),
    ("/openapi.json", b'{"info": {"version": NaN}}'),
    ("/openapi.json", b'{"big": 123456789012345678901234567890}'),
])
def test_invalid_documents_fail_discovery(path, body):
    with pytest.raises(errors.OpenEnvInvalidDocument) as info:
        run_inspect(transport=transport(raw={path: body}))
    assert info.value.code == "openenv_invalid_discovery"


def test_a_document_error_status_fails_discovery():
    with pytest.raises(errors.OpenEnvHttpStatus) as info:
        run_inspect(transport=transport(status={"/list_environments": 404}))
    assert info.value.http_status == 404
    with pytest.raises(errors.OpenEnvUnavailable):
        run_inspect(transport=transport(status={"/metadata": 500}))


def test_an_external_ref_in_the_action_schema_fails_inspection():
    documents = counter_documents()
    documents["/schema"]["action"]["properties"]["delta"] = {"$ref": "http://127.0.0.1:1/delta.json"}
    with pytest.raises(errors.OpenEnvActionSchemaInvalid):
        run_inspect(transport=transport(documents))


def test_an_unreachable_server_is_unavailable():
    with pytest.raises(errors.OpenEnvUnavailable) as info:
        asyncio.run(inspect("http://127.0.0.1:9", connect_timeout=2))
    assert info.value.retryable and info.value.failure_code == "environment_unavailable"


def test_the_credential_goes_on_health_and_every_document():
    seen = []
    credential = credential_from_env(URL, "KILN_TEST_TOKEN", environ={"KILN_TEST_TOKEN": TOKEN})
    result = run_inspect(transport=transport(seen=seen), credential=credential)
    assert len(seen) == 5 and all(auth == f"Bearer {TOKEN}" for _, _, auth in seen)
    assert result.identity["authentication"] == "bearer"
    assert TOKEN not in json.dumps(result.to_json()) and "KILN_TEST_TOKEN" not in json.dumps(result.to_json())
    assert TOKEN not in repr(credential) and TOKEN not in repr(result)


def test_a_response_that_reflects_the_token_is_refused():
    credential = credential_from_env(URL, "V", environ={"V": TOKEN})
    documents = counter_documents()
    documents["/metadata"]["description"] = f"you sent {TOKEN}"
    with pytest.raises(errors.OpenEnvCredentialReflected) as info:
        run_inspect(transport=transport(documents), credential=credential)
    assert TOKEN not in str(info.value) and TOKEN not in json.dumps(info.value.as_dict())


def test_inspect_sync_against_a_real_http_server():
    with FakeServer() as server:
        result = inspect_sync(server.url)
    assert result.identity["metadata"]["name"] == "counter"
    assert result.identity["discovery_sha256"] == run_inspect(transport=transport()).identity["discovery_sha256"]
