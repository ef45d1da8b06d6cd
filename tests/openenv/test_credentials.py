"""Credentials by exact origin (reference-spec §4.13): never shown, never sent elsewhere."""

import pytest

from openenv.client.credentials import (
    authentication,
    credential_for_origin,
    credential_from_env,
    credentials_for_urls,
)
from openenv.client.errors import OpenEnvCredentialInvalid
from openenv.client.urls import normalize_url

ENV = {"TOKEN_A": "tok-a", "TOKEN_B": "tok-b", "EMPTY": "", "BAD": "has space"}


def test_a_credential_is_bound_to_its_exact_origin():
    credential = credential_from_env("http://127.0.0.1:8990/", "TOKEN_A", environ=ENV)
    assert credential.origin == "http://127.0.0.1:8990"
    assert credential.headers_for(normalize_url("127.0.0.1:8990")) == {"Authorization": "Bearer tok-a"}
    for other in ("http://127.0.0.1:8991", "https://127.0.0.1:8990", "http://localhost:8990"):
        with pytest.raises(OpenEnvCredentialInvalid):
            credential.headers_for(normalize_url(other))


def test_the_token_is_never_shown():
    credential = credential_from_env("https://env.example.com", "TOKEN_A", environ=ENV)
    for text in (repr(credential), str(credential), f"{credential}", repr([credential])):
        assert "tok-a" not in text and "TOKEN_A" not in text
    assert authentication(credential) == "bearer" and authentication(None) == "none"
    assert credential.reflected_in(b"xx tok-a yy") and not credential.reflected_in("nothing")


def test_aligned_slots_and_public_dash():
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    slots = credentials_for_urls(urls, ["TOKEN_A", "-", "TOKEN_B"], environ=ENV)
    assert slots[0].origin == "http://127.0.0.1:1" and slots[1] is None and slots[2].origin == "http://127.0.0.1:3"
    assert credentials_for_urls(urls, [], environ=ENV) == [None, None, None]
    with pytest.raises(OpenEnvCredentialInvalid):
        credentials_for_urls(urls, ["TOKEN_A"], environ=ENV)


@pytest.mark.parametrize("variable", ["MISSING", "EMPTY", "BAD", "not a name", "1X"])
def test_unusable_variables(variable):
    with pytest.raises(OpenEnvCredentialInvalid) as info:
        credential_from_env("http://127.0.0.1:1", variable, environ=ENV)
    assert "tok-" not in info.value.message and "has space" not in info.value.message


def test_a_token_goes_over_https_or_to_loopback_only():
    with pytest.raises(OpenEnvCredentialInvalid):
        credential_from_env("http://env.example.com", "TOKEN_A", environ=ENV)
    assert credential_from_env("http://localhost:9", "TOKEN_A", environ=ENV)


def test_server_configured_origin_must_match_exactly():
    assert credential_for_origin("https://env.example.com/x", origin="https://env.example.com:443",
                                 bearer_token_env="TOKEN_A", environ=ENV).origin == "https://env.example.com"
    with pytest.raises(OpenEnvCredentialInvalid):
        credential_for_origin("https://env.example.com", origin="https://other.example.com",
                              bearer_token_env="TOKEN_A", environ=ENV)
    with pytest.raises(OpenEnvCredentialInvalid):
        credential_for_origin("https://env.example.com", origin="https://env.example.com/path",
                              bearer_token_env="TOKEN_A", environ=ENV)
