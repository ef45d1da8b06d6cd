"""The sampler thread's registry look-up survives a dropped database connection.

The GPU worker's sampler thread lives as long as the worker, and no request cycle recycles its
connection: after a PostgreSQL restart, failover or idle timeout its connection is dead. The look-up
opens a new one once; a database that stays down is `registry_unavailable` (503), and the serving
canary then says it could not run instead of quarantining a healthy adapter."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from adapters.serving import runtime_host
from adapters.serving.limits import hint_for
from gpu_runtime.sample_types import SampleRequestError
from tests.promotions.support import home, published  # noqa: F401 - home is a fixture


def _failing_then(monkeypatch, failures: int):
    import adapters.selectors as selectors

    real = selectors.adapter_served_bytes
    calls = {"n": 0}

    def flaky(*, name):
        calls["n"] += 1
        if calls["n"] <= failures:
            raise OperationalError("terminating connection due to administrator command")
        return real(name=name)

    monkeypatch.setattr(selectors, "adapter_served_bytes", flaky)
    return calls


@pytest.mark.django_db(transaction=True)  # the sampler thread is in no transaction: closing is allowed
def test_a_dropped_connection_is_opened_again_once(home, monkeypatch):  # noqa: F811
    adapter = published(home, "math-r001")
    calls = _failing_then(monkeypatch, failures=1)
    path, digest = runtime_host.served_adapter_bytes("math-r001")
    assert (str(path), digest) == (adapter.path, adapter.content_sha256)
    assert calls["n"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_database_that_stays_down_is_registry_unavailable_not_a_missing_adapter(home, monkeypatch):  # noqa: F811
    published(home, "math-r001")
    _failing_then(monkeypatch, failures=2)
    with pytest.raises(SampleRequestError) as caught:
        runtime_host.served_adapter_bytes("math-r001")
    assert caught.value.code == "registry_unavailable"
    assert "math-r001" in str(caught.value) and "administrator command" in str(caught.value)
    assert runtime_host._STATUS["registry_unavailable"] == 503 and "GET /health" in hint_for("registry_unavailable")


def test_the_adapter_cache_passes_the_resolvers_diagnosis_through():
    from gpu_runtime.adapters import AdapterManager

    def resolver(name):
        raise SampleRequestError("registry_unavailable", f"the adapter registry could not be read for {name!r}")

    cache = AdapterManager.__new__(AdapterManager)
    cache._resolver = resolver
    with pytest.raises(SampleRequestError) as caught:
        cache._resolve_path("math-r001")
    assert caught.value.code == "registry_unavailable"


def test_the_canary_does_not_judge_an_adapter_on_a_registry_outage():
    from adapters.canary import ADAPTER_FAULTS

    assert "registry_unavailable" not in ADAPTER_FAULTS


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_terminated_postgresql_backend_is_replaced(home):  # noqa: F811
    if connection.vendor != "postgresql":
        pytest.skip("terminates a PostgreSQL backend (the integration lane runs on PostgreSQL)")
    adapter = published(home, "math-r001")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [(pid,)] = cursor.fetchall()
    from django.db import connections

    # Another connection ends ours, as a server restart or an administrator would.
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    path, digest = runtime_host.served_adapter_bytes("math-r001")
    assert (str(path), digest) == (adapter.path, adapter.content_sha256)
