"""`kiln rollout-generate` against a real stack (tiny model), then recorded-policy training of its output.

The command runs as a subprocess (`python -m kiln_project.cli.main rollout-generate`) with the
example files; its JSONL goes to POST /v1/train/grpo with behavior_policy "recorded", and the
receipt's recorded-provenance counts must match the corpus. Hand-edited completions and edited
sampling controls must be rejected at submission.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from core.contracts.groups import admit_jsonl
from core.contracts.provenance import validate_rollout_provenance
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo-math"
TERMINAL = ("completed", "failed", "cancelled")
SEEDS = 4


@pytest.fixture
def served(stack_factory, tiny_model_dir):
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
    stack.start_web()
    token = stack.create_user("roller")
    stack.start_worker("gpu-worker", "gpu,infer", threads=4)
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    return stack, token


@pytest.fixture
def example(tmp_path):
    work = tmp_path / "grpo-math"
    work.mkdir()
    tasks = (EXAMPLE / "tasks.jsonl").read_text().splitlines()[:3]
    (work / "tasks.jsonl").write_text("\n".join(tasks) + "\n")
    template = json.loads((EXAMPLE / "request.json").read_text())
    (work / "request.json").write_text(json.dumps({**template, "max_tokens": 16}))  # short answers, quick test
    shutil.copy(EXAMPLE / "score_math.py", work / "score_math.py")
    for directory in (tmp_path, work):
        directory.chmod(0o755)  # the sandbox user reads the scorer
    return work


def _rollout_generate(stack, token, work: Path, *extra: str):
    return stack.kiln(
        "rollout-generate", "--adapter", "base", "--thinking", "false", "--tasks", str(work / "tasks.jsonl"),
        "--seeds", str(SEEDS), "--seed-start", "42", "--request-template", str(work / "request.json"),
        "--scorer", str(work / "score_math.py"), "--output", str(work / "math-r001.rollouts.jsonl"),
        "--summary-output", str(work / "math-r001.summary.json"), "--url", stack.url, *extra,
        env={"KILN_API_TOKEN": token}, timeout=180, check=False)


def _submit(api, body):
    return api.post("/v1/train/grpo", json=body)


def _write(path: Path, groups: list[dict]) -> Path:
    path.write_text("".join(json.dumps(g) + "\n" for g in groups))
    return path


def test_rollouts_validate_train_recorded_and_drift_is_rejected(served, example):
    stack, token = served
    result = _rollout_generate(stack, token, example)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrote 3 groups (12 rollouts)" in result.stdout

    rollouts = example / "math-r001.rollouts.jsonl"
    data = rollouts.read_bytes()
    corpus = admit_jsonl(data)
    assert corpus.rollouts == corpus.with_provenance == 3 * SEEDS and corpus.jsonl == data
    records = [c["provenance"] for g in corpus.groups for c in g["completions"]]
    for record in records:
        validate_rollout_provenance(record)
        assert "adapter" not in record["behavior_policy"]
        assert record["sampling"]["temperature"] == 0.9 and record["sampling"]["max_tokens"] == 16
    assert [r["seed"] for r in records[:SEEDS]] == [42, 43, 44, 45]
    summary = json.loads((example / "math-r001.summary.json").read_text())
    stats = summary["stats"]
    assert stats["count"] == 12 and 0.0 <= stats["min_reward"] <= stats["mean_reward"] <= stats["max_reward"] <= 1.0
    assert summary["output"]["sha256"] == corpus.sha256
    assert summary["scorer"]["sandboxed"] is True
    sampled = sum(1 for r in records for a in r["action_tokens"] if a["source"] == "sampled")
    assert stats["sampled_action_tokens"] == sampled and stats["forced_action_tokens"] == 0

    api = stack.client(token)
    api.timeout = 60
    config = {"behavior_policy": "recorded", "output_name": "math-r001", "auto_load": False, "lora_rank": 4,
              "lora_alpha": 8, "seed": 3, "dynamic_sampling": False}  # train every group: counts = corpus

    # Drift is refused before anything is queued.
    groups = [json.loads(line) for line in data.splitlines()]
    edited_text = copy.deepcopy(groups)
    edited_text[1]["completions"][2]["text"] += " (edited)"
    response = _submit(api, {"dataset_path": str(_write(example / "edited-text.jsonl", edited_text)),
                             "config": config})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "recorded_provenance_drift" and "groups[1].completions[2]" in error["message"]
    assert "completion" in error["message"]

    edited_sampling = copy.deepcopy(groups)
    edited_sampling[0]["completions"][1]["provenance"]["sampling"]["temperature"] = 0.7
    response = _submit(api, {"dataset_path": str(_write(example / "edited-sampling.jsonl", edited_sampling)),
                             "config": config})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "recorded_provenance_drift" and "sampling" in error["message"]
    assert "groups[0].completions[1]" in error["message"]

    # A control edited consistently across a whole group passes the submission checks today (they
    # compare records within a group); the trainer's behavior log-prob replay must then refuse it.
    # Either outcome is a rejection; completing would mean the edit went unnoticed.
    group_edit = copy.deepcopy(groups)
    for completion in group_edit[0]["completions"]:
        completion["provenance"]["sampling"]["temperature"] = 0.5
    response = _submit(api, {"dataset_path": str(_write(example / "group-edit.jsonl", group_edit)),
                             "config": {**config, "output_name": "math-edited"}})
    if response.status_code == 200:
        edited_id = response.json()["job_id"]
        edited = wait_until(lambda: (d := api.get(f"/v1/train/jobs/{edited_id}").json())["state"] in TERMINAL and d,
                            240, interval=0.5, what="the edited corpus's job to end")
        assert edited["state"] == "failed", "a whole-group sampling edit trained without being noticed"
        assert edited["error"]["code"] == "recorded_provenance_drift" and "sampling" in edited["error"]["message"]
    else:
        assert response.status_code == 400 and response.json()["error"]["code"] == "recorded_provenance_drift"

    # The published corpus trains, and the receipt accounts for every recorded rollout.
    response = _submit(api, {"dataset_path": str(rollouts.resolve()), "config": config})
    assert response.status_code == 200, response.text
    job_id = response.json()["job_id"]
    detail = wait_until(lambda: (d := api.get(f"/v1/train/jobs/{job_id}").json())["state"] in TERMINAL and d,
                        240, interval=0.5, what="recorded training to finish")
    assert detail["state"] == "completed", detail.get("error")
    assert detail["training_data"]["admitted_corpus_sha256"] == corpus.sha256
    receipt = api.get("/v1/adapters/math-r001/receipt").json()
    assert receipt["grpo"]["behavior_policy"] == "recorded"
    recorded = receipt["grpo"]["policy_audit"]["recorded_provenance"]
    assert recorded["completion_count"] == 12
    assert recorded["sampled_action_tokens"] == sampled
    assert recorded["forced_action_tokens"] == 0
    assert recorded["unique_behavior_sources"] == 1
