"""A reason is free text with the same bound as every other (2000 characters) and no control
characters but newline and tab: refused with validation_error over the API, in the services and on
the decision form, and nothing is decided or recorded."""

from __future__ import annotations

import pytest

from adapters.models import Promotion, PromotionState
from adapters.promotions import MAX_REASON_CHARS, promotion_reject, promotion_request
from core.errors import KilnError
from core.models import Receipt
from tests.promotions.support import client_for, error, published, send, users

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(home):
    requester, reviewer, _ = users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    return {"requester": requester, "reviewer": reviewer,
            **{f"{name}_api": client_for(name) for name in ("requester", "reviewer")}}


BAD = [("x" * (MAX_REASON_CHARS + 1), f"reason: at most {MAX_REASON_CHARS} characters, got {MAX_REASON_CHARS + 1}"),
       ("ok\x00then", "reason: must not contain control characters (found U+0000 at 2)"),
       ("\x1b[31mred", "reason: must not contain control characters (found U+001B at 0)"),
       ("bell\x07", "reason: must not contain control characters (found U+0007 at 4)"),
       ("c1\x85next line", "reason: must not contain control characters (found U+0085 at 2)")]


@pytest.mark.parametrize("reason, message", BAD)
def test_the_decision_routes_refuse_a_bad_reason_and_decide_nothing(team, reason, message):
    pid = send(team["requester_api"], "/v1/promotions", {"candidate": "cand"}).json()["id"]
    receipts = Receipt.objects.count()
    for decision in ("approve", "reject"):
        got = error(send(team["reviewer_api"], f"/v1/promotions/{pid}/{decision}", {"reason": reason}),
                    422, "validation_error")
        assert got == message
    assert Promotion.objects.get(id=pid).state == PromotionState.PENDING
    assert Receipt.objects.count() == receipts


@pytest.mark.parametrize("reason, message", BAD)
def test_the_request_route_refuses_a_bad_reason(team, reason, message):
    assert error(send(team["requester_api"], "/v1/promotions", {"candidate": "cand", "reason": reason}),
                 422, "validation_error") == message
    assert Promotion.objects.count() == 0


def test_the_activate_route_refuses_a_bad_reason(team):
    response = send(team["reviewer_api"], "/v1/adapters/cand/activate", {"reason": "a\x00b"})
    assert error(response, 422, "validation_error") == "reason: must not contain control characters (found U+0000 at 1)"
    assert Promotion.objects.count() == 0


def test_the_longest_reason_with_newlines_and_tabs_is_kept_whole(team):
    reason = ("line one\n\tindented\n" + "y" * MAX_REASON_CHARS)[:MAX_REASON_CHARS]
    promotion = promotion_request(candidate="cand", user=team["requester"], reason=reason)
    assert promotion.request_reason == reason
    # A browser's textarea sends CRLF line breaks: one character each, stored as newlines.
    typed = reason.replace("\n", "\r\n")
    assert len(typed) > MAX_REASON_CHARS
    rejected = promotion_reject(promotion_id=promotion.id, user=team["reviewer"], reason=typed)
    assert rejected.state == PromotionState.REJECTED and rejected.reason == reason
    assert len(rejected.reason) == MAX_REASON_CHARS


def test_a_lone_carriage_return_is_refused(team):
    with pytest.raises(KilnError) as refused:
        promotion_request(candidate="cand", user=team["requester"], reason="done\rfake line")
    assert (refused.value.code, refused.value.status, refused.value.field) == ("validation_error", 422, "reason")
    assert refused.value.message == "reason: must not contain control characters (found U+000D at 4)"


def test_blank_is_still_reason_required(team):
    promotion = promotion_request(candidate="cand", user=team["requester"])
    with pytest.raises(KilnError) as refused:
        promotion_reject(promotion_id=promotion.id, user=team["reviewer"], reason=" \n ")
    assert (refused.value.code, refused.value.status) == ("reason_required", 400)


def test_the_decision_form_shows_the_refusal(team):
    from django.test import Client

    promotion = promotion_request(candidate="cand", user=team["requester"])
    browser = Client()
    browser.force_login(team["reviewer"])
    response = browser.post(f"/ui/promotions/{promotion.id}/reject/", {"reason": "no\x00pe"})
    assert response.status_code == 422
    html = response.content.decode()
    assert "validation_error" in html and "must not contain control characters (found U+0000 at 2)" in html
    assert Promotion.objects.get(id=promotion.id).state == PromotionState.PENDING
