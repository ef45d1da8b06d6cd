"""POST /v1/train/grpo with a registered dataset: the persisted partition (train by default) is
admitted like a streamed file, pinned, and named in training_data with both dataset digests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.canonical import sha256_digest
from core.contracts.groups import admit_groups
from core.jobs.models import Job
from tests.evaluations import dataset_support
from tests.evaluations.dataset_support import error, group, jsonl, ok, send, upload
from training.reward_contrast import groups_with_reward_contrast

pytestmark = pytest.mark.django_db
api, home = dataset_support.api, dataset_support.home  # the shared fixtures


def _train(client, body):
    return client.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")


def _partition_rows(client, name, partition):
    split = ok(client.get(f"/v1/eval/datasets/{name}/split"))
    return [e["row"] for e in split["rows"] if e["partition"] == partition]


def test_a_named_dataset_trains_on_its_train_partition(api, home):
    rows = [group(i, group_id=f"g{i}", reference=str(2 * i)) for i in range(30)]
    manifest = ok(upload(api, "math", jsonl(rows)))
    queued = ok(_train(api, {"dataset": "math", "config": {"output_name": "math-r001", "seed": 3}}))
    job = Job.objects.get(uuid=queued["job_id"])
    train_rows = _partition_rows(api, "math", "train")
    expected = admit_groups([rows[r - 1] for r in train_rows])
    snapshot = Path(job.payload["snapshot_path"]).read_bytes()
    assert snapshot == expected.jsonl  # the admitted (canonical) groups of the train partition
    assert job.payload["training_data"] == {
        "source": "named_dataset", "dataset": "math", "split": "train",
        "path": str(home / "adapters" / ".eval" / "datasets" / "math" / "train.jsonl"),
        "dataset_corpus_sha256": manifest["corpus_sha256"],
        "split_manifest_sha256": manifest["split_manifest_sha256"],
        "admitted_corpus_sha256": sha256_digest(snapshot), "rows": manifest["split_counts"]["train"],
        "rollouts": 2 * manifest["split_counts"]["train"],
        "groups_with_reward_contrast": groups_with_reward_contrast(expected.groups)}
    status = ok(api.get(f"/v1/train/status/{queued['job_id']}"))
    assert status["training_data"]["source"] == "named_dataset" and status["training_data"]["split"] == "train"


def test_an_explicit_split_and_a_resplit_after_queueing(api, home):
    rows = [group(i) for i in range(40)]
    ok(upload(api, "math", jsonl(rows)))
    queued = ok(_train(api, {"dataset": "math", "dataset_split": "validation", "config": {"output_name": "val-r1"}}))
    job = Job.objects.get(uuid=queued["job_id"])
    validation = _partition_rows(api, "math", "validation")
    assert job.payload["training_data"]["split"] == "validation"
    assert job.payload["training_data"]["rows"] == len(validation) > 0
    snapshot = Path(job.payload["snapshot_path"]).read_bytes()
    resplit = ok(send(api, "put", "/v1/eval/datasets/math/split", {"seed": "12345"}))
    assert resplit["split_manifest_sha256"] != job.payload["training_data"]["split_manifest_sha256"]
    assert Path(job.payload["snapshot_path"]).read_bytes() == snapshot  # the queued job keeps its pinned corpus


def test_named_dataset_refusals(api, home):
    ok(upload(api, "two", jsonl([group(1), group(2)])))  # two components: validation empty
    ok(upload(api, "plain", jsonl([{"q": "x"}]), fmt="raw"))
    assert error(_train(api, {"dataset": "missing"}), 404, "dataset_not_found").startswith("dataset:")
    message = error(_train(api, {"dataset": "two", "dataset_split": "validation"}), 400, "training_invalid_request")
    assert message.startswith("dataset_split:") and "empty" in message
    assert error(_train(api, {"dataset": "two", "dataset_split": "test"}), 400,
                 "training_invalid_request").startswith("dataset_split:")
    assert "grpo_groups" in error(_train(api, {"dataset": "plain"}), 400, "training_invalid_request")
    assert error(_train(api, {"groups": [group(1)], "dataset_split": "train"}), 400,
                 "training_invalid_request").startswith("dataset_split:")
    assert error(_train(api, {"dataset": "two", "groups": [group(1)]}), 400,
                 "training_invalid_request").startswith("source:")
    assert not Job.objects.exists()


def test_the_train_receipt_names_the_dataset_split_and_both_digests(api, home, settings, tiny_model_dir,
                                                                    django_capture_on_commit_callbacks):
    """The job runs in-process on the tiny model: the receipt (file and row) carries the lineage."""
    import dataclasses

    from core.jobs.runner import run_queued_jobs
    from core.models import Receipt

    settings.KILN = dataclasses.replace(settings.KILN, model_path=Path(tiny_model_dir))
    rows = [group(i, group_id=f"g{i}") for i in range(12)]
    manifest = ok(upload(api, "lineage", jsonl(rows)))
    queued = ok(_train(api, {"dataset": "lineage", "config": {"output_name": "lineage-r001", "lora_rank": 2, "lora_alpha": 4,
                                                              "auto_load": False, "seed": 1}}))
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("gpu")
    job = Job.objects.get(uuid=queued["job_id"])
    assert job.state == "completed", job.error
    receipt = Receipt.objects.get(subject="lineage-r001").body
    data = receipt["training_data"]
    assert data["source"] == "named_dataset" and data["dataset"] == "lineage" and data["split"] == "train"
    assert data["dataset_corpus_sha256"] == manifest["corpus_sha256"]
    assert data["split_manifest_sha256"] == manifest["split_manifest_sha256"]
    assert data["sha256"] == job.payload["training_data"]["admitted_corpus_sha256"]
    on_disk = json.loads((Path(job.result["adapter_path"]) / "train_receipt.json").read_text())
    assert on_disk["training_data"] == data
