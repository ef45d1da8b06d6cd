"""Kiln's Prometheus metrics (core.metrics): closed label sets, counters as rows counted in the
caller's transaction, gauges read at scrape time, and GET /metrics with the API's auth, parsed by
Prometheus's own text parser (prometheus_client)."""

from __future__ import annotations

import math
import threading

import pytest
from django.db import close_old_connections, transaction
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from core.accounts.services import token_create, user_create
from core.metrics import families
from core.metrics.families import MetricError, register, series_key
from core.metrics.selectors import CONTENT_TYPE, exposition
from core.metrics.services import counter_add
from tests.support.metrics import samples as scrape


@pytest.fixture
def test_families():
    """Families declared for one test, removed after it (the registry is the process's)."""
    before = dict(families._FAMILIES)
    register("kiln_test_events_total", "counter", "Test events by colour.", colour=("red", "blue"))
    register("kiln_test_plain_total", "counter", "Test events without labels.")
    yield
    families._FAMILIES.clear()
    families._FAMILIES.update(before)


# --- declarations ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, kind, help_text, labels, says", [
    ("events_total", "counter", "h", {}, "must match"),  # no kiln_ prefix
    ("kiln_events", "counter", "h", {}, "ends in _total"),
    ("kiln_events_total", "histogram", "h", {}, "kind must be"),
    ("kiln_events_total", "counter", "", {}, "help text"),
    ("kiln_events_total", "counter", "two\nlines", {}, "help text"),
    ("kiln_events_total", "counter", "h", {"Colour": ("red",)}, "label name"),
    ("kiln_events_total", "counter", "h", {"colour": ()}, "at least one value"),
    ("kiln_events_total", "counter", "h", {"colour": ('re"d',)}, "plain word"),
    ("kiln_events_total", "counter", "h", {"url": ("http://x/y z",)}, "plain word"),
])
def test_a_bad_declaration_is_refused(name, kind, help_text, labels, says):
    with pytest.raises(MetricError, match=says):
        register(name, kind, help_text, **labels)
    assert name not in families._FAMILIES


def test_a_series_takes_exactly_the_declared_labels_with_closed_values(test_families):
    assert series_key("kiln_test_events_total", {"colour": "red"}) == 'colour="red"'
    assert series_key("kiln_test_plain_total", {}) == ""
    assert families.labels_of('colour="red"') == {"colour": "red"} and families.labels_of("") == {}
    with pytest.raises(MetricError, match="not a value"):
        series_key("kiln_test_events_total", {"colour": "green"})
    with pytest.raises(MetricError, match="takes labels"):
        series_key("kiln_test_events_total", {})
    with pytest.raises(MetricError, match="takes labels"):
        series_key("kiln_test_events_total", {"colour": "red", "run_id": "abc"})
    with pytest.raises(MetricError, match="no metric family"):
        series_key("kiln_test_unknown_total", {})
    register("kiln_test_events_total", "counter", "Test events by colour.", colour=("red", "blue"))  # the same again
    with pytest.raises(MetricError, match="already declared differently"):
        register("kiln_test_events_total", "counter", "Test events by colour.", colour=("red",))


# --- counting ----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_counters_accumulate_and_render_for_prometheus(test_families):
    counter_add("kiln_test_events_total", colour="red")
    counter_add("kiln_test_events_total", 2.5, colour="red")
    counter_add("kiln_test_events_total", 0, colour="blue")
    counter_add("kiln_test_plain_total", 7)
    samples = scrape(exposition())
    assert samples[("kiln_test_events_total", frozenset({("colour", "red")}))] == 3.5
    # a small family lists its series before their first event
    assert samples[("kiln_test_events_total", frozenset({("colour", "blue")}))] == 0
    assert samples[("kiln_test_plain_total", frozenset())] == 7
    text = exposition()
    assert "# TYPE kiln_test_events_total counter" in text and 'kiln_test_plain_total 7\n' in text


@pytest.mark.django_db
@pytest.mark.parametrize("amount", [-1, math.nan, math.inf, True, "2"])
def test_a_counter_never_goes_down_or_takes_a_non_number(test_families, amount):
    with pytest.raises(MetricError, match="finite amount"):
        counter_add("kiln_test_plain_total", amount)
    assert scrape(exposition())[("kiln_test_plain_total", frozenset())] == 0


@pytest.mark.django_db
def test_a_gauge_cannot_be_counted(test_families):
    with pytest.raises(MetricError, match="not a counter"):
        counter_add("kiln_jobs", kind="other", state="queued")


@pytest.mark.django_db
def test_a_count_commits_or_rolls_back_with_the_change_it_counts(test_families):
    with pytest.raises(RuntimeError), transaction.atomic():
        counter_add("kiln_test_plain_total", 5)
        raise RuntimeError("the counted change failed")
    counter_add("kiln_test_plain_total", 1)
    assert scrape(exposition())[("kiln_test_plain_total", frozenset())] == 1


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_concurrent_first_counts_of_one_series_lose_nothing(test_families):
    """Eight threads race to create the series' row and then keep counting: the total is exact
    (the integration lane runs this on PostgreSQL)."""
    start = threading.Barrier(8)
    errors = []

    def count():
        try:
            start.wait()
            for _ in range(25):
                counter_add("kiln_test_events_total", colour="blue")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert scrape(exposition())[("kiln_test_events_total", frozenset({("colour", "blue")}))] == 200


# --- gauges ------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_jobs_gauge_counts_rows_by_kind_and_state():
    from django.utils import timezone

    from core.jobs.models import Job

    for state in ("queued", "queued", "failed"):
        Job.objects.create(kind="adapter.activate", queue="control", state=state)
    Job.objects.create(kind="adapter.activate", queue="control", state="failed", deleted_at=timezone.now())
    Job.objects.create(kind="plugin.gone", queue="control", state="completed")  # its module is no longer loaded
    samples = scrape(exposition())

    def jobs(kind, state):
        return samples.get(("kiln_jobs", frozenset({("kind", kind), ("state", state)})), 0)

    assert (jobs("adapter.activate", "queued"), jobs("adapter.activate", "failed")) == (2, 1)
    assert jobs("other", "completed") == 1 and jobs("training.grpo", "queued") == 0
    assert not any(dict(labels).get("kind") == "plugin.gone" for _, labels in samples)


@pytest.mark.django_db
def test_a_registered_kind_whose_name_is_no_plain_word_is_other_not_a_failed_scrape(monkeypatch):
    from core.jobs import kinds
    from core.jobs.models import Job

    odd = 'my plugin "v2"'
    monkeypatch.setitem(kinds._KINDS, odd, kinds.JobKind(name=odd, queue="control", handler="x:y"))
    Job.objects.create(kind=odd, queue="control", state="queued")
    samples = scrape(exposition())
    assert samples[("kiln_jobs", frozenset({("kind", "other"), ("state", "queued")}))] == 1


# --- the route ---------------------------------------------------------------------------------

@pytest.mark.django_db
def test_get_metrics_needs_the_apis_credentials(client, settings):
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized" and refused.json()["error"]["hint"]
    user_create(username="alice", password="long-enough-pw")
    api = Client(headers={"Authorization": f"Bearer {token_create(username='alice')[1]}"})
    response = api.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"] == CONTENT_TYPE
    assert response["Cache-Control"] == "no-store"
    names = {family.name for family in text_string_to_metric_families(response.content.decode())}
    assert {"kiln_jobs", "kiln_openenv_tracked_runs", "kiln_openenv_runs", "kiln_openenv_episode_terminations"} <= names
    head = api.head("/metrics")
    assert head.status_code == 200 and head.content == b"" and int(head["Content-Length"]) > 0
    posted = api.post("/metrics")
    assert posted.status_code == 405 and posted.json()["error"]["code"] == "method_not_allowed"
    assert posted["Allow"] == "GET, HEAD"


@pytest.mark.django_db
def test_programs_on_this_machine_scrape_without_a_token_where_the_demo_allows_it(client, settings):
    from dataclasses import replace

    settings.KILN = replace(settings.KILN, allow_anonymous_api=True)
    assert client.get("/metrics").status_code == 200  # the test client's REMOTE_ADDR is 127.0.0.1
    assert client.get("/metrics", headers={"Origin": "http://evil.example"}).status_code == 401


# --- counts kept in memory (the inference hot path) ---------------------------------------------

@pytest.mark.django_db
def test_a_buffer_writes_its_counts_only_when_it_flushes_and_keeps_them_when_a_write_fails(test_families,
                                                                                         monkeypatch):
    from django.db import OperationalError

    from core.metrics import services
    from core.metrics.services import CounterBuffer

    buffer = CounterBuffer()
    buffer.add("kiln_test_events_total", colour="red")
    buffer.add("kiln_test_events_total", 2, colour="red")
    with pytest.raises(MetricError):
        buffer.add("kiln_test_events_total", colour="green")  # refused at once, like counter_add
    assert buffer.pending() == {("kiln_test_events_total", 'colour="red"'): 3.0}
    assert scrape(exposition())[("kiln_test_events_total", frozenset({("colour", "red")}))] == 0

    real_add = services._add

    def disk_full(*args):
        raise OperationalError("database or disk is full")

    monkeypatch.setattr(services, "_add", disk_full)
    assert buffer.flush() is False
    buffer.add("kiln_test_events_total", colour="red")  # counted while the write failed
    assert buffer.pending() == {("kiln_test_events_total", 'colour="red"'): 4.0}
    monkeypatch.setattr(services, "_add", real_add)
    assert buffer.flush() is True and buffer.pending() == {}
    assert scrape(exposition())[("kiln_test_events_total", frozenset({("colour", "red")}))] == 4


@pytest.mark.django_db(transaction=True)
def test_a_started_buffer_writes_from_its_own_thread_and_at_its_stop(test_families):
    import time

    from core.metrics.services import CounterBuffer

    buffer = CounterBuffer(interval=0.05)
    buffer.start()
    try:
        buffer.add("kiln_test_plain_total", 5)
        deadline = time.monotonic() + 10
        while buffer.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scrape(exposition())[("kiln_test_plain_total", frozenset())] == 5
    finally:
        buffer.stop()
    buffer.add("kiln_test_plain_total", 2)
    buffer.stop()  # stopped already: it writes what is left
    assert scrape(exposition())[("kiln_test_plain_total", frozenset())] == 7


def test_the_gate_family_names_every_outcome_both_gates_decide():
    from evaluations.gate import GATE_OUTCOMES
    from evaluations.metrics import OUTCOMES
    from openenv.environment_gate import OUTCOMES as ENVIRONMENT_OUTCOMES

    assert set(OUTCOMES) == set(GATE_OUTCOMES) | set(ENVIRONMENT_OUTCOMES)


@pytest.mark.django_db
def test_a_gate_outcome_outside_the_family_is_logged_never_raised(caplog):
    from core.metrics.models import MetricCounter
    from evaluations.metrics import count_gate_decision

    count_gate_decision("environment", "promoted")
    count_gate_decision("environment", "exploded")
    assert "outside kiln_gate_decisions_total" in caplog.text
    assert dict(MetricCounter.objects.values_list("labels", "value")) == {'gate="environment",outcome="promoted"': 1}


@pytest.mark.django_db
def test_a_scrape_without_a_database_is_503_with_the_envelope(client, settings, monkeypatch):
    from dataclasses import replace

    from django.db import OperationalError

    settings.KILN = replace(settings.KILN, allow_anonymous_api=True)

    def unreachable():
        raise OperationalError("could not connect to server")

    monkeypatch.setattr("kiln_project.urls.exposition", unreachable)
    response = client.get("/metrics")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "metrics_unavailable" and "could not connect" in error["message"] and error["hint"]
