"""`kiln adapters list|show|download|upload|load|unload|delete` against the real API in process (the
CLI's HTTP client is routed into Django's test client), text and --json output, one-line errors."""

from __future__ import annotations

import json

import httpx
import pytest

from kiln_project.cli import adapters_cmd, adapters_verify_cmd
from kiln_project.cli import main as cli_main
from kiln_project.cli.client import KilnClient
from tests.adapters.support import publish

pytestmark = pytest.mark.django_db


@pytest.fixture
def kiln(api, monkeypatch, capsys):
    return in_process_cli(api, monkeypatch, capsys)


def in_process_cli(api, monkeypatch, capsys):
    """`kiln ...` as a function returning (exit code, stdout, stderr), its HTTP routed into `api`."""

    def handler(request: httpx.Request) -> httpx.Response:
        response = api.generic(request.method, request.url.raw_path.decode(), data=request.read(),
                               content_type=request.headers.get("content-type", "application/octet-stream"))
        content = b"".join(response.streaming_content) if response.streaming else response.content
        headers = {k.lower(): v for k, v in response.items()}
        return httpx.Response(response.status_code, content=content, headers=headers)

    class InProcessClient(KilnClient):
        def __init__(self, url=None, token=None, timeout=30.0):
            super().__init__(url, token="unused", timeout=timeout)
            self._http = httpx.Client(base_url=self.url, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(adapters_cmd, "KilnClient", InProcessClient)
    monkeypatch.setattr(adapters_verify_cmd, "KilnClient", InProcessClient)

    def run(*argv):
        code = cli_main.main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_list_show_load_unload_download_upload_delete(kiln, home, peft_adapter, tmp_path):
    original = publish(home, peft_adapter, "math-r001")
    code, out, _ = kiln("adapters", "list")
    assert code == 0 and "math-r001" in out and "available" in out and original.content_sha256[:19] in out
    code, out, _ = kiln("adapters", "load", "math-r001", "--reason", "ship it")
    assert code == 0 and out.strip() == "math-r001: active (served by default), serving canary passed"
    code, out, _ = kiln("adapters", "show", "math-r001")
    assert code == 0 and "adapter_model.safetensors" in out and "available -> active  trainer: ship it" in out
    code, out, _ = kiln("adapters", "show", "math-r001", "--json")
    assert code == 0 and json.loads(out)["status"] == "active"
    target = tmp_path / "out.tar.gz"
    code, out, _ = kiln("adapters", "download", "math-r001", "-o", str(target), "--json")
    result = json.loads(out)
    assert code == 0 and result["bytes"] == target.stat().st_size > 0
    assert result["content_sha256"] == original.content_sha256
    code, out, _ = kiln("adapters", "upload", "math-copy", str(target), "--json")
    assert code == 0 and json.loads(out)["content_sha256"] == original.content_sha256
    # In text, the upload says which files of the archive the registry did not keep.
    code, out, _ = kiln("adapters", "upload", "math-copy2", str(target))
    ignored = json.loads(kiln("adapters", "show", "math-copy2", "--json")[1])  # it exists
    assert code == 0 and out.startswith("uploaded math-copy2 (available, ") and ignored["name"] == "math-copy2"
    lines = out.strip().splitlines()
    assert lines[1:] == ["carries no receipt: a plain PEFT adapter"]
    kiln("adapters", "delete", "math-copy2")
    code, out, err = kiln("adapters", "delete", "math-r001")
    assert code == 1 and out == "" and err.startswith("error: adapter_active: ") and len(err.splitlines()) == 1
    code, out, _ = kiln("adapters", "unload", "math-r001")
    assert code == 0 and out.strip() == "math-r001: available"
    code, out, _ = kiln("adapters", "delete", "math-r001")
    assert code == 0 and out.strip() == "deleted math-r001 (1 folder(s) removed)"
    code, out, _ = kiln("adapters", "list", "--json")
    assert [a["name"] for a in json.loads(out)] == ["math-copy"]
    code, out, _ = kiln("adapters", "activate", "math-copy", "--reason", "roll forward")
    assert code == 0 and out.strip().startswith("promotion ") and ": approved (base -> math-copy)" in out


def test_errors_are_one_line(kiln, home, tmp_path):
    code, _, err = kiln("adapters", "show", "nope")
    assert code == 1 and err.startswith("error: adapter_not_found: ") and len(err.splitlines()) == 1
    code, _, err = kiln("adapters", "download", "nope", "-o", str(tmp_path / "x.tar.gz"))
    assert code == 1 and err.startswith("error: adapter_not_found: ") and not (tmp_path / "x.tar.gz").exists()
    assert not any(p.name.endswith(".part") for p in tmp_path.iterdir())
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tar")
    code, _, err = kiln("adapters", "upload", "x", str(bad))
    assert code == 1 and err.startswith("error: adapter_upload_invalid: ")
    code, _, err = kiln("adapters", "upload", "x", str(tmp_path / "missing.tar.gz"))
    assert code == 1 and err.startswith("error: file_unreadable: ")
