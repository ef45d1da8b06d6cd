"""Shared by the adapter registry tests (conftest.py re-exports the fixtures): a private KILN_HOME
serving the tiny model, API clients, a real PEFT adapter for the tiny model (built once with torch
and peft: tests may import them, the web modules may not), and tar.gz builders for good and hostile
archives."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from django.test import Client

from core.accounts.services import token_create, user_create


@pytest.fixture(scope="session")
def peft_adapter(tiny_model_dir, tmp_path_factory) -> Path:
    """A LoRA (r=4 on q_proj and v_proj) for the tiny model with non-zero weights, saved by peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    target = tmp_path_factory.mktemp("peft") / "adapter"
    peft_model.save_pretrained(target, safe_serialization=True)
    (target / "README.md").unlink(missing_ok=True)
    return target


@pytest.fixture
def home(settings, tmp_path, tiny_model_dir):
    """A private KILN_HOME whose served base model is the tiny model."""
    settings.KILN = replace(settings.KILN, home=tmp_path / "home", model_path=Path(tiny_model_dir))
    (tmp_path / "home" / "adapters").mkdir(parents=True)
    return tmp_path / "home"


def _client(username: str, **perms) -> Client:
    user_create(username=username, password="long-enough-pw", **perms)
    return Client(headers={"Authorization": f"Bearer {token_create(username=username)[1]}"},
                  raise_request_exception=False)


@pytest.fixture
def api(db):
    """A client for `trainer` (submit_job; alone on the machine, so activation is theirs to do)."""
    return _client("trainer")


@pytest.fixture
def make_client(db):
    return _client


def publish(home: Path, source: Path, name: str, *, loaded: bool = False, job=None, base_adapter: str = "",
            receipt: dict | None = None):
    """Publish a copy of `source` as `name` the way the training runner does (reserve, then publish)."""
    from adapters.content import content_digest
    from adapters.services import adapter_publish, adapter_reserve

    folder = home / "adapters" / name
    shutil.copytree(source, folder)
    if receipt is not None:
        (folder / "train_receipt.json").write_text(json.dumps(receipt))
    adapter_reserve(name=name, job=job, base_adapter=base_adapter)
    return adapter_publish(name=name, path=folder, content_sha256=content_digest(folder), base_model_sha256="",
                           loaded=loaded)


def tar_gz(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def folder_archive(folder: Path, *, prefix: str = "", extra: list | None = None, skip: tuple = ()) -> bytes:
    members = [file_member(f"{prefix}{p.name}", p.read_bytes()) for p in sorted(Path(folder).iterdir())
               if p.is_file() and p.name not in skip]
    return tar_gz(members + list(extra or []))


def upload(client: Client, name: str, data: bytes, filename: str = "adapter.tar.gz"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post("/v1/adapters/upload",
                       data={"name": name, "archive": SimpleUploadedFile(filename, data, "application/gzip")})


def send(client: Client, method: str, path: str, body: dict | None = None):
    return getattr(client, method)(path, data=json.dumps(body or {}), content_type="application/json")


def error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "hint"}
    assert body["error"]["code"] == code, body
    return body["error"]["message"]


def ok(response):
    assert response.status_code == 200, response.content
    return response.json()


def registry_entries(home: Path) -> list[str]:
    """Everything in the adapter registry folder, hidden staging siblings included."""
    folder = home / "adapters"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []
