"""A resumed job that stops before its first new checkpoint names the checkpoint it resumed from as its
latest_checkpoint (the API detail, so `kiln train status`, and the job page): its hint says to resume
from there, so it must not show null."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from core.contracts.groups import admit_groups
from core.jobs.models import Job, JobState
from tests.training.conftest import GROUP

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def own_home(settings, tmp_path):
    """A KILN_HOME of this test's own: the checkpoints it writes are seen by no other test."""
    from dataclasses import replace

    settings.KILN = replace(settings.KILN, home=tmp_path / "home")


def _checkpoint(settings, step: int):
    folder = settings.KILN.layout.adapters / f"math-r001-checkpoint-step-{step:08d}.kiln-checkpoint"
    folder.mkdir(parents=True)
    manifest = {"adapter_name": "math-r001", "checkpoint_id": f"math-r001-step-{step:08d}-abc",
                "training_kind": "grpo", "created_at": "2025-01-01T00:00:00Z", "effective_config": {"seed": "7"},
                "progress": {"global_step": step, "total_steps": 8, "epoch_index": 0, "cursor_in_epoch": step},
                # the data the test resumes on: admission refuses a checkpoint of other data
                "data": {"source_kind": "inline", "content_sha256": admit_groups([GROUP]).sha256, "item_count": 1}}
    (folder / "checkpoint_manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_resumed_job_interrupted_before_a_new_checkpoint_names_the_one_it_resumed_from(api, settings):
    start = _checkpoint(settings, 2)
    queued = api.post("/v1/train/grpo", content_type="application/json", data=json.dumps(
        {"groups": [GROUP], "config": {"output_name": "math-r001", "resume_checkpoint": start.name}}))
    assert queued.status_code == 200, queued.content
    job_id = queued.json()["job_id"]
    Job.objects.filter(uuid=job_id).update(state=JobState.FAILED, error_code="job_interrupted",
                                           error_message="its worker stopped while the job was running")
    detail = api.get(f"/v1/train/jobs/{job_id}").json()
    assert detail["latest_checkpoint"]["resume_checkpoint"] == start.name
    assert detail["latest_checkpoint"]["global_step"] == 2
    assert "latest_checkpoint with resume_checkpoint" in detail["error"]["hint"]

    user = get_user_model().objects.get(username="trainer")
    page = Client()
    page.force_login(user)
    html = page.get(f"/ui/jobs/{job_id}/").content.decode()
    assert "<dt>Checkpoint</dt>" in html and "math-r001-step-00000002-abc" in html  # its checkpoint_id

    # Once the resumed run publishes its own checkpoint, that one is the latest.
    newer = _checkpoint(settings, 4)
    Job.objects.filter(uuid=job_id).update(metrics={"latest_checkpoint": str(newer)})
    assert api.get(f"/v1/train/jobs/{job_id}").json()["latest_checkpoint"]["resume_checkpoint"] == newer.name


def test_a_job_that_did_not_resume_and_wrote_no_checkpoint_has_none(api):
    queued = api.post("/v1/train/grpo", content_type="application/json",
                      data=json.dumps({"groups": [GROUP], "config": {"output_name": "fresh-r001"}}))
    job_id = queued.json()["job_id"]
    assert api.get(f"/v1/train/jobs/{job_id}").json()["latest_checkpoint"] is None
