"""The promotion services without a model: request, approve (applies once), reject, self-approval,
stale and superseded promotions, the approval receipt, and the decision's conditional claim."""

from __future__ import annotations

import pytest

from adapters.models import Adapter, AdapterTransition, Promotion
from adapters.promotions import (
    APPROVAL_SCHEMA,
    approval_required,
    promotion_approve,
    promotion_reject,
    promotion_request,
)
from adapters.selectors import adapter_active
from core.canonical import json_digest
from core.errors import KilnError
from core.models import Receipt
from tests.promotions.support import approve, policy, published, users
from tests.support.canary import drain_activations

pytestmark = pytest.mark.django_db


def _code(call) -> str:
    with pytest.raises(KilnError) as caught:
        call()
    return caught.value.code


def test_request_then_approve_applies_once_and_activates(home):
    requester, reviewer, other = users()
    published(home, "r1", loaded=True)
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    assert promotion.state == "pending" and promotion.incumbent == "r1" and promotion.alarms == []
    assert promotion.evidence_sha256 == json_digest(promotion.evidence)
    request_row = Receipt.objects.get(kind="promotion", subject="r2")
    assert request_row.body["promotion_id"] == promotion.id
    assert request_row.body["evidence_sha256"] == promotion.evidence_sha256
    assert not Adapter.objects.get(name="r2").loaded  # nothing changes before a person decides

    approved = promotion_approve(promotion_id=promotion.id, user=reviewer, reason="better held-out")
    # Approved: the serving canary runs in its activation job before anything serves.
    assert approved.state == "approved" and approved.activation_job is not None and adapter_active().name == "r1"
    drain_activations()
    applied = Promotion.objects.get(id=promotion.id)
    assert applied.state == "applied" and applied.decided_by == reviewer and applied.decided_at is not None
    assert adapter_active().name == "r2" and Adapter.objects.get(name="r2").loaded
    [row] = Receipt.objects.filter(kind="approval", subject="r2")
    assert row.sha256 == json_digest(row.body)
    body = row.body
    assert body["schema"] == APPROVAL_SCHEMA and body["decision"] == "approved" and body["actor"] == "reviewer"
    assert body["candidate_content_sha256"] == Adapter.objects.get(name="r2").content_sha256
    assert body["evidence_sha256"] == promotion.evidence_sha256 and body["promotion_id"] == promotion.id
    assert body["reason"] == "better held-out" and body["decided_at"] and body["override"] is False
    activation = Receipt.objects.get(kind="activation", subject="r2")
    assert activation.body["promotion_id"] == promotion.id and activation.body["actor"] == "reviewer"
    assert AdapterTransition.objects.filter(adapter="r2", to_state="active").count() == 1

    assert _code(lambda: promotion_approve(promotion_id=promotion.id, user=other, reason="again")) \
        == "promotion_not_pending"
    assert Receipt.objects.filter(kind="approval").count() == 1  # the refused one left nothing


def test_a_rollback_to_an_older_adapter_unloads_the_newer_one(home):
    requester, reviewer, _ = users()
    published(home, "old")
    published(home, "new", loaded=True)
    promotion = promotion_request(candidate="old", user=requester, reason="rollback")
    approve(promotion.id, reviewer, "new one misbehaves")
    assert adapter_active().name == "old" and not Adapter.objects.get(name="new").loaded
    assert AdapterTransition.objects.filter(adapter="new", to_state="available").last().reason.startswith(
        "replaced by old")


def test_self_approval_is_refused_unless_the_policy_allows_it(home, settings):
    _, reviewer, _ = users()
    published(home, "mine")
    promotion = promotion_request(candidate="mine", user=reviewer, reason="my round")
    assert _code(lambda: promotion_approve(promotion_id=promotion.id, user=reviewer, reason="looks good")) \
        == "promotion_self_approval"
    assert Promotion.objects.get(id=promotion.id).state == "pending"  # the refused claim rolled back
    policy(settings, allow_self_approval=True)
    assert approve(promotion.id, reviewer, "looks good").state == "applied"


def test_a_sole_user_may_approve_their_own_flagged_promotion(home, settings):
    """QA: on a one-user install (or with only viewers beside the admin) a promotion pending for its alarms
    could only be approved by "another reviewer", and there was none; the approval row still records who
    approved their own request."""
    from core.accounts.services import user_create
    from core.models import Receipt

    solo = user_create(username="solo", password="long-enough-pw", can_approve=True)
    published(home, "mine")
    promotion = promotion_request(candidate="mine", user=solo, reason="my round")
    Promotion.objects.filter(id=promotion.id).update(alarms=["the gate compared it with another baseline"])
    assert approve(promotion.id, solo, "I checked the alarm").state == "applied"
    row = Receipt.objects.get(kind="approval", subject="mine").body
    assert (row["actor"], row["decision"]) == ("solo", "approved")
    assert Receipt.objects.get(kind="promotion", subject="mine").body["requested_by"] == "solo"
    # a viewer beside them approves nothing either (QA's variation): still theirs to approve
    user_create(username="viewer", password="long-enough-pw", can_submit=False)
    published(home, "mine2")
    again = promotion_request(candidate="mine2", user=solo, reason="next round")
    assert approve(again.id, solo, "still the only approver").state == "applied"
    user_create(username="second", password="long-enough-pw", can_approve=True)  # another reviewer now must
    published(home, "mine3")
    third = promotion_request(candidate="mine3", user=solo, reason="third round")
    assert _code(lambda: promotion_approve(promotion_id=third.id, user=solo, reason="x")) == "promotion_self_approval"


def test_a_non_approver_cannot_decide(home):
    requester, _, _ = users()
    published(home, "c")
    promotion = promotion_request(candidate="c", user=requester, reason="")
    for decide in (promotion_approve, promotion_reject):
        assert _code(lambda d=decide: d(promotion_id=promotion.id, user=requester, reason="x")) \
            == "approval_permission_required"
    assert _code(lambda: promotion_approve(promotion_id=promotion.id, user=None, reason="x")) \
        == "approval_permission_required"


def test_a_stale_promotion_is_refused_after_the_incumbent_changed(home):
    from adapters.activation import make_active

    requester, reviewer, _ = users()
    published(home, "a", loaded=True)
    published(home, "b")
    published(home, "c")
    promotion = promotion_request(candidate="b", user=requester, reason="")
    # what serves changed by a path that supersedes nothing (a row set by hand): approval checks anyway
    Adapter.objects.filter(name="a").update(loaded=False)
    Adapter.objects.filter(name="c").update(loaded=True)
    assert _code(lambda: promotion_approve(promotion_id=promotion.id, user=reviewer, reason="ok")) \
        == "promotion_stale"
    assert Promotion.objects.get(id=promotion.id).state == "pending" and not Adapter.objects.get(name="b").loaded
    # made active the usual way, the stale request is superseded and leaves the queue
    make_active(name="c", reason="someone loaded another by hand")
    superseded = Promotion.objects.get(id=promotion.id)
    assert superseded.state == "superseded" and superseded.reason.startswith("c was made active by the system")


def test_reject_needs_a_reason_and_records_the_decision(home):
    requester, reviewer, _ = users()
    published(home, "c")
    promotion = promotion_request(candidate="c", user=requester, reason="")
    for reason in ("", "   "):
        assert _code(lambda r=reason: promotion_reject(promotion_id=promotion.id, user=reviewer, reason=r)) \
            == "reason_required"
    assert _code(lambda: promotion_approve(promotion_id=promotion.id, user=reviewer, reason="")) == "reason_required"
    rejected = promotion_reject(promotion_id=promotion.id, user=reviewer, reason="the alarm is real")
    assert rejected.state == "rejected" and rejected.reason == "the alarm is real"
    row = Receipt.objects.get(kind="approval", subject="c")
    assert row.body["decision"] == "rejected" and row.body["actor"] == "reviewer"
    assert row.body["evidence_sha256"] == promotion.evidence_sha256
    assert not Adapter.objects.get(name="c").loaded
    assert _code(lambda: promotion_approve(promotion_id=promotion.id, user=reviewer, reason="ok")) \
        == "promotion_not_pending"


def test_applying_one_supersedes_the_other_pending_promotions_of_that_incumbent(home):
    requester, reviewer, _ = users()
    published(home, "inc", loaded=True)
    published(home, "x")
    published(home, "y")
    first = promotion_request(candidate="x", user=requester, reason="")
    second = promotion_request(candidate="y", user=requester, reason="")
    approve(second.id, reviewer, "y is better")
    first.refresh_from_db()
    assert first.state == "superseded" and str(second.id) in first.reason
    assert _code(lambda: promotion_approve(promotion_id=first.id, user=reviewer, reason="ok")) \
        == "promotion_not_pending"


def test_unknown_and_unpromotable_candidates(home):
    requester, reviewer, _ = users()
    assert _code(lambda: promotion_request(candidate="nope", user=requester)) == "adapter_not_found"
    published(home, "live", loaded=True)
    assert _code(lambda: promotion_request(candidate="live", user=requester)) == "adapter_active"
    assert _code(lambda: promotion_approve(promotion_id=999, user=reviewer, reason="x")) == "promotion_not_found"


def test_the_policy_defaults_to_on_in_a_team(settings):
    from core.accounts.services import user_create

    user_create(username="solo", password="long-enough-pw")
    assert approval_required() is False
    user_create(username="second", password="long-enough-pw")
    assert approval_required() is True
    policy(settings, require_approval=False)
    assert approval_required() is False


def test_the_claim_is_a_conditional_update_so_a_second_decision_finds_nothing(home):
    """What makes two concurrent approvals apply once, shown deterministically: the second decision's
    conditional UPDATE (state = pending) matches no row once the first has claimed it."""
    from django.db import transaction

    from adapters.promotions import _claim

    requester, reviewer, other = users()
    published(home, "c")
    promotion = promotion_request(candidate="c", user=requester, reason="")
    with transaction.atomic():
        claimed, row = _claim(promotion.id, "approved", reviewer, "first")
        assert claimed == 1 and row.state == "approved"
        with pytest.raises(KilnError) as caught:
            _claim(promotion.id, "approved", other, "second")
        assert caught.value.code == "promotion_not_pending"


def test_a_candidate_whose_bytes_changed_fails_the_promotion_with_a_reason(home):
    requester, reviewer, _ = users()
    published(home, "c")
    promotion = promotion_request(candidate="c", user=requester, reason="")
    Adapter.objects.filter(name="c").update(content_sha256="sha256:" + "f" * 64)
    assert _code(lambda: promotion_approve(promotion_id=promotion.id, user=reviewer, reason="ok")) \
        == "promotion_failed"
    promotion.refresh_from_db()
    assert promotion.state == "failed" and "content is now" in promotion.reason
    assert not Adapter.objects.get(name="c").loaded
    row = Receipt.objects.get(kind="approval", subject="c")  # the decision is recorded all the same
    assert row.body["decision"] == "approved" and row.body["candidate_content_sha256"] == promotion.content_sha256
