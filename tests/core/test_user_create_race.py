"""Two `kiln user create NAME` at once both pass the name check; the database refuses the second. It is
then the same `user_exists` refusal a sequential second creation gets, not a raw IntegrityError."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from core.accounts import services
from core.errors import KilnError


@pytest.mark.django_db
def test_a_name_taken_between_the_check_and_the_insert_is_user_exists(monkeypatch):
    services.user_create(username="bob", password="long-enough-pw")
    # the other creation committed after this one's check: the check passes, the insert clashes
    monkeypatch.setattr(services, "check_new_username", lambda username: None)
    with pytest.raises(KilnError) as refused:
        services.user_create(username="bob", password="another-password", can_approve=True)
    assert (refused.value.code, refused.value.message) == ("user_exists", "a user named 'bob' already exists")
    assert get_user_model().objects.filter(username="bob").count() == 1
    assert get_user_model().objects.get(username="bob").check_password("long-enough-pw")
