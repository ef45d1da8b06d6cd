"""A Kiln download carries adapter_manifest.json and train_receipt.json: uploading it checks them
against its weights (400 adapter_archive_integrity_failed naming the file, nothing stored) and keeps
them as carried evidence (/receipt serves it, verify checks what it can and marks the rest not
checkable here). /download and /receipt refuse bytes that no longer hash to what was recorded, and an
oversize upload has one code at any size."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import replace

import pytest

from adapters.content import content_digest
from adapters.manifest import MANIFEST_FILE, manifest_bytes
from adapters.models import Adapter, AdapterTransition
from core.canonical import sha256_digest
from core.models import ReceiptKind
from core.receipts import receipt_record
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
from tests.adapters.test_cli import in_process_cli
from tests.adapters_verify.chain_support import job_row

pytestmark = pytest.mark.django_db

BASE_MODEL = "sha256:" + "b" * 64
CORPUS = "sha256:" + "c" * 64
UNCHECKABLE = {"training.job", "train_receipt.row", "train_receipt.file", "corpus.snapshot", "corpus.provenance",
               "base_adapter"}


def trained_source(tmp_path, peft_adapter, name: str = "math-r001", job_id: str = "job-1"):
    """An adapter folder as a training job publishes it: weights, train_receipt.json, and the manifest
    written by the publisher's own function (bound to the exact receipt bytes)."""
    folder = tmp_path / "src" / name
    shutil.copytree(peft_adapter, folder)
    receipt = {"adapter_name": name, "status": "success", "model": {"base_model_sha256": BASE_MODEL},
               "training_data": {"sha256": CORPUS},
               "adapters": {"base": None, "output": {
                   "adapter_model_sha256": content_digest(folder),
                   "adapter_model_bytes": (folder / "adapter_model.safetensors").stat().st_size}}}
    (folder / "train_receipt.json").write_text(json.dumps(receipt, indent=2))
    (folder / MANIFEST_FILE).write_bytes(manifest_bytes(
        folder, name=name, content_sha256=content_digest(folder),
        receipt_bytes=(folder / "train_receipt.json").read_bytes(), base_model_sha256=BASE_MODEL, base_adapter=None,
        training_job_id=job_id, admitted_corpus_sha256=CORPUS))
    return folder, receipt


def _download(client, name: str) -> bytes:
    response = client.get(f"/v1/adapters/{name}/download")
    assert response.status_code == 200, response.content
    return b"".join(response.streaming_content)


def _rewrite(data: bytes, name: str, change) -> bytes:
    """The archive with one member's bytes passed through change(bytes) -> bytes."""
    members = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                content = tar.extractfile(member).read()
                members.append(file_member(member.name, change(content) if member.name.endswith(name) else content))
    return tar_gz(members)


def _flip(content: bytes) -> bytes:
    flipped = bytearray(content)
    flipped[-1] ^= 0x01  # the last byte of the tensor data: the PEFT layout still reads
    return bytes(flipped)


def test_a_download_uploads_with_its_evidence_and_verifies_what_it_can(api, home, peft_adapter, tmp_path,
                                                                       monkeypatch, capsys):
    source, receipt = trained_source(tmp_path, peft_adapter)
    original = publish(home, source, "math-r001")
    body = ok(upload(api, "math-copy", _download(api, "math-r001"), filename="math-r001.tar.gz"))
    assert body["content_sha256"] == original.content_sha256
    assert body["checked"]["carried_files"] == [MANIFEST_FILE, "train_receipt.json"]
    assert body["checked"]["ignored_files"] == []
    folder = home / "adapters" / "math-copy"
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", MANIFEST_FILE,
                                                        "adapter_model.safetensors", "train_receipt.json"]
    assert ok(api.get("/v1/adapters/math-copy/receipt")) == receipt
    detail = ok(api.get("/v1/adapters/math-copy/detail"))
    assert sorted(f["file"] for f in detail["files"]) == sorted(p.name for p in folder.iterdir())
    assert detail["receipt_sha256"] is None  # no receipt row here: the receipt is carried, not recorded
    [transition] = AdapterTransition.objects.filter(adapter="math-copy")
    assert transition.reason == "uploaded (math-r001.tar.gz)"
    row = Adapter.objects.get(name="math-copy")
    assert row.uploaded and row.manifest_sha256 == sha256_digest((folder / MANIFEST_FILE).read_bytes())

    report = ok(api.get("/v1/adapters/math-copy/verify"))
    links = {link["link"]: link for link in report["links"]}
    assert report["ok"] is True and report["first_broken"] is None
    assert {name for name, link in links.items() if not link["checked"]} == UNCHECKABLE
    for name in UNCHECKABLE:
        assert links[name]["detail"].startswith("not checkable here: uploaded (carried receipt); "), links[name]
    assert not any("trained from the base model" in link["detail"] for link in report["links"])
    assert links["adapter_manifest.file"]["checked"] and "carried from 'math-r001'" in links["adapter_manifest.file"][
        "detail"]
    assert links["train_receipt.output"]["checked"] and links["train_receipt.output"]["actual"] == \
        original.content_sha256
    assert links["adapter.bytes"]["checked"] and links["adapter.bytes"]["actual"] == original.content_sha256
    code, out, _ = in_process_cli(api, monkeypatch, capsys)("adapters", "verify", "math-copy")
    lines = out.splitlines()
    assert code == 0 and not any(line.startswith("BROKEN") for line in lines)
    assert sorted(line.split()[1] for line in lines if line.startswith("n/a ")) == sorted(UNCHECKABLE)
    assert lines[-1] == (f"adapter 'math-copy': {len(report['links']) - 6} links verify, 6 are not checkable here "
                         "(uploaded: they live on the machine that trained it)")

    # what it carried is still checked: an edited carried receipt breaks the manifest link and /receipt
    (folder / "train_receipt.json").write_text(json.dumps({**receipt, "status": "edited"}))
    report = ok(api.get("/v1/adapters/math-copy/verify"))
    assert report["first_broken"] == "adapter_manifest.file"
    message = error(api.get("/v1/adapters/math-copy/receipt"), 409, "receipt_integrity_failed")
    assert "train_receipt.json" in message
    assert "kiln adapters verify math-copy" in api.get("/v1/adapters/math-copy/receipt").json()["error"]["hint"]
    # and a carried manifest deleted after the upload is missing evidence, not "published before manifests"
    (folder / "train_receipt.json").write_text(json.dumps(receipt, indent=2))
    assert ok(api.get("/v1/adapters/math-copy/verify"))["ok"] is True
    (folder / MANIFEST_FILE).unlink()
    link = {x["link"]: x for x in ok(api.get("/v1/adapters/math-copy/verify"))["links"]}["adapter_manifest.file"]
    assert not link["ok"] and "is missing; the adapter was published with one" in link["detail"]


TAMPERED = {
    "weights byte": ("adapter_model.safetensors", _flip, "adapter_model.safetensors has "),
    "receipt": ("train_receipt.json", lambda b: b.replace(b'"success"', b'"failure"'), "train_receipt.json hashes to "),
    "manifest content digest": (MANIFEST_FILE, lambda b: json.dumps({**json.loads(b), "content_sha256": "sha256:"
                                                                     + "0" * 64}).encode(),
                                f"{MANIFEST_FILE} names content sha256:{'0' * 64}"),
    "manifest not JSON": (MANIFEST_FILE, lambda b: b"{not json", f"{MANIFEST_FILE} is not a readable"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_an_archive_that_no_longer_matches_its_manifest_is_refused(api, home, peft_adapter, tmp_path, case):
    member, change, words = TAMPERED[case]
    publish(home, trained_source(tmp_path, peft_adapter)[0], "math-r001")
    before = registry_entries(home)
    data = _rewrite(_download(api, "math-r001"), member, change)
    response = upload(api, "math-copy", data)
    message = error(response, 400, "adapter_archive_integrity_failed")
    assert message.startswith("archive: ") and words in message, message
    assert "adapter_manifest.json" in api_hint(response)
    assert registry_entries(home) == before and not Adapter.objects.filter(name="math-copy").exists()
    assert not AdapterTransition.objects.filter(adapter="math-copy").exists()


def api_hint(response) -> str:
    return response.json()["error"]["hint"]


def test_a_plain_peft_upload_carries_no_receipt_and_claims_no_lineage(api, home, peft_adapter, tmp_path):
    """No manifest: accepted as before, a stray receipt is not kept (nothing binds it to the weights)."""
    stray = [file_member("train_receipt.json", b'{"adapter_name": "someone-else"}')]
    body = ok(upload(api, "plain", folder_archive(peft_adapter, extra=stray)))
    assert body["checked"]["carried_files"] == [] and body["checked"]["ignored_files"] == ["train_receipt.json"]
    assert sorted(p.name for p in (home / "adapters" / "plain").iterdir()) == ["adapter_config.json",
                                                                               "adapter_model.safetensors"]
    error(api.get("/v1/adapters/plain/receipt"), 404, "receipt_not_found")
    report = ok(api.get("/v1/adapters/plain/verify"))
    links = {link["link"]: link for link in report["links"]}
    assert report["ok"] is True
    assert {name for name, link in links.items() if not link["checked"]} == UNCHECKABLE | {
        "train_receipt.output", "adapter_manifest.file"}
    assert links["base_adapter"]["detail"] == ("not checkable here: uploaded (carries no receipt: a plain PEFT "
                                               "adapter); its lineage is unknown")


def test_a_manifest_without_the_receipt_it_binds_is_refused(api, home, peft_adapter, tmp_path):
    source, _ = trained_source(tmp_path, peft_adapter)
    message = error(upload(api, "half", folder_archive(source, skip=("train_receipt.json",))), 400,
                    "adapter_archive_integrity_failed")
    assert "binds a train_receipt.json" in message and "does not hold" in message
    assert not Adapter.objects.filter(name="half").exists()


def test_a_manifest_that_binds_no_weights_or_another_base_model_is_refused(api, home, peft_adapter, tmp_path,
                                                                          monkeypatch):
    from adapters import services

    publish(home, trained_source(tmp_path, peft_adapter)[0], "math-r001")
    archive = _download(api, "math-r001")
    no_files = _rewrite(archive, MANIFEST_FILE, lambda b: json.dumps({**json.loads(b), "files": []}).encode())
    assert "does not list adapter_config.json, adapter_model.safetensors" in error(
        upload(api, "empty-list", no_files), 400, "adapter_archive_integrity_failed")
    monkeypatch.setattr(services, "_served_base_model_sha256", lambda: "sha256:" + "9" * 64)
    message = error(upload(api, "other-base", archive), 400, "adapter_archive_integrity_failed")
    assert f"names base model {BASE_MODEL}" in message and "9" * 64 in message
    assert not Adapter.objects.filter(name__in=("empty-list", "other-base")).exists()


def test_a_download_refuses_an_edited_receipt_or_manifest(api, home, peft_adapter, tmp_path):
    publish(home, trained_source(tmp_path, peft_adapter)[0], "math-r001")
    _download(api, "math-r001")  # intact: served
    folder = home / "adapters" / "math-r001"
    receipt = folder / "train_receipt.json"
    original = receipt.read_bytes()
    receipt.write_bytes(original + b" ")  # the same JSON, other bytes: the manifest's receipt_hash no longer holds
    assert "receipt_hash" in error(api.get("/v1/adapters/math-r001/download"), 409, "receipt_integrity_failed")
    receipt.write_bytes(original)
    manifest = folder / MANIFEST_FILE
    manifest.write_bytes(manifest.read_bytes().replace(b'"job-1"', b'"job-2"'))
    assert "recorded at publication" in error(api.get("/v1/adapters/math-r001/download"), 409,
                                              "receipt_integrity_failed")


def test_a_name_reused_after_a_delete_shows_none_of_the_old_receipts(api, home, peft_adapter):
    job = job_row("training.grpo", payload={})
    publish(home, peft_adapter, "reused", job=job)
    receipt_record(kind=ReceiptKind.TRAIN, subject="reused", body={"adapter_name": "reused"}, job=job)
    assert ok(api.get("/v1/adapters/reused"))["receipt_sha256"] is not None
    ok(api.delete("/v1/adapters/reused"))
    ok(upload(api, "reused", folder_archive(peft_adapter)))
    assert ok(api.get("/v1/adapters/reused"))["receipt_sha256"] is None
    assert ok(api.get("/v1/adapters/reused/detail"))["receipts"] == []
    rows = {x["link"]: x for x in ok(api.get("/v1/adapters/reused/verify"))["links"]}["receipts.rows"]
    assert rows["detail"] == "all 0 receipt rows about 'reused' hash to their digests"


def test_download_and_receipt_refuse_bytes_that_changed(api, home, peft_adapter, tmp_path, monkeypatch, capsys):
    job = job_row("training.grpo", payload={})
    adapter = publish(home, peft_adapter, "math-r001", job=job, receipt={"adapter_name": "math-r001", "n": 1})
    receipt_record(kind=ReceiptKind.TRAIN, subject="math-r001", body={"adapter_name": "math-r001", "n": 1}, job=job)
    assert ok(api.get("/v1/adapters/math-r001/receipt")) == {"adapter_name": "math-r001", "n": 1}
    folder = home / "adapters" / "math-r001"
    (folder / "train_receipt.json").write_text(json.dumps({"adapter_name": "math-r001", "n": 2}))
    response = api.get("/v1/adapters/math-r001/receipt")
    assert "receipt row" in error(response, 409, "receipt_integrity_failed")
    assert "kiln adapters verify math-r001" in api_hint(response)
    # the adapter page does not show the edited receipt as if it were the recorded one either
    from django.contrib.auth import get_user_model
    from django.test import Client

    browser = Client(raise_request_exception=False)
    browser.force_login(get_user_model().objects.create_user("page-reader", password="x" * 12))
    page = browser.get("/ui/adapters/math-r001/").content.decode()
    assert "receipt_integrity_failed" in page and '"n": 2' not in page

    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(_flip(weights.read_bytes()))
    response = api.get("/v1/adapters/math-r001/download")
    message = error(response, 409, "adapter_content_mismatch")
    assert f"now hashes to {content_digest(folder)}" in message and adapter.content_sha256 in message
    assert "kiln adapters verify math-r001" in api_hint(response)
    kiln = in_process_cli(api, monkeypatch, capsys)
    target = tmp_path / "out.tar.gz"
    code, out, err = kiln("adapters", "download", "math-r001", "-o", str(target))
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("error: adapter_content_mismatch: ") and not target.exists()


def test_an_oversize_upload_has_one_code_and_states_the_configured_limit(api, home, peft_adapter, settings):
    settings.KILN = replace(settings.KILN, max_adapter_upload_bytes=200_000)
    huge = upload(api, "huge", b"\0" * 1_400_000)  # past the quota plus the multipart allowance: the middleware
    message = error(huge, 413, "adapter_upload_too_large")
    assert "quota of 200000 bytes" in message and "KILN_MAX_ADAPTER_UPLOAD_BYTES" in api_hint(huge)
    assert "1248576" not in message
    middling = upload(api, "middling", b"\0" * 650_000)  # within the allowance: the upload route refuses it
    assert "quota of 200000 bytes" in error(middling, 413, "adapter_upload_too_large")
    assert registry_entries(home) == []
