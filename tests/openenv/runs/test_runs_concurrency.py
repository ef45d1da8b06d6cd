"""Concurrent identical POSTs create exactly one run (reference-spec §4.9): eight threads submit the
same keyed request at once through the service; the unique key (and the serialized admission)
make one of them create the run and every other one answer the original. Nothing executes."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from core.errors import KilnError
from core.jobs.models import Job
from openenv.models import OpenEnvRun
from openenv.runs.request import normalize
from openenv.runs.services import run_submit
from tests.openenv.runs.conftest import rollout_body

pytestmark = [pytest.mark.timeout(120)]

THREADS = 8


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_posts_create_exactly_one_run(home):
    request = normalize(rollout_body("http://127.0.0.1:9", idempotency_key="race:1"))
    barrier = threading.Barrier(THREADS)
    outcomes = []

    def submit():
        try:
            barrier.wait(timeout=10)
            run, created = run_submit(request=request)
            outcomes.append((str(run.id), created))
        except KilnError as exc:
            outcomes.append(("error", exc.code))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcomes.append(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == THREADS and not [o for o in outcomes if o[0] == "error"], outcomes
    [run] = OpenEnvRun.objects.all()
    assert {run_id for run_id, _ in outcomes} == {str(run.id)}
    assert sorted(created for _, created in outcomes) == [False] * (THREADS - 1) + [True]
    assert Job.objects.filter(kind="openenv.run").count() == 1 and run.state == "discovering"
    # A changed request under the same key, meanwhile, is a conflict.
    with pytest.raises(KilnError) as caught:
        run_submit(request=normalize(rollout_body("http://127.0.0.1:9", idempotency_key="race:1", groups=3)))
    assert caught.value.code == "openenv_run_idempotency_conflict" and caught.value.status == 409
