"""The adapter tests' fixtures (defined in tests/adapters/support.py with the helpers)."""

import pytest  # noqa: E402

from tests.adapters.support import api, home, make_client, peft_adapter  # noqa: F401


@pytest.fixture(autouse=True)
def _stand_in_worker(canary_worker):
    """The serving canary is answered by a stand-in GPU worker (tests/support/canary.py)."""
    return canary_worker
