"""Objects for the delete-ownership tests, made as the product makes them: a trained adapter, an
uploaded one, a dataset and a suite; and the 403 envelope a refused delete answers."""

from __future__ import annotations

import json

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

SUITE = {"name": "arith", "scorer": {"type": "exact"},
         "examples": [{"id": "q1", "messages": [{"role": "user", "content": "2+3?"}], "target": "5"}]}


def make_trained_adapter(home, name: str, user):
    """Published the way the training runner does: reserved for the user's training job, then published."""
    from adapters.services import adapter_publish, adapter_reserve
    from core.jobs.models import Job, JobState
    from core.jobs.services import job_submit

    job = job_submit(kind="test.steps", payload={"steps": 1}, title="grpo", user=user)
    Job.objects.filter(id=job.id).update(kind="training.grpo", state=JobState.COMPLETED)
    folder = home / "adapters" / name
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + name.encode())
    adapter_reserve(name=name, job=Job.objects.get(id=job.id))
    return adapter_publish(name=name, path=folder, content_sha256="sha256:" + "ab" * 32, base_model_sha256="",
                           loaded=False)


def make_uploaded_adapter(home, name: str, user):
    """The rows and folder adapter_upload leaves (a real upload needs the served model and peft): no
    training job; the creating transition names the uploader."""
    from django.utils import timezone

    from adapters.models import Adapter, AdapterState, AdapterStatus
    from adapters.services import transition_record

    folder = home / "adapters" / name
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"uploaded " + name.encode())
    adapter = Adapter.objects.create(name=name, state=AdapterState.PUBLISHED, path=str(folder), uploaded=True,
                                     content_sha256="sha256:" + "cd" * 32, published_at=timezone.now())
    transition_record(name=name, from_state="", to_state=AdapterStatus.AVAILABLE, actor=user, reason="uploaded")
    return adapter


def make_dataset(client: Client, name: str) -> None:
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": "0", "reward": 0.0}]} for i in range(10)]
    data = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    response = client.post("/v1/eval/datasets/upload", data={
        "name": name, "format": "grpo_groups", "file": SimpleUploadedFile("d.jsonl", data)})
    assert response.status_code == 200, response.content


def make_suite(client: Client, name: str = "arith") -> None:
    response = client.post("/v1/eval/suites", data=json.dumps({**SUITE, "name": name}),
                           content_type="application/json")
    assert response.status_code == 200, response.content


def refused(response, code: str) -> dict:
    """A 403 envelope with the stable code and a hint naming the permission that would allow it."""
    assert response.status_code == 403, response.content
    error = response.json()["error"]
    assert error["code"] == code and "jobs.delete_others_jobs" in error["hint"], error
    return error
