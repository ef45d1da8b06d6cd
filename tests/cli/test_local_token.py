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


def _scripted(responses):
    import httpx

    calls = []

    def handler(request):
        calls.append(request.url.path)
        status, body = responses[min(len(calls), len(responses)) - 1]
        return httpx.Response(status, json=body)

    return calls, httpx.Client(base_url="http://127.0.0.1:8420", transport=httpx.MockTransport(handler))


LOADING = (503, {"error": {"code": "model_loading", "message": "the GPU worker is still loading the model",
                           "hint": ""}})


def test_a_client_waits_for_the_model_with_one_progress_line(monkeypatch, capsys):
    from kiln_project.cli import client as client_module

    monkeypatch.setattr(client_module, "READY_POLL_SECONDS", 0.01)
    monkeypatch.setenv("KILN_WAIT_READY_SECONDS", "5")
    kiln = KilnClient("http://127.0.0.1:8420", token="t")
    calls, kiln._http = _scripted([LOADING, LOADING, (200, {"ok": True})])
    assert kiln.get("/v1/models") == {"ok": True} and len(calls) == 3
    err = capsys.readouterr().err
    assert err.count("waiting for the model to load") == 1 and "the model is ready" in err


def test_the_wait_is_bounded_and_other_errors_are_not_retried(monkeypatch):
    import pytest

    from kiln_project.cli import client as client_module
    from kiln_project.cli.client import CliError

    monkeypatch.setattr(client_module, "READY_POLL_SECONDS", 0.01)
    monkeypatch.setenv("KILN_WAIT_READY_SECONDS", "0")
    kiln = KilnClient("http://127.0.0.1:8420", token="t")
    calls, kiln._http = _scripted([LOADING])
    with pytest.raises(CliError) as caught:
        kiln.get("/v1/models")
    assert caught.value.code == "model_loading" and len(calls) == 1
    monkeypatch.setenv("KILN_WAIT_READY_SECONDS", "5")
    calls, kiln._http = _scripted([(503, {"error": {"code": "inference_unavailable", "message": "no worker"}})])
    with pytest.raises(CliError) as caught:
        kiln.get("/v1/models")
    assert caught.value.code == "inference_unavailable" and len(calls) == 1
