"""Shared by the /v1/train tests: an API client for a user with a token, and one small group."""

import pytest
from django.test import Client

from core.accounts.services import token_create, user_create

GROUP = {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
         "completions": [{"text": "5", "reward": 1.0}, {"text": "6", "reward": 0.0}]}


@pytest.fixture
def api():
    """A client for the user `trainer` (a server error comes back as a response, not an exception)."""
    user_create(username="trainer", password="long-enough-pw")
    return Client(headers={"Authorization": f"Bearer {token_create(username='trainer')[1]}"},
                  raise_request_exception=False)
