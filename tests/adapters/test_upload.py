"""POST /v1/adapters/upload and GET /download: a download uploads again under another name with the
same content digest; every hostile or wrong archive is refused with a stable code and leaves nothing
in the registry folder."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from dataclasses import replace

import pytest

from adapters.models import Adapter, AdapterTransition
from tests.adapters.support import (
    error,
    file_member,
    folder_archive,
    ok,
    publish,
    registry_entries,
    tar_gz,
    upload,
)

pytestmark = pytest.mark.django_db


def _download(client, name: str) -> bytes:
    response = client.get(f"/v1/adapters/{name}/download")
    assert response.status_code == 200, response.content
    assert response.streaming and response["Content-Type"] == "application/gzip"
    assert response["Content-Disposition"] == f'attachment; filename="{name}.tar.gz"'
    return b"".join(response.streaming_content)


def test_download_round_trips_to_an_upload_under_another_name(api, home, peft_adapter):
    from gpu_runtime.identity import adapter_files, file_manifest, manifest_digest

    original = publish(home, peft_adapter, "math-r001", receipt={"receipt_type": "kiln_train_receipt"})
    data = _download(api, "math-r001")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = sorted(m.name for m in tar.getmembers())
        assert names == ["math-r001", "math-r001/adapter_config.json", "math-r001/adapter_model.safetensors",
                         "math-r001/train_receipt.json"]
        weights = tar.extractfile("math-r001/adapter_model.safetensors").read()
    assert weights == (peft_adapter / "adapter_model.safetensors").read_bytes()
    body = ok(upload(api, "math-copy", data, filename="math-r001.tar.gz"))
    assert body["name"] == "math-copy" and body["status"] == "available" and body["state"] == "published"
    assert body["content_sha256"] == original.content_sha256  # the same bytes, the same digest
    folder = home / "adapters" / "math-copy"
    assert body["content_sha256"] == manifest_digest(file_manifest(folder, adapter_files(folder)))  # the trainer's
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert body["checked"]["ignored_files"] == ["train_receipt.json"]  # a receipt file is not a receipt row
    assert body["checked"]["target_modules"] == ["q_proj", "v_proj"] and body["checked"]["hidden_size"] == 96
    [transition] = AdapterTransition.objects.filter(adapter="math-copy")
    assert (transition.from_state, transition.to_state) == ("", "available")
    assert transition.actor.username == "trainer" and transition.reason == "uploaded (math-r001.tar.gz)"
    assert transition.content_sha256 == original.content_sha256
    assert ok(api.get("/v1/adapters/math-copy"))["content_sha256"] == original.content_sha256


def test_a_flat_archive_uploads_too(api, home, peft_adapter):
    body = ok(upload(api, "flat", folder_archive(peft_adapter)))
    assert body["status"] == "available" and body["checked"]["ignored_files"] == []
    assert registry_entries(home) == ["flat"]


def _hostile(peft_adapter, extra) -> bytes:
    return folder_archive(peft_adapter, extra=[extra])


def _link(name: str, kind, target: str):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _device(name: str):
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info, None


HOSTILE = {
    "parent path": lambda a: _hostile(a, file_member("../x", b"escape")),
    "nested parent path": lambda a: _hostile(a, file_member("sub/../../x", b"escape")),
    "absolute path": lambda a: _hostile(a, file_member("/etc/kiln-x", b"escape")),
    "symlink": lambda a: _hostile(a, _link("evil", tarfile.SYMTYPE, "/etc/passwd")),
    "hardlink": lambda a: _hostile(a, _link("evil", tarfile.LNKTYPE, "adapter_config.json")),
    "device": lambda a: _hostile(a, _device("null")),
    "nested folder": lambda a: _hostile(a, file_member("top/deeper/x.json", b"{}")),
    "hidden name": lambda a: _hostile(a, file_member(".hidden", b"x")),
    "duplicate name": lambda a: _hostile(a, file_member("adapter_config.json", b"{}")),
    "no adapter_config.json": lambda a: folder_archive(a, skip=("adapter_config.json",)),
    "no safetensors": lambda a: folder_archive(a, skip=("adapter_model.safetensors",)),
    "not a tar": lambda a: b"this is not an archive at all",
    "truncated": lambda a: folder_archive(a)[:300],
    "empty": lambda a: tar_gz([]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_and_incomplete_archives_are_refused_and_leave_nothing(api, home, peft_adapter, case):
    message = error(upload(api, "evil", HOSTILE[case](peft_adapter)), 400, "adapter_upload_invalid")
    assert message.startswith("archive: ")
    assert registry_entries(home) == []  # no folder, no hidden staging sibling
    assert not Adapter.objects.exists() and not AdapterTransition.objects.exists()
    assert not (home / "x").exists() and not (home.parent / "x").exists()


def _config(peft_adapter) -> dict:
    return json.loads((peft_adapter / "adapter_config.json").read_text())


def _safetensors(tensors: dict[str, list[int]]) -> bytes:
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * offset


def _with(peft_adapter, *, config: dict | None = None, weights: bytes | None = None) -> bytes:
    return tar_gz([file_member("adapter_config.json", json.dumps(config or _config(peft_adapter)).encode()),
                   file_member("adapter_model.safetensors",
                               weights if weights is not None else (peft_adapter / "adapter_model.safetensors").read_bytes())])


Q = "base_model.model.model.layers.0.self_attn.q_proj"


def _lora(module: str, a: list[int], b: list[int]) -> dict:
    return {f"{module}.lora_A.weight": a, f"{module}.lora_B.weight": b}


WRONG = {
    # the tiny model's hidden size is 96: a LoRA for a 64-wide model does not fit
    "hidden size": (lambda a: _with(a, weights=_safetensors(_lora(Q, [4, 64], [96, 4]))), "in_features 64"),
    "out features": (lambda a: _with(a, weights=_safetensors(_lora(Q, [4, 96], [128, 4]))), "out_features 128"),
    "layer count": (lambda a: _with(a, weights=_safetensors(_lora(Q.replace("layers.0", "layers.3"), [4, 96], [96, 4]))),
                    "num_hidden_layers"),
    "rank mismatch": (lambda a: _with(a, weights=_safetensors(_lora(Q, [4, 96], [96, 2]))), "rank"),
    "missing lora_B": (lambda a: _with(a, weights=_safetensors({f"{Q}.lora_A.weight": [4, 96]})), "partner"),
    "unknown module": (lambda a: _with(a, weights=_safetensors(
        _lora("base_model.model.model.layers.0.self_attn.x_proj", [4, 96], [96, 4]))), "does not have"),
    "target module": (lambda a: _with(a, config={**_config(a), "target_modules": ["q_proj", "conv1d"]}), "conv1d"),
    "peft type": (lambda a: _with(a, config={**_config(a), "peft_type": "IA3"}), "LoRA adapters only"),
    "config not json": (lambda a: tar_gz([file_member("adapter_config.json", b"{nope"),
                                          file_member("adapter_model.safetensors", _safetensors(_lora(Q, [4, 96], [96, 4])))]),
                        "not JSON"),
    "header too long": (lambda a: _with(a, weights=struct.pack("<Q", 10**9) + b"{}"), "header length"),
    "bytes missing": (lambda a: _with(a, weights=_safetensors(_lora(Q, [4, 96], [96, 4]))[:-8]), "offsets"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_an_adapter_that_does_not_fit_the_base_model_is_refused(api, home, peft_adapter, case):
    build, words = WRONG[case]
    message = error(upload(api, "wrong", build(peft_adapter)), 400, "adapter_upload_invalid")
    assert words in message, message
    assert registry_entries(home) == [] and not Adapter.objects.exists()


def test_archives_over_the_quota_are_refused_packed_and_unpacked(api, home, peft_adapter, settings):
    data = folder_archive(peft_adapter)
    settings.KILN = replace(settings.KILN, max_adapter_upload_bytes=len(data) - 1)
    message = error(upload(api, "big", data), 413, "adapter_upload_too_large")
    assert f"quota of {len(data) - 1} bytes" in message
    assert registry_entries(home) == []
    bomb = tar_gz([file_member("adapter_config.json", (peft_adapter / "adapter_config.json").read_bytes()),
                   file_member("zeros.bin", b"\0" * 4_000_000)])  # a few KiB packed, 4 MB unpacked
    settings.KILN = replace(settings.KILN, max_adapter_upload_bytes=1_000_000)
    assert len(bomb) < 1_000_000
    assert "the unpacked adapter" in error(upload(api, "bomb", bomb), 413, "adapter_upload_too_large")
    assert registry_entries(home) == [] and not Adapter.objects.exists()


def test_an_existing_name_a_bad_name_and_missing_fields_are_refused(api, home, peft_adapter, settings):
    publish(home, peft_adapter, "taken")
    before = registry_entries(home)
    error(upload(api, "taken", folder_archive(peft_adapter)), 409, "adapter_already_exists")
    (home / "adapters" / "stray").mkdir()  # a folder without a row still holds the name
    stray = upload(api, "stray", folder_archive(peft_adapter))
    assert "which is no registered adapter" in error(stray, 409, "adapter_already_exists")
    # no delete reaches such a folder, so the hint names it, not a delete (QA: a demoted <name>.failed)
    assert f"remove {home / 'adapters' / 'stray'} by hand" in stray.json()["error"]["hint"]
    assert "delete" not in stray.json()["error"]["hint"]
    error(upload(api, "../up", folder_archive(peft_adapter)), 400, "invalid_adapter_name")
    error(api.post("/v1/adapters/upload", data={"name": "x"}), 400, "adapter_upload_invalid")
    assert registry_entries(home) == sorted([*before, "stray"])
    settings.KILN = replace(settings.KILN, model_path=None)
    error(upload(api, "nomodel", folder_archive(peft_adapter)), 400, "mock_mode")
    assert sorted(Adapter.objects.values_list("name", flat=True)) == ["taken"]


def test_upload_needs_the_submit_permission_and_a_token(make_client, home, peft_adapter):
    viewer = make_client("viewer", can_submit=False)
    error(upload(viewer, "x", folder_archive(peft_adapter)), 403, "permission_denied")
    from django.test import Client

    error(upload(Client(), "x", folder_archive(peft_adapter)), 401, "unauthorized")
    assert registry_entries(home) == []


def test_download_of_an_unpublished_or_unknown_adapter(api, home):
    from adapters.services import adapter_reserve

    adapter_reserve(name="busy")
    error(api.get("/v1/adapters/busy/download"), 409, "adapter_busy")
    error(api.get("/v1/adapters/nope/download"), 404, "adapter_not_found")


@pytest.mark.django_db(transaction=True)  # the ASGI handler reads the rows from its own thread
def test_under_asgi_the_download_streams_from_an_async_iterator(home, peft_adapter):
    """Daphne serves through ASGI: a sync iterator would be read whole into memory first."""
    import warnings

    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    from core.accounts.services import token_create, user_create

    publish(home, peft_adapter, "big")
    user_create(username="async-user", password="long-enough-pw")
    client, secret = AsyncClient(), token_create(username="async-user")[1]

    async def fetch():
        response = await client.get("/v1/adapters/big/download", headers={"Authorization": f"Bearer {secret}"})
        assert response.status_code == 200 and response.is_async, response.content
        return b"".join([part async for part in response.streaming_content])

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "must consume synchronous iterators" would fail here
        data = async_to_sync(fetch)()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.extractfile("big/adapter_model.safetensors").read() == \
            (peft_adapter / "adapter_model.safetensors").read_bytes()


def test_an_archive_larger_than_the_request_limit_reaches_the_upload_route(api, home, peft_adapter, settings):
    """The request-body limit (KILN_MAX_REQUEST_BYTES) guards JSON routes; an adapter archive is
    bounded by its own quota instead, so a real adapter bigger than the request limit uploads."""
    data = folder_archive(peft_adapter)
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = len(data) // 4
    body = ok(upload(api, "big-one", data))
    assert body["status"] == "available"
    refused = api.post("/v1/train/grpo", data=b"x" * len(data), content_type="application/json")
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large"


def test_a_full_disk_while_unpacking_is_507_and_leaves_nothing(api, home, peft_adapter, monkeypatch):
    """No room on the server's disk is the server's condition (507 adapter_disk_quota_exceeded with a
    hint to free space), not a corrupt archive (the user's)."""
    import builtins
    import errno

    from adapters import archive

    class FullDisk(io.BytesIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    real_open = builtins.open
    monkeypatch.setattr(archive, "open", lambda path, mode="r", *a, **k: FullDisk() if mode == "xb"
                        else real_open(path, mode, *a, **k), raising=False)
    response = upload(api, "full", folder_archive(peft_adapter))
    assert "no room" in error(response, 507, "adapter_disk_quota_exceeded")
    assert "kiln adapters delete" in response.json()["error"]["hint"]
    assert registry_entries(home) == [] and not Adapter.objects.exists()
