"""Fixtures for dashboard tests: users with and without the submit_job permission, logged-in clients."""

from __future__ import annotations

import pytest
from django.test import Client

from core.accounts.services import user_create

PASSWORD = "correct-horse-42"


@pytest.fixture
def operator(db):
    """A user who may submit and cancel work (what `kiln user create` makes by default)."""
    return user_create(username="operator", password=PASSWORD)


@pytest.fixture
def viewer(db):
    """A user who may look but not submit or cancel."""
    return user_create(username="viewer", password=PASSWORD, can_submit=False)


@pytest.fixture
def operator_client(operator) -> Client:
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(viewer) -> Client:
    client = Client()
    client.force_login(viewer)
    return client
