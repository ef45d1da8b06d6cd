import pytest  # noqa: E402

from tests.promotions.support import home  # noqa: F401


@pytest.fixture(autouse=True)
def _stand_in_worker(canary_worker):
    """No model here: the serving canary is answered by a stand-in GPU worker (tests/support/canary.py)."""
    return canary_worker
