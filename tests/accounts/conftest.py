"""Fixtures of the delete-ownership tests: a private KILN_HOME, the users (admin, a superuser; bob, a
plain user; carol, a plain user holding jobs.delete_others_jobs), API and browser clients. The objects
they own are made by tests/accounts/support.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from core.accounts.services import token_create, user_create

PASSWORD = "long-enough-pw"


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    (tmp_path / "home" / "adapters").mkdir(parents=True)
    return tmp_path / "home"


@pytest.fixture
def users(db):
    admin = user_create(username="admin", password=PASSWORD, superuser=True)
    bob = user_create(username="bob", password=PASSWORD)
    carol = user_create(username="carol", password=PASSWORD)
    carol.user_permissions.add(Permission.objects.get(content_type__app_label="jobs", codename="delete_others_jobs"))
    return {"admin": admin, "bob": bob, "carol": carol}


@pytest.fixture
def api(users):
    """api(name): a Bearer-token client for that user."""
    def client(name: str) -> Client:
        return Client(headers={"Authorization": f"Bearer {token_create(username=name)[1]}"},
                      raise_request_exception=False)
    return client


@pytest.fixture
def browser(users):
    """browser(name): a logged-in /ui/ client for that user."""
    def client(name: str) -> Client:
        c = Client()
        c.force_login(users[name])
        return c
    return client
