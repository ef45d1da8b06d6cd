"""The CLI finds the local server's token by itself (KILN_HOME/cli-token, written by ./scripts/serve)
and never sends it to another host; KILN_API_TOKEN still wins."""

from __future__ import annotations

from kiln_project.cli.client import KilnClient


def _auth(client: KilnClient) -> str | None:
    return client._http.headers.get("Authorization")


def test_a_loopback_server_gets_the_saved_token(tmp_path, monkeypatch):
    (tmp_path / "cli-token").write_text("kiln_saved_token\n")
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    monkeypatch.delenv("KILN_API_TOKEN", raising=False)
    assert _auth(KilnClient("http://127.0.0.1:8420")) == "Bearer kiln_saved_token"
    assert _auth(KilnClient("http://localhost:9000")) == "Bearer kiln_saved_token"
    assert _auth(KilnClient("https://kiln.example.com")) is None  # never leaves the machine
    monkeypatch.setenv("KILN_API_TOKEN", "kiln_env_token")
    assert _auth(KilnClient("http://127.0.0.1:8420")) == "Bearer kiln_env_token"


def test_no_saved_token_means_no_header(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    monkeypatch.delenv("KILN_API_TOKEN", raising=False)
    assert _auth(KilnClient("http://127.0.0.1:8420")) is None
