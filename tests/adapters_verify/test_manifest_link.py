"""adapter_manifest.file on hand-built chains: every field of the manifest is checked (files[] against
the folder, content and receipt digests, base model, admitted corpus, training job), a manifest the
publication recorded may not go missing or be replaced, a missing receipt is named as such; and a
re-trained adapter under an old name sees only its own receipt rows."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from adapters.manifest import MANIFEST_FILE, manifest_bytes
from adapters.schemas import adapter_out
from adapters.services import adapter_delete, manifest_sha256, transition_record
from adapters.verify import verify_adapter
from core.canonical import sha256_digest
from core.models import Receipt
from tests.adapters_verify.chain_support import build_chain

pytestmark = pytest.mark.django_db


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def published_with_manifest(home: Path, name: str = "m1"):
    """A chain whose folder has the manifest the publisher writes, recorded by its publication transition."""
    adapter = build_chain(home, name)
    folder, job = Path(adapter.path), adapter.training_job
    (folder / MANIFEST_FILE).write_bytes(manifest_bytes(
        folder, name=name, content_sha256=adapter.content_sha256,
        receipt_bytes=(folder / "train_receipt.json").read_bytes(), base_model_sha256=None, base_adapter=None,
        training_job_id=str(job.uuid), admitted_corpus_sha256=job.payload["training_data"]["admitted_corpus_sha256"]))
    transition_record(name=name, from_state="writing", to_state="available", reason="published")
    type(adapter).objects.filter(pk=adapter.pk).update(manifest_sha256=manifest_sha256(folder))
    return folder


def _manifest_link(name: str = "m1"):
    return {link.link: link for link in verify_adapter(name).links}["adapter_manifest.file"]


def test_a_recorded_manifest_verifies_and_binds_the_receipt(home):
    folder = published_with_manifest(home)
    report = verify_adapter("m1")
    assert report.ok, report.to_dict()
    link = _manifest_link()
    assert link.actual == sha256_digest((folder / "train_receipt.json").read_bytes())
    assert link.detail == f"{MANIFEST_FILE} binds these files to train_receipt.json ({link.actual})"


EDITS = {
    "files sha256": (lambda m: m["files"][0].update(sha256="sha256:" + "1" * 64), "adapter_config.json has "),
    "files size": (lambda m: m["files"][1].update(size=1), "adapter_model.safetensors has "),
    "base model": (lambda m: m.update(base_model_sha256="sha256:" + "2" * 64), "'s base_model_sha256 is 'sha256:22"),
    "admitted corpus": (lambda m: m.update(admitted_corpus_sha256="sha256:" + "3" * 64),
                        "'s admitted_corpus_sha256 is 'sha256:33"),
    "training job": (lambda m: m.update(training_job_id="another-job"), "'s training_job_id is 'another-job'"),
    "reformatted": (lambda m: None, "not the one recorded at publication"),  # same fields, other bytes
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_each_edited_manifest_field_breaks_the_link(home, case):
    edit, words = EDITS[case]
    folder = published_with_manifest(home)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    edit(manifest)
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    first = verify_adapter("m1").first_broken
    assert first is not None and first.link == "adapter_manifest.file", verify_adapter("m1").to_dict()
    assert words in first.detail, first.detail


def test_a_deleted_manifest_is_broken_when_publication_recorded_one(home):
    folder = published_with_manifest(home)
    recorded = sha256_digest((folder / MANIFEST_FILE).read_bytes())
    (folder / MANIFEST_FILE).unlink()
    link = _manifest_link()
    assert not link.ok and (link.expected, link.actual) == (recorded, None)
    assert link.detail == f"{folder / MANIFEST_FILE} is missing; the adapter was published with one ({recorded})"
    build_chain(home, "legacy")  # no manifest and none recorded: published before manifests
    assert _manifest_link("legacy").ok and "published before manifests" in _manifest_link("legacy").detail


def test_a_missing_receipt_file_is_named_by_the_manifest_link(home):
    folder = published_with_manifest(home)
    (folder / "train_receipt.json").unlink()
    link = _manifest_link()
    assert not link.ok and link.detail.startswith("train_receipt.json, whose bytes adapter_manifest.json's "
                                                  "receipt_hash binds, cannot be read"), link.detail


def test_a_retrained_adapter_under_an_old_name_sees_only_its_own_receipts(home):
    first = build_chain(home, "again")
    old_row = Receipt.objects.get(subject="again", job=first.training_job)
    adapter_delete(name="again")
    second = build_chain(home, "again")
    new_row = Receipt.objects.get(subject="again", job=second.training_job)
    assert old_row.id != new_row.id and adapter_out(second)["receipt_sha256"] == new_row.sha256
    rows = {link.link: link for link in verify_adapter("again").links}["receipts.rows"]
    assert rows.detail == "all 1 receipt rows about 'again' hash to their digests"
