"""A database that refuses writes (SQLite on a full disk): reads go on, and a job's end is recorded
once the database takes writes again, with the disk-full code, instead of the row staying running."""

from __future__ import annotations

import errno

import pytest
from django.db import OperationalError
from django.db.models import QuerySet
from django.test import Client

from core.accounts.models import ApiToken
from core.accounts.services import token_create, user_create
from core.errors import DISK_FULL_CODE
from core.jobs import runner, services
from core.jobs.kinds import JobKind, register_job_kind
from core.jobs.models import Job

pytestmark = pytest.mark.django_db

FULL = "database or disk is full"


def run_disk_full(ctx) -> dict:
    raise OSError(errno.ENOSPC, "No space left on device")  # e.g. a checkpoint write


register_job_kind(JobKind(name="test.disk_full", queue="control",
                          handler="tests.foundation.test_database_full:run_disk_full"))


def test_an_authenticated_read_answers_while_the_token_bookkeeping_cannot_be_written(monkeypatch):
    user_create(username="reader", password="long-enough-pw")
    secret = token_create(username="reader")[1]
    job = services.job_submit(kind="test.steps", payload={})
    real_update = QuerySet.update

    def refuse_token_writes(self, **fields):
        if self.model is ApiToken:
            raise OperationalError(FULL)
        return real_update(self, **fields)

    monkeypatch.setattr(QuerySet, "update", refuse_token_writes)
    api = Client(headers={"Authorization": f"Bearer {secret}"}, raise_request_exception=False)
    for _ in range(2):  # also after the first failure was logged
        response = api.get(f"/v1/jobs/{job.uuid}")
        assert response.status_code == 200, response.content
        assert response.json()["id"] == str(job.uuid)
    assert ApiToken.objects.get().last_used_at is None

    monkeypatch.setattr(QuerySet, "update", real_update)
    assert api.get(f"/v1/jobs/{job.uuid}").status_code == 200
    assert ApiToken.objects.get().last_used_at is not None  # recorded again once writes work


def _refuse_finishing(monkeypatch, times: int) -> list:
    """services._finish raises the full disk's OperationalError `times` times, then works."""
    real_finish, calls = services._finish, []

    def flaky(job, state, **fields):
        calls.append(state)
        if len(calls) <= times:
            raise OperationalError(FULL)
        return real_finish(job, state, **fields)

    monkeypatch.setattr(services, "_finish", flaky)
    return calls


def test_a_job_end_refused_by_a_full_database_is_recorded_once_writes_work_again(monkeypatch):
    calls = _refuse_finishing(monkeypatch, times=3)
    sleeps = []
    monkeypatch.setattr(runner, "_sleep", sleeps.append)
    job = services.job_submit(kind="test.disk_full", payload={})
    runner.run_queued_jobs("control")  # the worker thread does not die
    job.refresh_from_db()
    assert (job.state, job.error_code) == ("failed", DISK_FULL_CODE)
    assert "No space left on device" in job.error_message
    assert calls == ["failed"] * 4 and sleeps == [1.0, 2.0, 4.0]  # backoff between the refused tries


def test_a_handler_stopped_by_the_database_being_full_fails_with_the_disk_full_code(monkeypatch):
    def progress_refused(ctx):
        raise OperationalError(FULL)  # its progress write, on the same full disk

    monkeypatch.setattr(JobKind, "load_handler", lambda self: progress_refused)
    monkeypatch.setattr(runner, "_sleep", lambda seconds: None)
    _refuse_finishing(monkeypatch, times=1)
    job = services.job_submit(kind="test.disk_full", payload={})
    runner.run_queued_jobs("control")
    job.refresh_from_db()
    assert (job.state, job.error_code, job.error_message) == ("failed", DISK_FULL_CODE, f"OperationalError: {FULL}")


def test_recording_gives_up_after_its_bound_without_killing_the_worker(monkeypatch):
    calls = _refuse_finishing(monkeypatch, times=10**6)
    sleeps = []
    monkeypatch.setattr(runner, "_sleep", sleeps.append)
    monkeypatch.setattr(runner, "RECORD_RETRY_TOTAL_SECONDS", 60.0)
    job = services.job_submit(kind="test.disk_full", payload={})
    runner.run_queued_jobs("control")  # returns: no unhandled exception
    job.refresh_from_db()
    assert job.state == "running"  # left to restart recovery (job_interrupted)
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0, 10.0] and len(calls) == 9


def test_recording_stops_trying_when_the_worker_shuts_down(monkeypatch):
    calls = _refuse_finishing(monkeypatch, times=10**6)
    monkeypatch.setattr(runner, "_sleep", lambda seconds: runner.request_shutdown())
    monkeypatch.setattr(runner, "_shutting_down", runner.threading.Event())
    job = services.job_submit(kind="test.disk_full", payload={})
    runner.run_queued_jobs("control")
    assert len(calls) == 2 and Job.objects.get(id=job.id).state == "running"


def test_a_failure_receipt_the_database_cannot_take_leaves_the_training_error_to_record(tmp_path, monkeypatch):
    from training import runner as training_runner

    receipt = tmp_path / "failed.json"
    receipt.write_text('{"status": "failed"}')

    def refuse(**fields):
        raise OperationalError(FULL)

    monkeypatch.setattr(training_runner, "receipt_record", refuse)
    job = services.job_submit(kind="test.steps", payload={})
    training_runner._record_failure_receipt(receipt, "full-r001", job)  # logged, not raised
