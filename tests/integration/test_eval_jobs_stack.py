"""Eval jobs through a real stack: web, a `gpu,infer` worker serving the tiny model, a `control` worker.

A queued job is cancelled before the control worker exists (so it is still queued). Then a
five-example arithmetic suite (exact scorer) runs against the base model at temperature 0 with a
seed: every outcome is one of the four kinds, the counts sum to 5 and every completion is
non-empty. `kiln eval replay --follow` of that run answers `matched` (the same seeds through the
same model). A compare of base against base gives the same outcome for every example.
"""

from __future__ import annotations

import json

import pytest

from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

TERMINAL = ("completed", "failed", "cancelled")
SUITE = {"name": "sums", "scorer": {"type": "exact"},
         "examples": [{"id": f"q{i}", "messages": [{"role": "user", "content": f"What is {i} + {i + 1}?"}],
                       "target": str(2 * i + 1)} for i in range(1, 6)]}
GENERATION = {"temperature": 0, "seed": 42, "max_tokens": 12}


def _finished(api, job_id: str, timeout: float = 240) -> dict:
    wait_until(lambda: api.get(f"/v1/jobs/{job_id}").json()["state"] in TERMINAL, timeout, interval=0.5,
               what=f"eval job {job_id} to finish")
    return api.get(f"/v1/eval/jobs/{job_id}").json()


def test_eval_run_replay_compare_and_cancel(stack_factory, tiny_model_dir):
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
    stack.start_web()
    token = stack.create_user("evaluator")
    stack.start_worker("gpu-worker", "gpu,infer", threads=2)
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    api = stack.client(token)
    api.timeout = 60
    assert api.post("/v1/eval/suites", json=SUITE).status_code == 200

    doomed = api.post("/v1/eval/run", json={"suite_name": "sums", "generation": GENERATION})
    assert doomed.status_code == 200, doomed.text
    doomed_id = doomed.json()["job_id"]
    assert api.delete(f"/v1/eval/jobs/{doomed_id}").json() == {"job_id": doomed_id, "status": "cancelled"}
    assert api.get(f"/v1/eval/jobs/{doomed_id}").json()["state"] == "cancelled"

    stack.start_worker("control-worker", "control", threads=2)
    queued = api.post("/v1/eval/run", json={"suite_name": "sums", "adapter": None, "generation": GENERATION})
    assert queued.status_code == 200, queued.text
    run = _finished(api, queued.json()["job_id"])
    assert run["state"] == "completed", run["error"]
    assert sum(run["counts"].values()) == 5 and run["total"] == 5
    assert run["accuracy"] == run["counts"]["pass"] / 5
    assert {e["outcome"] for e in run["examples"]} <= {"pass", "fail", "invalid", "error"}
    for example in run["examples"]:
        assert example["completion"], example
        assert example["completion_token_ids"] and example["finish_reason"] in ("stop", "length")
    assert run["model"]["base_model_sha256"].startswith("sha256:")

    replay = stack.kiln("eval", "replay", run["job_id"], "--follow", "--url", stack.url,
                        env={"KILN_API_TOKEN": token}, timeout=300, check=False)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert f"replay of {run['job_id']}: matched" in replay.stdout

    compare = api.post("/v1/eval/compare", json={"suite_name": "sums", "adapters": [None, "base"],
                                                 "generation": GENERATION})
    assert compare.status_code == 200, compare.text
    table = _finished(api, compare.json()["job_id"])
    assert table["state"] == "completed", table["error"]
    assert [row["example_id"] for row in table["table"]] == [e["id"] for e in SUITE["examples"]]
    assert all(row["outcomes"][0] == row["outcomes"][1] for row in table["table"]), json.dumps(table["table"])
    # Same seeds, same model: the base model's outcomes equal the first run's too.
    assert [row["outcomes"][0] for row in table["table"]] == [e["outcome"] for e in run["examples"]]
