"""Two approvals at once apply the promotion exactly once: two threads on the test database, and a
strict variant (`integration`) for PostgreSQL (DATABASE_URL=postgres://...), where the second approval
waits on the row lock and then answers promotion_not_pending. The claim itself is tested
deterministically in test_services.py."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from adapters.models import AdapterTransition, Promotion
from adapters.promotions import promotion_approve, promotion_request
from core.errors import KilnError
from core.models import Receipt
from tests.promotions.support import published, users
from tests.support.canary import drain_activations


def _race(promotion_id: int, reviewers) -> list:
    barrier = threading.Barrier(len(reviewers))
    outcomes = []

    def approve(user):
        from django.db import connections

        try:
            barrier.wait(timeout=10)
            outcomes.append(promotion_approve(promotion_id=promotion_id, user=user, reason="race").state)
        except KilnError as exc:
            outcomes.append(exc.code)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcomes.append(f"{type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve, args=(user,)) for user in reviewers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_two_approvals_at_once_apply_once(home):
    requester, reviewer, other = users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    promotion = promotion_request(candidate="cand", user=requester, reason="")
    outcomes = _race(promotion.id, [reviewer, other])
    # Exactly one is approved (its activation job then applies it once). The other answers
    # promotion_not_pending; on the in-memory SQLite test database (shared cache, no busy timeout)
    # it may instead be refused the table lock outright.
    assert outcomes.count("approved") == 1, outcomes
    drain_activations()
    [loser] = [o for o in outcomes if o != "approved"]
    assert loser == "promotion_not_pending" or (connection.vendor == "sqlite" and "locked" in loser), outcomes
    assert Promotion.objects.get(id=promotion.id).state == "applied"
    assert Receipt.objects.filter(kind="approval", subject="cand").count() == 1
    assert AdapterTransition.objects.filter(adapter="cand", to_state="active").count() == 1


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_two_approvals_at_once_apply_once_on_postgresql(home):
    if connection.vendor != "postgresql":
        pytest.skip("set DATABASE_URL to a PostgreSQL database to run the row-lock variant")
    requester, *reviewers = users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    promotion = promotion_request(candidate="cand", user=requester, reason="")
    outcomes = _race(promotion.id, reviewers)
    assert sorted(outcomes) == ["approved", "promotion_not_pending"], outcomes
    drain_activations()
    applied = Promotion.objects.get(id=promotion.id)
    assert applied.state == "applied", applied.reason
    assert AdapterTransition.objects.filter(adapter="cand", to_state="active").count() == 1
