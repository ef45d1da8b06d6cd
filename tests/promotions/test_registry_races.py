"""Check-then-write races on the adapter registry and the job queues, on PostgreSQL (`integration`;
the integration lane sets DATABASE_URL). READ COMMITTED lets two transactions that each read
"nothing else is loaded" (or "no promotion is open", "one job queued") both commit; core.db_locks
makes them take turns. Each test slows the step between the read and the commit so that, without
the lock, the two always overlap."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from adapters.models import Adapter, Promotion
from core.errors import KilnError
from tests.promotions.support import home, published, users  # noqa: F401 - home is a fixture

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL race (SQLite's IMMEDIATE transactions serialize writers anyway)")


def _slowed(monkeypatch, module, name: str, seconds: float = 0.4):
    real = getattr(module, name)

    def slow(*args, **kwargs):
        result = real(*args, **kwargs)
        time.sleep(seconds)
        return result

    monkeypatch.setattr(module, name, slow)


def _together(*calls, stagger: float = 0.0) -> list:
    """Run each call in its own thread (its own connection); the outcome of each, in order."""
    outcomes = [None] * len(calls)

    def run(index, call):
        try:
            time.sleep(stagger * index)
            outcomes[index] = call()
        except KilnError as exc:
            outcomes[index] = exc.code
        except Exception as exc:  # noqa: BLE001 - reported by the assertion
            outcomes[index] = f"{type(exc).__name__}: {exc}"
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def test_two_activations_at_once_leave_one_active_adapter(home, monkeypatch):  # noqa: F811
    import adapters.services as adapter_services
    from adapters.activation import make_active

    published(home, "inc", loaded=True)
    published(home, "a")
    published(home, "b")
    _slowed(monkeypatch, adapter_services, "transition_record")

    def activate(name):
        def call():
            with transaction.atomic():
                return make_active(name=name, reason="race").name
        return call

    outcomes = _together(activate("a"), activate("b"))
    assert sorted(outcomes) == ["a", "b"], outcomes
    assert list(Adapter.objects.filter(loaded=True).values_list("name", flat=True)) in (["a"], ["b"])


def test_a_delete_racing_a_promotion_request_never_leaves_it_open_on_a_deleted_adapter(home, monkeypatch):  # noqa: F811
    import adapters.promotions as promotions
    from adapters.promotions import promotion_request
    from adapters.services import adapter_delete

    requester, _, _ = users()
    published(home, "cand")
    _slowed(monkeypatch, promotions, "promotion_evidence")
    outcomes = _together(lambda: promotion_request(candidate="cand", user=requester, reason="").state,
                         lambda: adapter_delete(name="cand")["status"], stagger=0.15)
    assert outcomes == ["pending", "adapter_promotion_open"], outcomes
    assert Adapter.objects.filter(name="cand").exists()
    assert Promotion.objects.get(candidate="cand").state == "pending"


def test_the_queue_cap_holds_when_submissions_race(monkeypatch):
    from core.jobs import services
    from core.jobs.models import Job

    _slowed(monkeypatch, services, "_event")
    submit = lambda: services.job_submit(kind="test.steps", payload={}, max_queued=1).state  # noqa: E731
    outcomes = _together(submit, submit, submit)
    assert outcomes.count("queued") == 1, outcomes
    assert all(o == "queued" or str(o).endswith("queue_full") for o in outcomes), outcomes
    assert Job.objects.filter(state="queued").count() == 1
