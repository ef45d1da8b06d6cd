"""An interrupted or cancelled job's hint fits its kind: only a training run resumes from a checkpoint."""

import pytest

from core.jobs.error_hints import job_error
from core.jobs.models import Job, JobState

pytestmark = pytest.mark.django_db


def _failed(kind: str, code: str) -> Job:
    return Job.objects.create(kind=kind, queue="control", payload={}, state=JobState.FAILED, error_code=code,
                              error_message="its worker stopped while the job was running")


def test_job_interrupted_hint_is_per_kind():
    training = job_error(_failed("training.grpo", "job_interrupted"))["hint"]
    assert "resumes from its latest_checkpoint with resume_checkpoint" in training
    evaluation = job_error(_failed("eval.run", "job_interrupted"))["hint"]
    assert "run the evaluation again" in evaluation and "kiln eval run" in evaluation
    assert "checkpoint" not in evaluation
    for kind in ("adapter.activate", "rollouts.generate", "training.post_eval", "openenv.run"):
        hint = job_error(_failed(kind, "job_interrupted"))["hint"]
        assert hint == "its worker stopped while it ran (kill, restart, out of memory); submit it again", kind


def test_job_cancelled_hint_names_a_checkpoint_only_for_training():
    assert "latest_checkpoint" in job_error(_failed("training.grpo", "job_cancelled"))["hint"]
    assert job_error(_failed("eval.run", "job_cancelled"))["hint"] == "it was cancelled on request; resubmit it"
