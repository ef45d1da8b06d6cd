"""A fake Kiln server for CLI tests: every request a command sends is recorded and answered in process."""

from __future__ import annotations

import httpx

from kiln_project.cli import client
from kiln_project.cli.client import KilnClient
from kiln_project.cli.main import main


class Recorder:
    """A fake server: records every request that reached it and answers with `answer(request)`."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.raw_path.decode()))
        return self.answer(request)


def fake_client(server: Recorder):
    class FakeClient(KilnClient):
        def __init__(self, url=None, token=None, timeout=30.0):
            super().__init__(url or "http://kiln.test", token="unused", timeout=timeout)
            self._http = client._GuardedHttp(base_url=self.url, transport=httpx.MockTransport(server))

    return FakeClient


def serve_commands(monkeypatch, modules, answer) -> Recorder:
    """Point each CLI module's KilnClient at one Recorder answering `answer(request)`."""
    recorder = Recorder(answer)
    for module in modules:
        monkeypatch.setattr(module, "KilnClient", fake_client(recorder))
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    return recorder


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err
