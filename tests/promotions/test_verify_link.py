"""The verifier's `promotion` link: an adapter a promotion activated verifies end to end; an edited
approval row (raw SQL, behind the append-only model) breaks the link and is named."""

from __future__ import annotations

import pytest

from adapters.promotions import promotion_request
from adapters.verify import link_names, verify_adapter
from core.models import Receipt
from tests.adapters_verify.chain_support import build_chain, tamper_row
from tests.promotions.support import approve, users

pytestmark = pytest.mark.django_db


def _approved(home, name: str = "gated"):
    requester, reviewer, _ = users()
    build_chain(home, name, gated=True, loaded=False)
    promotion = promotion_request(candidate=name, user=requester, reason="round one")
    return approve(promotion.id, reviewer, "gate passed, reviewed")


def test_the_promotion_link_follows_activation():
    names = link_names()
    assert names.index("promotion") == names.index("activation") + 1


def test_an_approved_promotion_verifies(home):
    promotion = _approved(home)
    report = verify_adapter("gated")
    assert report.ok, report.to_dict()
    link = {x.link: x for x in report.links}["promotion"]
    assert f"promotion {promotion.id} approved by reviewer" in link.detail
    assert "activation receipt row" in {x.link: x for x in report.links}["activation"].detail


def test_a_tampered_approval_row_breaks_the_promotion_link(home):
    _approved(home)
    row = Receipt.objects.get(kind="approval", subject="gated")
    tamper_row(row, {**row.body, "actor": "mallory"})
    report = verify_adapter("gated")
    assert report.first_broken.link == "promotion" and "altered" in report.first_broken.detail


@pytest.mark.parametrize(("kind", "field", "named"), [
    ("approval", "actor", "names 'mallory'"), ("promotion", "requested_by", "names 'mallory'"),
    ("approval", "reason", "gives the reason 'mallory'"), ("approval", "decided_at", "was decided at mallory")])
def test_a_row_forged_with_its_digest_recomputed_must_name_who_the_promotion_row_does(home, kind, field, named):
    """QA: the approval row rewritten to another approver with its sha256 recomputed passed verify
    ("approved by mallory") while the promotion row said the reviewer decided it."""
    from core.canonical import json_digest

    _approved(home)
    row = Receipt.objects.get(kind=kind, subject="gated")
    forged = {**row.body, field: "mallory"}
    tamper_row(row, forged)
    Receipt.objects.filter(id=row.id).update(sha256=json_digest(forged))
    report = verify_adapter("gated")
    assert report.first_broken.link == "promotion", report.to_dict()
    assert named in report.first_broken.detail
    if field in ("actor", "requested_by"):
        assert ("'reviewer'" if kind == "approval" else "'requester'") in report.first_broken.detail


def test_an_approval_row_bound_to_other_evidence_breaks_the_link(home):
    """A second, well-formed row claiming another evidence digest (hashes fine, binds the wrong thing)."""
    from core.receipts import receipt_record

    promotion = _approved(home)
    row = Receipt.objects.get(kind="approval", subject="gated")
    receipt_record(kind="approval", subject="gated", body={**row.body, "evidence_sha256": "sha256:" + "9" * 64})
    report = verify_adapter("gated")
    assert report.first_broken.link == "promotion" and "binds other" in report.first_broken.detail
    assert promotion.state == "applied"


def test_an_adapter_not_activated_by_a_promotion_passes_the_link(home):
    build_chain(home, "plain", loaded=True)
    link = {x.link: x for x in verify_adapter("plain").links}["promotion"]
    assert link.ok and "not activated through a promotion" in link.detail


def test_an_activation_by_an_approved_promotion_is_not_called_a_load_by_hand(home):
    """The receipt's actor is the approver: the link names the promotion and who approved it."""
    requester, reviewer, _ = users()
    build_chain(home, "few", loaded=False)
    promotion = promotion_request(candidate="few", user=requester, reason="looks better")
    promotion = approve(promotion.id, reviewer, "ship it")
    assert promotion.state == "applied"
    report = verify_adapter("few")
    assert report.ok, report.to_dict()
    detail = {x.link: x for x in report.links}["activation"].detail
    assert detail.startswith(f"active: activated by promotion {promotion.id}, approved by reviewer (receipt row ")
    assert "by hand" not in detail


def test_a_gated_promotion_names_the_promotion_and_its_approver(home):
    promotion = _approved(home)
    detail = {x.link: x for x in verify_adapter("gated").links}["activation"].detail
    assert detail.startswith(f"active: activated by promotion {promotion.id}, approved by reviewer, "
                             "activation receipt row ")


def test_an_activation_kiln_queued_is_not_called_a_load_by_hand(home):
    """auto_load and an environment gate queue an adapter.activate job; no person loaded the adapter."""
    from adapters.activation import activation_submit
    from tests.support.canary import drain_activations

    build_chain(home, "sayer", loaded=False)
    job = activation_submit(name="sayer", reason="environment gate passed (OpenEnv run r-1)")
    drain_activations()
    report = verify_adapter("sayer")
    assert report.ok, report.to_dict()
    detail = {x.link: x for x in report.links}["activation"].detail
    assert detail.startswith("active: activated by Kiln (receipt row ") and "by hand" not in detail
    assert "environment gate passed (OpenEnv run r-1)" in detail and job.kind == "adapter.activate"
