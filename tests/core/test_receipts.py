"""Receipts as rows: append-only, digest of the canonical JSON, read-only and searchable in the admin."""

from __future__ import annotations

import pytest

from core.canonical import json_digest
from core.models import AppendOnlyError, Receipt
from core.receipts import receipt_latest, receipt_record

BODY = {
    "schema_version": 1,
    "adapter_name": "math-r001",
    "grpo": {"policy_audit": {"schema": "kiln.grpo-policy-audit.v1", "clip_fraction": 0.125, "tokens": 96}},
    "training_data": {"source": "inline", "sha256": "sha256:" + "ab" * 32},
    "rewards": {"mean": 0.5, "count": 8},
}


@pytest.mark.django_db
def test_a_receipt_row_holds_the_canonical_digest_and_is_append_only():
    row = receipt_record(kind="train", subject="math-r001", body=BODY)
    assert row.sha256 == json_digest(BODY) and row.schema == "1"
    assert receipt_latest(kind="train", subject="math-r001") == row
    row.body = {"tampered": True}
    with pytest.raises(AppendOnlyError):
        row.save()
    with pytest.raises(AppendOnlyError):
        row.delete()
    assert Receipt.objects.get(pk=row.pk).body == BODY
    newer = receipt_record(kind="train", subject="math-r001", body=dict(BODY, rewards={"mean": 0.75, "count": 8}))
    assert receipt_latest(kind="train", subject="math-r001") == newer


@pytest.mark.django_db
def test_a_receipt_names_the_job_that_produced_it():
    from core.jobs.models import Job

    job = Job.objects.create(kind="training.grpo", queue="gpu")
    row = receipt_record(kind="train", subject="math-r001", body=BODY, job=job)
    assert Receipt.objects.get(pk=row.pk).job == job
    assert list(job.receipts.all()) == [row]


@pytest.mark.django_db
def test_admin_lists_searches_and_shows_receipts_read_only(admin_client):
    row = receipt_record(kind="train", subject="math-r001", body=BODY)
    receipt_record(kind="train", subject="other-r001", body=dict(BODY, adapter_name="other-r001"))
    listing = admin_client.get("/admin/core/receipt/", {"q": "math-r001"})
    assert listing.status_code == 200
    assert b"math-r001" in listing.content and b"other-r001" not in listing.content
    by_digest = admin_client.get("/admin/core/receipt/", {"q": row.sha256})
    assert b"math-r001" in by_digest.content and b"other-r001" not in by_digest.content
    from core.jobs.models import Job

    job = Job.objects.create(kind="training.grpo", queue="gpu")
    receipt_record(kind="train", subject="by-job-r001", body=BODY, job=job)
    by_job = admin_client.get("/admin/core/receipt/", {"q": str(job.uuid)})
    assert b"by-job-r001" in by_job.content and b"math-r001" not in by_job.content
    detail = admin_client.get(f"/admin/core/receipt/{row.pk}/change/")
    assert detail.status_code == 200
    html = detail.content.decode()
    assert "clip_fraction" in html and "0.125" in html and "<table>" in html  # the policy audit, as a table
    assert 'name="_save"' not in html  # read-only: no save button
    assert admin_client.post(f"/admin/core/receipt/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Receipt.objects.filter(pk=row.pk).exists()
