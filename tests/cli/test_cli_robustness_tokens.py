"""An API token that cannot go into an HTTP header (non-ASCII, a control character) is one `invalid_token`
line, never a UnicodeEncodeError; a token's name longer than its column (or not text) is refused by the
token service with `invalid_token_name`, so SQLite does not keep what PostgreSQL would refuse."""

from __future__ import annotations

import pytest

from core.accounts.models import ApiToken
from core.accounts.services import token_create, user_create
from core.errors import KilnError
from kiln_project.cli.client import CliError, KilnClient
from tests.cli.recording_server import run_cli


@pytest.mark.parametrize("token", ["caf\u00e9", "kiln_abc\n", "kiln_\x1bx", "kiln_\udcc3"])
def test_a_token_that_cannot_be_a_header_is_refused(monkeypatch, token):
    monkeypatch.setenv("KILN_API_TOKEN", token)
    with pytest.raises(CliError) as caught:
        KilnClient("http://127.0.0.1:1")
    assert caught.value.code == "invalid_token" and "KILN_API_TOKEN" in caught.value.message
    assert token not in caught.value.line()  # a secret is never echoed
    assert "kiln token create USER" in caught.value.hint


def test_the_cli_prints_one_line(monkeypatch, capsys):
    monkeypatch.setenv("KILN_API_TOKEN", "caf\u00e9")
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    code, out, err = run_cli(capsys, "jobs", "list", "--url", "http://127.0.0.1:1")
    assert code == 1 and out == ""
    assert err.startswith("error: invalid_token: ") and len(err.strip().splitlines()) == 1, err


def test_a_token_given_to_the_client_is_checked_too():
    with pytest.raises(CliError, match="invalid_token|not printable ASCII"):
        KilnClient("http://127.0.0.1:1", token="kiln_\x00x")


def test_a_saved_token_file_is_checked_too(monkeypatch, tmp_path):
    from core.artifacts import HomeLayout

    monkeypatch.delenv("KILN_API_TOKEN", raising=False)
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    saved = HomeLayout(tmp_path).cli_token
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text("caf\u00e9\n")
    with pytest.raises(CliError, match="cli-token"):
        KilnClient("http://127.0.0.1:1")


def test_an_ascii_token_is_sent():
    client = KilnClient("http://127.0.0.1:1", token="kiln_Abc-_09")
    assert client._http.headers["authorization"] == "Bearer kiln_Abc-_09"


@pytest.fixture
def alice(db, monkeypatch):
    from kiln_project.cli import accounts_cmd

    monkeypatch.setattr(accounts_cmd, "_setup", lambda: None)
    return user_create(username="alice", password="long-enough-pw")


def test_a_token_name_longer_than_its_column_is_refused(alice, capsys):
    code, out, err = run_cli(capsys, "token", "create", "alice", "--name", "x" * 1000)
    assert code == 1 and out == ""
    assert err.startswith("error: invalid_token_name: ") and "at most 100" in err, err
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("name", [None, 7, "a\x00b", "y" * 101])
def test_the_service_refuses_a_bad_name(alice, name):
    with pytest.raises(KilnError) as caught:
        token_create(username="alice", name=name)
    assert caught.value.code == "invalid_token_name" and caught.value.status == 400
    assert not ApiToken.objects.exists()


def test_a_name_of_exactly_the_limit_is_kept(alice):
    token, _ = token_create(username="alice", name="z" * 100)
    assert ApiToken.objects.get(id=token.id).name == "z" * 100
