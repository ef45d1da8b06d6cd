"""Activation through the real workers (issue 13): the serving canary runs on the GPU worker, a team's
promotion waits for a reviewer (a submitter without the approve permission is refused), a kill -9 of the
GPU worker during an activation leaves the previous adapter active and the promotion `failed` with a
reason, the restarted worker serves what the registry says is active, and a rollback is a promotion
with the same record, whose activation and promotion links the chain verifier accepts."""

from __future__ import annotations

import sys

import pytest

from tests.support.stack import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CANARY_TIMEOUT = 6  # seconds one canary prompt may wait for the GPU worker (KILN_CANARY_TIMEOUT_SECONDS)


@pytest.fixture
def team(stack_factory, tiny_model_dir):
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir, KILN_CANARY_TIMEOUT_SECONDS=CANARY_TIMEOUT)
    stack.start_web()
    requester = stack.client(stack.create_user("requester"))
    reviewer = stack.client(stack.create_user("reviewer", "correct-horse-42", "--approver"))
    stack.start_worker("gpu-worker", "gpu,infer")
    stack.start_worker("control-worker", "control")
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    for name, seed in (("r1", 1), ("r2", 2)):
        stack.run([sys.executable, "-m", "tests.support.make_adapter", name, str(tiny_model_dir), str(seed)])
    return stack, requester, reviewer


def _promotion(client, promotion_id: int) -> dict:
    return client.get(f"/v1/promotions/{promotion_id}").json()


def _settled(client, promotion_id: int, timeout: float = 90) -> dict:
    return wait_until(lambda: (p := _promotion(client, promotion_id))["state"] not in ("pending", "approved") and p,
                      timeout, interval=0.5, what=f"promotion {promotion_id} to be applied or failed")


def _served_by_default(client) -> str | None:
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "2 + 2 ="}],
                                                          "max_tokens": 4, "temperature": 0, "seed": 1},
                           timeout=60)
    assert response.status_code == 200, response.text
    return (response.json()["choices"][0]["adapter"] or {}).get("name")


def _activate(requester, reviewer, name: str, reason: str) -> dict:
    pending = requester.post(f"/v1/adapters/{name}/activate", json={"reason": reason})
    assert pending.status_code == 202 and pending.json()["state"] == "pending", pending.text
    approved = reviewer.post(f"/v1/promotions/{pending.json()['id']}/approve", json={"reason": reason})
    assert approved.status_code == 200 and approved.json()["state"] == "approved", approved.text
    return _settled(reviewer, pending.json()["id"])


def test_kill_9_of_the_gpu_worker_during_activation_keeps_the_previous_adapter(team, tiny_model_dir):
    stack, requester, reviewer = team
    assert _served_by_default(requester) is None  # nothing active: the base model

    first = _activate(requester, reviewer, "r1", "round one")
    assert first["state"] == "applied", first
    r1 = requester.get("/v1/adapters/r1/detail").json()
    canary = r1["canary_record"]
    assert r1["status"] == "active" and canary["passed"] is True and len(canary["outputs"]) == 3
    assert all(o["served_content_sha256"] == r1["content_sha256"] and o["logprobs_finite"] for o in canary["outputs"])
    assert _served_by_default(requester) == "r1"

    pending = requester.post("/v1/promotions", json={"candidate": "r2", "reason": "round two"}).json()
    refused = requester.post(f"/v1/promotions/{pending['id']}/approve", json={"reason": "mine"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "approval_permission_required"

    stack.kill("gpu-worker")  # the GPU worker dies; the approval's canary cannot be answered
    approved = reviewer.post(f"/v1/promotions/{pending['id']}/approve", json={"reason": "looks good"})
    assert approved.status_code == 200 and approved.json()["state"] == "approved", approved.text
    failed = _settled(reviewer, pending["id"], timeout=3 * CANARY_TIMEOUT + 60)
    assert failed["state"] == "failed" and "previous adapter stays active" in failed["reason"], failed
    r2 = requester.get("/v1/adapters/r2").json()
    assert r2["status"] == "available" and r2["loaded"] is False and r2["quarantined"] is False
    assert requester.get("/v1/adapters/r1").json()["status"] == "active"

    stack.start_worker("gpu-worker", "gpu,infer")  # a fresh worker serves what the registry says
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load again")
    assert _served_by_default(requester) == "r1"

    forward = _activate(requester, reviewer, "r2", "round two, again")
    assert forward["state"] == "applied" and _served_by_default(requester) == "r2"
    back = _activate(requester, reviewer, "r1", "r2 regressed: roll back")
    assert back["state"] == "applied" and _served_by_default(requester) == "r1"
    assert [r["decision"] for r in back["receipts"]] == [None, "approved"]
    history = [t["to_state"] for t in requester.get("/v1/adapters/r1/detail").json()["transitions"]]
    assert history[-3:] == ["active", "available", "active"], history
    # These adapters were made by hand (no training job), so the chain breaks at training; the
    # activation and its promotion still verify.
    links = {x["link"]: x for x in requester.get("/v1/adapters/r1/verify").json()["links"]}
    assert links["activation"]["ok"] and links["promotion"]["ok"], links
