"""GRPO training through the whole stack: API and CLI submission, the GPU worker, the adapter registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.canonical import json_digest
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration


def _groups():
    groups = []
    for a, b in [(2, 3), (4, 1), (3, 3)]:
        answer = a + b
        groups.append({
            "messages": [{"role": "user", "content": f"What is {a} + {b}? Reply with just the number."}],
            "completions": [{"text": str(answer), "reward": 1.0}, {"text": str(answer + 1), "reward": 0.0},
                            {"text": str(answer - 1), "reward": 0.0}, {"text": str(answer), "reward": 1.0}],
        })
    return groups


@pytest.fixture
def trainer_stack(stack_factory, tiny_model_dir):
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
    stack.start_web()
    token = stack.create_user("trainer")
    stack.start_worker("gpu-worker", "gpu,infer", threads=4)
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    return stack, token


def test_api_training_publishes_an_adapter_with_a_receipt_and_serves_it(trainer_stack):
    stack, token = trainer_stack
    api = stack.client(token)
    api.timeout = 60
    response = api.post("/v1/train/grpo", json={
        "groups": _groups(),
        "config": {"output_name": "math-r001", "auto_load": False, "seed": 11, "lora_rank": 4, "lora_alpha": 8,
                   "learning_rate": 5e-3, "checkpoint_interval": 2}})
    assert response.status_code == 200, response.text
    job_id = response.json()["job_id"]
    detail = wait_until(lambda: (d := api.get(f"/v1/train/jobs/{job_id}").json())["state"] in
                        ("completed", "failed", "cancelled") and d, 300, interval=0.5, what="training to finish")
    assert detail["state"] == "completed", detail.get("error")
    assert detail["adapter_name"] == "math-r001"
    assert detail["adapter_path"].endswith("/adapters/math-r001")
    assert len(detail["loss_history"]) == 3  # one optimizer group per prompt group
    assert all(isinstance(point["loss"], float) for point in detail["loss_history"])
    # reference-spec §1.1: each point is {epoch, progress, loss, elapsed_secs} (plus its step)
    assert [point["progress"] for point in detail["loss_history"]] == [1 / 3, 2 / 3, 1.0]
    assert all(point["epoch"] == 0 and point["elapsed_secs"] >= 0 for point in detail["loss_history"])
    elapsed = [point["elapsed_secs"] for point in detail["loss_history"]]
    assert elapsed == sorted(elapsed)
    latest = detail["latest_checkpoint"]
    assert latest["resume_checkpoint"] == "math-r001-checkpoint-step-00000002.kiln-checkpoint"
    assert latest["global_step"] == 2 and latest["training_kind"] and latest["data_content_sha256"].startswith("sha256:")
    receipt = api.get("/v1/adapters/math-r001/receipt").json()
    assert receipt["status"] == "success" and receipt["adapter_name"] == "math-r001"
    assert receipt["grpo"]["policy_audit"]["schema"] == "kiln.grpo-policy-audit.v1"
    assert receipt["training_data"]["sha256"] == detail["training_data"]["admitted_corpus_sha256"]
    assert receipt["training_data"]["source"] == "inline"
    assert receipt["phase_timings"]["gpu_writer_acquisitions"] >= 3
    # The GPU worker's trainer built its model on the served model's weights: one copy of the base.
    assert receipt["runtime"]["execution_provenance"]["base_weights"] == "shared_with_sampler"
    assert detail["train_receipt"]["config_hashes"] == receipt["config_hashes"]
    adapter = api.get("/v1/adapters/math-r001").json()
    assert adapter["state"] == "published" and adapter["content_sha256"].startswith("sha256:")
    # The receipt is a row too, written with the adapter: the file on disk hashes to the row's digest.
    on_disk = json.loads((Path(detail["adapter_path"]) / "train_receipt.json").read_text())
    assert adapter["receipt_sha256"] == json_digest(on_disk) == json_digest(receipt)
    assert adapter["loaded"] is False  # auto_load false keeps training apart from activation
    chat = api.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What is 2 + 3? Reply with just the number."}],
        "adapter": "math-r001", "temperature": 0, "max_tokens": 8, "seed": 1}).json()
    assert chat["choices"][0]["adapter"] == {"name": "math-r001", "content_sha256": adapter["content_sha256"]}
    # The name is taken now: a second run must use a new versioned name.
    again = api.post("/v1/train/grpo", json={"groups": _groups(), "config": {"output_name": "math-r001"}})
    assert again.status_code == 409 and again.json()["error"]["code"] == "adapter_revision_conflict"


def test_cli_train_grpo_follow_and_round_two_from_the_first_adapter(trainer_stack, tmp_path):
    stack, token = trainer_stack
    data = tmp_path / "scored.jsonl"
    data.write_text("".join(json.dumps(g) + "\n" for g in _groups()))
    env = {"KILN_API_TOKEN": token}
    first = stack.kiln("train", "grpo", "--file", str(data), "--adapter", "cli-r001", "--lora-rank", "4",
                       "--follow", "--url", stack.url, env=env, timeout=300)
    queued, final = first.stdout.splitlines()[:2]  # the id first (a Ctrl-C leaves it), then the outcome
    assert queued.startswith("queued ") and queued.split()[1] == final.split()[0], first.stdout
    assert final.split()[1:4] == ["completed", "adapter", "cli-r001"], first.stdout + first.stderr
    # The guide: --file submits the streamed route (the server reads the file), and the receipt says so.
    first_receipt = stack.client(token).get("/v1/adapters/cli-r001/receipt").json()
    assert first_receipt["training_data"]["source"] == "dataset_path"
    assert first_receipt["training_data"]["path"] == str(data.resolve())
    request = tmp_path / "round2.json"
    request.write_text(json.dumps({"dataset_path": str(data), "config": {
        "base_adapter": "cli-r001", "output_name": "cli-r002", "lora_rank": 4, "lora_alpha": 8,
        "auto_load": False}}))
    second = stack.kiln("train", "grpo", "--file", str(request), "--follow", "--json", "--url", stack.url,
                        env=env, timeout=300)
    status = json.loads(second.stdout)
    assert status["state"] == "completed" and status["adapter_name"] == "cli-r002"
    assert status["training_data"]["source"] == "dataset_path"
    api = stack.client(token)
    assert api.get("/v1/adapters/cli-r002").json()["base_adapter"] == "cli-r001"
    receipt = api.get("/v1/adapters/cli-r002/receipt").json()
    assert receipt["adapters"]["base"]["name"] == "cli-r001"
    assert receipt["adapters"]["base"]["adapter_model_sha256"] == api.get("/v1/adapters/cli-r001").json()["content_sha256"]
    listing = stack.kiln("train", "status", "--url", stack.url, env=env)
    assert "cli-r002" in listing.stdout and "cli-r001" in listing.stdout
