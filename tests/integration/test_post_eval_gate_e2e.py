"""The guide's loop with evaluation, on the tiny model through the real workers (issue 12):

1. a deliberately broken round (inverted rewards, a large step) is trained and activated without a
   gate: it is what serves now;
2. a good round from the base, with a held-out `post_eval` gate: the gate compares it with the
   adapter active before training (the broken one) on the same suite, seeds and generation hash,
   finds a significant paired improvement above the floor, and promotes it (activated);
3. another broken round, gated: `regression`, it stays inactive and the good adapter keeps serving;
4. a training set that contains a suite prompt is refused at submission (`eval_train_overlap`).

Training completion, the evaluation outcome and the activation are three recorded states with
their times, and the gate's evidence is a receipt row.
"""

from __future__ import annotations

import random

import pytest

from gpu_runtime.tiny_tasks import arithmetic_example, draw_arithmetic, held_out_arithmetic
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

SUITE_SIZE = 40
FLOOR = 0.2
TERMINAL = ("completed", "failed", "cancelled")


def _suite() -> dict:
    examples = [{"id": f"sum-{i:02d}", "messages": [{"role": "user", "content": ex.question}], "target": ex.answer}
                for i, ex in enumerate(held_out_arithmetic(SUITE_SIZE, seed=77))]
    return {"name": "sums-holdout", "scorer": {"type": "numeric_tolerance", "tolerance": 0}, "examples": examples}


def _groups(count: int, *, inverted: bool, seed: int) -> list[dict]:
    rng = random.Random(seed)
    groups = []
    for _ in range(count):
        ex = arithmetic_example(*draw_arithmetic(rng, held_out=False))
        right, wrong = (0.0, 1.0) if inverted else (1.0, 0.0)
        answer = int(ex.answer)
        groups.append({"messages": [{"role": "user", "content": ex.question}],
                       "completions": [{"text": ex.answer, "reward": right},
                                       {"text": str(answer + 1), "reward": wrong},
                                       {"text": str(answer + 10), "reward": wrong},
                                       {"text": ex.answer, "reward": right}]})
    return groups


def _config(name: str, *, lr: float, auto_load: bool = True) -> dict:
    return {"output_name": name, "auto_load": auto_load, "seed": 3, "lora_rank": 8, "lora_alpha": 16,
            "learning_rate": lr}


POST_EVAL = {"suite": "sums-holdout", "min_accuracy": FLOOR,
             "generation": {"temperature": 0, "max_tokens": 8, "seed": "5"}}


def gated_stack(stack_factory, model_dir, suite: dict | None, user: str, **env):
    """Web, a GPU and a control worker on `model_dir`, one user, and `suite` registered (when given):
    (stack, api, token)."""
    stack = stack_factory(KILN_MODEL_PATH=model_dir, **env)
    stack.start_web()
    token = stack.create_user(user)
    stack.start_worker("gpu-worker", "gpu,infer", threads=4)
    stack.start_worker("control-worker", "control", threads=4)
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    api = stack.client(token)
    api.timeout = 120
    if suite is not None:
        assert api.post("/v1/eval/suites", json=suite).status_code == 200
    return stack, api, token


@pytest.fixture
def loop(stack_factory, tiny_model_dir):
    return gated_stack(stack_factory, tiny_model_dir, _suite(), "operator")


def _train(api, body) -> str:
    response = api.post("/v1/train/grpo", json=body)
    assert response.status_code == 200, response.text
    return response.json()["job_id"]


def _settled(api, job_id: str, timeout: float = 600) -> dict:
    """Wait for training and, when one was queued, its post-eval."""
    def done():
        detail = api.get(f"/v1/train/jobs/{job_id}").json()
        if detail["state"] not in TERMINAL:
            return None
        evaluation = (detail.get("states") or {}).get("evaluation")
        if evaluation is None:  # a completed round that asked for a post-eval must show it
            return None if detail["state"] == "completed" and detail.get("post_eval") else detail
        return detail if evaluation["state"] in TERMINAL else None

    return wait_until(done, timeout, interval=1.0, what=f"training {job_id} and its post-eval")


def _evidence(detail: dict) -> list[dict]:
    """The gate's evidence rows; when there are none, the failure says what the post-eval did."""
    evidence = detail["post_eval_gate_evidence"]
    assert evidence, ("no gate evidence", detail.get("states"), detail.get("post_eval_verdict"),
                      detail.get("linked_eval_job_ids"))
    return evidence


def _adapter(api, name: str) -> dict:
    return api.get(f"/v1/adapters/{name}").json()


def test_the_gate_promotes_a_good_round_and_holds_back_a_broken_one(loop):
    stack, api, token = loop
    broken = _settled(api, _train(api, {"groups": _groups(48, inverted=True, seed=1),
                                        "config": _config("sums-broken", lr=2e-3)}))
    assert broken["state"] == "completed", broken.get("error")
    assert broken["gate_outcome"] is None and broken["activation_job_id"]
    # auto_load without a gate: the serving canary runs on the GPU worker, then the adapter is active.
    wait_until(lambda: _adapter(api, "sums-broken")["loaded"], 120, interval=0.5, what="auto_load activation")
    assert _adapter(api, "sums-broken")["canary"]["passed"] is True

    good = _settled(api, _train(api, {"groups": _groups(8, inverted=False, seed=2),
                                      "config": _config("sums-good", lr=1e-5), "post_eval": POST_EVAL}))
    assert good["state"] == "completed", good.get("error")
    [evidence] = _evidence(good)
    assert evidence["policy_version"] == "paired_wilson_v1"
    assert evidence["baseline_adapter"] == "sums-broken" and evidence["candidate_adapter"] == "sums-good"
    assert evidence["paired_examples"] == SUITE_SIZE
    assert evidence["improved"] + evidence["regressed"] + evidence["tied"] == SUITE_SIZE
    print("good:", good["post_eval_verdict"])
    assert good["gate_outcome"] == "promoted", (evidence, good["post_eval_verdict"])
    assert evidence["exact_sign_test_p_value"] < 0.05 and evidence["candidate_accuracy_lower_bound"] >= FLOOR
    assert good["linked_eval_job_ids"] and good["linked_eval_job_ids"][0] == evidence["eval_job_id"]
    states = good["states"]
    assert states["training"]["state"] == "completed" and states["training"]["at"]
    assert states["evaluation"]["outcome"] == "promoted" and states["evaluation"]["at"] >= states["training"]["at"]
    # its eval_job_id is the evaluation the eval routes know (job_id is the post-eval job, at /v1/jobs)
    assert states["evaluation"]["eval_job_id"] == evidence["eval_job_id"] != states["evaluation"]["job_id"]
    assert states["activation"]["active"] is True and states["activation"]["at"]
    assert _adapter(api, "sums-good")["loaded"] is True
    shown = stack.kiln("train", "status", "--job-id", good["job_id"], "--url", stack.url, env={"KILN_API_TOKEN": token})
    assert "gate_outcome   promoted" in shown.stdout, shown.stdout
    assert f"eval job {evidence['eval_job_id']} (kiln eval status ID)" in shown.stdout, shown.stdout
    eval_job = api.get(f"/v1/eval/jobs/{evidence['eval_job_id']}").json()
    assert eval_job["state"] == "completed" and eval_job["suite_hash"] == evidence["suite_hash"]

    regressed = _settled(api, _train(api, {"groups": _groups(48, inverted=True, seed=3),
                                           "config": _config("sums-broken2", lr=2e-3), "post_eval": POST_EVAL}))
    assert regressed["state"] == "completed", regressed.get("error")
    [evidence] = _evidence(regressed)
    assert evidence["baseline_adapter"] == "sums-good"  # the adapter active before this training
    print("broken2:", regressed["post_eval_verdict"])
    assert regressed["gate_outcome"] in ("regression", "demoted"), evidence
    assert evidence["regressed"] > evidence["improved"]
    assert regressed["states"]["activation"]["active"] is False
    assert _adapter(api, "sums-good")["loaded"] is True  # the previous adapter keeps serving

    leaky = [{"messages": [{"role": "user", "content": _suite()["examples"][3]["messages"][0]["content"]}],
              "completions": [{"text": "1", "reward": 1.0}, {"text": "2", "reward": 0.0}]}]
    refused = api.post("/v1/train/grpo", json={"groups": leaky, "config": _config("sums-leak", lr=1e-5),
                                               "post_eval": POST_EVAL})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "eval_train_overlap"
    assert "sum-03" in refused.json()["error"]["message"]
