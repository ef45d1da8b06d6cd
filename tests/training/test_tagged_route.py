"""POST /v1/train (the body's `kind` picks the training) and the sibling routes /v1/train/sft and
/v1/train/opd, which this Kiln declares and refuses with 501 rather than fake."""

import json

import pytest

from adapters.models import Adapter
from core.jobs.models import Job
from tests.training.conftest import GROUP

pytestmark = pytest.mark.django_db


def _post(api, route, body):
    return api.post(route, data=json.dumps(body), content_type="application/json")


def _error(response, status, code):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body["error"]) == {"code", "message", "hint"} and body["error"]["code"] == code, body
    return body["error"]


def test_kind_grpo_queues_the_same_job_as_the_grpo_route(api):
    body = {"kind": "grpo", "groups": [GROUP], "config": {"output_name": "tagged-r001", "seed": 11}}
    answer = _post(api, "/v1/train", body)
    assert answer.status_code == 200, answer.content
    answer = answer.json()
    assert answer["picked"] == "grpo"
    assert answer["training"]["state"] == "queued" and answer["training"]["effective_seed"] == "11"
    job = Job.objects.get(uuid=answer["training"]["job_id"])
    assert (job.kind, job.payload["adapter_name"], job.payload["route"]) == (
        "training.grpo", "tagged-r001", "/v1/train/grpo")  # its replay is a POST to the GRPO route
    assert Adapter.objects.get(name="tagged-r001").state == "writing"
    # A dry run through the tagged route plans and queues nothing.
    dry = _post(api, "/v1/train", dict(body, dry_run=True, config={"output_name": "tagged-r002"})).json()
    assert dry["picked"] == "grpo" and dry["training"]["would_publish"] == "tagged-r002"
    assert Job.objects.count() == 1
    # The GRPO route's own validation answers through it, with the offending field.
    bad = _error(_post(api, "/v1/train", {"kind": "grpo", "config": {"output_name": "x"}}), 400,
                 "training_invalid_request")
    assert Job.objects.count() == 1, bad


def test_sft_and_opd_are_declared_and_refused_with_501(api):
    for route, body in (("/v1/train/sft", {}), ("/v1/train/opd", {"groups": [GROUP]}),
                        ("/v1/train", {"kind": "sft"}), ("/v1/train", {"kind": "opd"})):
        error = _error(_post(api, route, body), 501, "not_implemented")
        assert "not implemented by this Kiln" in error["message"] and "/v1/train/grpo" in error["hint"]
    for kind in (None, "ppo", 3, ["grpo"], {"kind": "grpo"}):
        error = _error(_post(api, "/v1/train", {"kind": kind, "groups": [GROUP]}), 400, "training_invalid_request")
        assert error["message"].startswith("kind:") and "grpo" in error["hint"]
    assert not Job.objects.exists() and not Adapter.objects.exists()


def test_the_tagged_routes_need_the_submit_permission(db):
    from django.test import Client

    anonymous = Client(raise_request_exception=False)
    for route, body in (("/v1/train", {"kind": "grpo", "groups": [GROUP]}), ("/v1/train/sft", {})):
        assert _post(anonymous, route, body).status_code in (401, 403)
    assert not Job.objects.exists()
