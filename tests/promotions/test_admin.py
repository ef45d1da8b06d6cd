"""Promotions in /admin/: listed and shown read-only."""

from __future__ import annotations

import pytest

from adapters.promotions import promotion_request
from tests.promotions.support import published

pytestmark = pytest.mark.django_db


def test_admin_lists_and_shows_promotions_read_only(admin_client, home):
    published(home, "cand")
    promotion = promotion_request(candidate="cand", reason="round one")
    listing = admin_client.get("/admin/adapters/promotion/")
    assert listing.status_code == 200 and b"cand" in listing.content
    detail = admin_client.get(f"/admin/adapters/promotion/{promotion.pk}/change/")
    assert detail.status_code == 200 and promotion.evidence_sha256.encode() in detail.content
    assert admin_client.post(f"/admin/adapters/promotion/{promotion.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin_client.get("/admin/adapters/promotion/add/").status_code == 403
