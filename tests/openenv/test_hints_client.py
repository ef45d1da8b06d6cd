"""The client's hints point at the real mistake: the WebSocket URL given as the base URL, and https:// against
a plain-HTTP environment (a failed TLS handshake), instead of "unhealthy" or "check that it is running"."""

import ssl

import httpx
import pytest

from kiln_project.cli.main import main
from openenv.client.discovery import inspect_sync
from openenv.client.errors import OpenEnvUnavailable, OpenEnvUrlInvalid
from openenv.client.http import transport_error
from openenv.client.session import _upgrade_error
from openenv.client.urls import normalize_url
from openenv.runs.request import RunRequestError, normalize
from tests.openenv.fake_server import FakeServer

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("raw, base", [
    ("http://127.0.0.1:8742/ws", "http://127.0.0.1:8742"),
    ("http://127.0.0.1:8742/ws/", "http://127.0.0.1:8742"),
    ("https://env.example.com/prefix/env1/ws", "https://env.example.com/prefix/env1"),
    ("127.0.0.1:8742/ws", "http://127.0.0.1:8742"),
    ("ws://127.0.0.1:8742/ws", "http://127.0.0.1:8742"),  # the line `kiln openenv inspect` prints
    ("wss://env.example.com/ws", "https://env.example.com"),
    ("ws://127.0.0.1:8742", "http://127.0.0.1:8742"),
])
def test_the_websocket_url_is_refused_naming_the_base_url(raw, base):
    with pytest.raises(OpenEnvUrlInvalid) as info:
        normalize_url(raw)
    assert info.value.code == "openenv_invalid_url"
    assert "WebSocket" in info.value.message
    assert f"give the base URL {base} " in info.value.hint


@pytest.mark.parametrize("raw", ["http://127.0.0.1:8742/news", "http://127.0.0.1:8742/ws-env",
                                 "http://127.0.0.1:8742/ws/env"])
def test_paths_that_only_contain_ws_are_base_urls(raw):
    assert normalize_url(raw).base_url == raw


def test_a_run_request_with_the_websocket_url_is_refused_at_validation():
    with pytest.raises(RunRequestError) as info:
        normalize({"kind": "rollout", "environment_urls": ["http://127.0.0.1:8742/ws"]})  # POST /v1/openenv/runs
    assert "give the base URL http://127.0.0.1:8742 " in info.value.hint and "/ws" in info.value.message


def test_the_inspect_cli_names_the_base_url_before_any_request(capsys):
    with FakeServer() as server:
        assert main(["openenv", "inspect", "--environment", f"{server.url}/ws"]) == 1
        assert server.request_headers == []
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: openenv_invalid_url: ") and f"give the base URL {server.url} " in err
    assert "GET /health" not in err


def _connect_error(ssl_error: ssl.SSLError) -> httpx.ConnectError:
    """httpx's ConnectError as it is raised: the ssl error is its cause."""
    try:
        try:
            raise ssl_error
        except ssl.SSLError as exc:
            raise httpx.ConnectError(str(exc)) from exc
    except httpx.ConnectError as outer:
        return outer


def test_a_tls_handshake_failure_says_the_server_may_speak_plain_http():
    exc = _connect_error(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"))
    error = transport_error("GET /health", exc, "https://127.0.0.1:1/health")
    assert isinstance(error, OpenEnvUnavailable)
    assert error.message.startswith("GET /health failed: TLS handshake failed")
    assert "plain HTTP" in error.hint and "http://" in error.hint


def test_a_certificate_failure_names_the_certificate_not_plain_http():
    exc = _connect_error(ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed"))
    error = transport_error("GET /health", exc, "https://127.0.0.1:1/health")
    assert "certificate" in error.message and "certificate" in error.hint and "plain HTTP" not in error.hint


def test_other_transport_failures_keep_the_reachability_hint():
    error = transport_error("GET /health", httpx.ConnectError("refused"), "http://127.0.0.1:1/health")
    assert error.message == "GET /health failed: ConnectError"
    assert error.hint == OpenEnvUnavailable.default_hint


def test_a_tls_failure_on_the_websocket_says_so_too():
    error = _upgrade_error(ssl.SSLError(1, "wrong version number"), "wss://127.0.0.1:1/ws")
    assert "TLS handshake failed" in error.message and "plain HTTP" in error.hint


def test_https_against_a_plain_http_server_says_use_http():
    with FakeServer() as server:
        with pytest.raises(OpenEnvUnavailable) as info:
            inspect_sync(server.url.replace("http://", "https://"), connect_timeout=5)
    assert "TLS handshake failed" in info.value.message
    assert "give the URL with http:// instead of https://" in info.value.hint
