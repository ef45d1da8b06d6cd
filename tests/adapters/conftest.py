"""The adapter tests' fixtures (defined in tests/adapters/support.py with the helpers)."""

from tests.adapters.support import api, home, make_client, peft_adapter  # noqa: F401
