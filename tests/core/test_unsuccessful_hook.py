"""A kind's `on_unsuccessful` hook sees the job as it ended (state and error code), not as it was
loaded: the OpenEnv run hook decides `run_interrupted` from `error_code == "job_interrupted"`, and a
stale object made a real restart report `orchestration_failed` instead
(tests/integration/test_openenv_restart.py)."""

from __future__ import annotations

import pytest

from core.jobs.models import Job, JobState
from core.jobs.services import job_fail, job_submit, jobs_fail_interrupted
from tests.support import job_kinds

pytestmark = pytest.mark.django_db


def _running() -> Job:
    job = job_submit(kind="test.hooked", payload={"steps": 1}, user=None, title="hooked")
    Job.objects.filter(id=job.id).update(state=JobState.RUNNING, worker_id="gone")
    return Job.objects.get(id=job.id)


def test_the_hook_sees_the_interrupted_state_and_code(django_capture_on_commit_callbacks):
    job_kinds.UNSUCCESSFUL_SEEN.clear()
    first, second = _running(), _running()
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_fail_interrupted(job_ids=[first.id], reason="its worker stopped") == 1
        assert job_fail(job=second, code="test_failure", message="on purpose")
    assert job_kinds.UNSUCCESSFUL_SEEN == [(first.id, JobState.FAILED, "job_interrupted"),
                                           (second.id, JobState.FAILED, "test_failure")]
