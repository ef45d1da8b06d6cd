"""Job kinds declare typed payloads: what admission decided crosses the queue as plain data and reads
back as the same typed value."""

import json

import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from core.jobs.kinds import get_job_kind
from core.jobs.models import Job
from tests.training.conftest import GROUP
from training.payloads import GrpoJobPayload

pytestmark = pytest.mark.django_db



def test_a_grpo_job_payload_round_trips_through_the_row(settings, tmp_path):
    from dataclasses import replace

    from evaluations.suite_services import suite_store

    settings.KILN = replace(settings.KILN, home=tmp_path / "home")

    suite_store(body={"name": "math-held-out", "scorer": {"type": "exact"}, "examples": [
        {"id": "q1", "messages": [{"role": "user", "content": "What is 40 + 2?"}], "target": "42"}]})
    user_create(username="trainer", password="long-enough-pw")
    api = Client(headers={"Authorization": f"Bearer {token_create(username='trainer')[1]}"})
    body = {"groups": [GROUP], "config": {"output_name": "typed-r001", "seed": "18446744073709551615",
                                          "lora_rank": 4, "lora_alpha": 8},
            "post_eval": {"suite": "math-held-out", "min_accuracy": 0.5}}
    response = api.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    job = Job.objects.get(uuid=response.json()["job_id"])
    payload = get_job_kind("training.grpo").read_payload(job)
    assert isinstance(payload, GrpoJobPayload)
    assert payload.effective_seed == 2**64 - 1 and payload.config.lora_rank == 4
    assert payload.gate_pending and payload.post_eval.suite == "math-held-out"
    assert payload.post_eval_suite_hash.startswith("sha256:")  # pinned at submission
    assert payload.to_dict() == job.payload  # the stored dict is the typed value's plain form
    assert json.loads(json.dumps(job.payload)) == job.payload


def test_a_malformed_payload_never_reaches_the_queue():
    from core.jobs.services import job_submit

    with pytest.raises((KeyError, ValueError)):
        job_submit(kind="training.grpo", payload={"adapter_name": "x"})
    assert not Job.objects.exists()
