"""URL normalisation (reference-spec §4.1)."""

import pytest

from openenv.client.errors import OpenEnvUrlInvalid
from openenv.client.urls import normalize_url


@pytest.mark.parametrize("raw, base, ws", [
    ("127.0.0.1:8990", "http://127.0.0.1:8990", "ws://127.0.0.1:8990/ws"),
    ("  http://127.0.0.1:8990/  ", "http://127.0.0.1:8990", "ws://127.0.0.1:8990/ws"),
    ("HTTP://LocalHost:8000///", "http://localhost:8000", "ws://localhost:8000/ws"),
    ("https://env.example.com", "https://env.example.com", "wss://env.example.com/ws"),
    ("https://env.example.com:443/", "https://env.example.com", "wss://env.example.com/ws"),
    ("http://env.example.com:80", "http://env.example.com", "ws://env.example.com/ws"),
    ("https://env.example.com:8443/prefix/env1/", "https://env.example.com:8443/prefix/env1",
     "wss://env.example.com:8443/prefix/env1/ws"),
    ("http://[::1]:9000", "http://[::1]:9000", "ws://[::1]:9000/ws"),
])
def test_normalises(raw, base, ws):
    endpoint = normalize_url(raw)
    assert endpoint.base_url == base
    assert endpoint.websocket_url == ws
    assert endpoint.url("health") == base + "/health"


def test_origin_and_loopback():
    endpoint = normalize_url("https://Env.Example.com:8443/a/b")
    assert endpoint.origin == "https://env.example.com:8443"
    assert not endpoint.is_loopback
    assert normalize_url("localhost:1").is_loopback
    assert normalize_url("http://127.0.0.2:1").is_loopback
    assert normalize_url("http://[::1]:1").is_loopback


def test_task_route_encodes_the_environment_name_as_one_segment():
    endpoint = normalize_url("http://127.0.0.1:1")
    assert endpoint.task_url("a/b c", "splits") == "http://127.0.0.1:1/a%2Fb%20c/splits"


@pytest.mark.parametrize("raw", [
    "", "   ", "ftp://host:1", "ws://127.0.0.1:8000", "file:///etc/passwd",
    "http://user:pw@host:1", "http://user@host", "http://host:1/?x=1", "http://host:1?", "http://host:1/#frag",
    "http://host:99999", "http://host:0", "http://", "http://ho st:1", "http://host:1/a\\b", "http://host:abc",
    "http://host:1/\x00",
])
def test_refuses(raw):
    with pytest.raises(OpenEnvUrlInvalid) as info:
        normalize_url(raw)
    assert info.value.code == "openenv_invalid_url"
    assert info.value.failure_code == "persisted_contract_invalid"
