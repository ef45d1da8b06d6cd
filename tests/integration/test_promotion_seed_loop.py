"""The guide's loop to the end for a team, on the tiny model through the real workers and a real browser
(issue 13's proof):

0. what serves now is a broken round (inverted rewards, a large step), loaded by the reviewer;
1. round one, gated, passes its gate against it and is *proposed* (two users: the policy is on);
   the operator, who may submit but not approve, is refused (403 approval_permission_required);
   the reviewer approves in Playwright, the serving canary runs on the GPU worker, and round one
   becomes active and serves /v1/chat/completions;
2. round two is gated against round one (the adapter active before it);
3. a round trained on inverted rewards whose recorded reward climbs is held back by its gate, and a
   promotion requested for it by hand is flagged (training reward rose while held-out accuracy fell)
   and stays pending: never applied automatically;
4. after round two is promoted by hand, a rollback to round one (`POST /v1/adapters/{name}/activate`)
   is a promotion like any other, approved, applied and recorded.
"""

from __future__ import annotations

import random
import re

from gpu_runtime.tiny_tasks import arithmetic_example, draw_arithmetic
from tests.integration.test_post_eval_gate_e2e import (
    POST_EVAL,
    SUITE_SIZE,
    _config,
    _groups,
    _settled,
    _suite,
    _train,
)
from tests.support.browser import PASSWORD, browser_marks, launch, login
from tests.support.stack import wait_until

pytestmark = browser_marks


def _climbing_inverted_groups(count: int, *, seed: int) -> list[dict]:
    """Inverted rewards (the wrong answers win) on a scale that climbs group by group: the recorded
    training reward rises while the policy learns to answer wrong, the signature of reward hacking."""
    rng = random.Random(seed)
    groups = []
    for index in range(count):
        ex = arithmetic_example(*draw_arithmetic(rng, held_out=False))
        base, answer = index / count, int(ex.answer)
        groups.append({"messages": [{"role": "user", "content": ex.question}],
                       "completions": [{"text": ex.answer, "reward": base}, {"text": str(answer + 1), "reward": base + 1},
                                       {"text": str(answer + 10), "reward": base + 1},
                                       {"text": ex.answer, "reward": base}]})
    return groups


def _promotion(api, promotion_id: int) -> dict:
    return api.get(f"/v1/promotions/{promotion_id}").json()


def _applied(api, promotion_id: int) -> dict:
    return wait_until(lambda: (p := _promotion(api, promotion_id))["state"] not in ("pending", "approved") and p,
                      120, interval=0.5, what=f"promotion {promotion_id} to settle")


def _served_by_default(api) -> str | None:
    response = api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "What is 3 + 4?"}],
                                                      "max_tokens": 6, "temperature": 0, "seed": 1}, timeout=60)
    assert response.status_code == 200, response.text
    return (response.json()["choices"][0]["adapter"] or {}).get("name")


def _approve_in_browser(stack, promotion_id: int, reason: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    path = f"/ui/promotions/{promotion_id}/"
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            expect.set_options(timeout=30_000)
            page = login(browser, stack, "reviewer", path=path, height=1000, timeout_ms=None)
            expect(page.locator("#gate-outcome")).to_have_text("promoted")
            page.fill("#approve-reason", reason)
            page.click("#approve-button")
            # approved while the canary runs on the GPU worker, then applied: the page follows live
            expect(page.locator("#promotion-state .badge")).to_have_text(re.compile(r"^applied$"), timeout=90_000)
            page.screenshot(path="/tmp/kiln-seed-loop-applied.png", full_page=True)
        finally:
            browser.close()


def test_the_seed_loop_for_a_team(stack_factory, tiny_model_dir):
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
    stack.start_web()
    operator = stack.client(stack.create_user("operator", PASSWORD))
    reviewer = stack.client(stack.create_user("reviewer", PASSWORD, "--approver"))
    for client in (operator, reviewer):
        client.timeout = 120
    stack.start_worker("gpu-worker", "gpu,infer", threads=4)
    stack.start_worker("control-worker", "control", threads=4)
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    assert operator.post("/v1/eval/suites", json=_suite()).status_code == 200

    # 0. A broken round serves now (trained without auto_load, loaded by the reviewer through the canary).
    broken = _settled(operator, _train(operator, {"groups": _groups(48, inverted=True, seed=1),
                                                  "config": _config("team-broken", lr=2e-3, auto_load=False)}))
    assert broken["state"] == "completed", broken.get("error")
    loaded = reviewer.post("/v1/adapters/load", json={"name": "team-broken", "reason": "what we had"})
    assert loaded.status_code == 200 and loaded.json()["canary"]["passed"] is True, loaded.text

    # 1. Round one passes its gate and is proposed; the operator may not approve; the reviewer does.
    one = _settled(operator, _train(operator, {"groups": _groups(8, inverted=False, seed=2),
                                               "config": _config("team-r001", lr=1e-5), "post_eval": POST_EVAL}))
    assert one["gate_outcome"] == "promoted", one["post_eval_gate_evidence"]
    promotion_id = one["states"]["activation"]["promotion_id"]
    proposed = _promotion(operator, promotion_id)
    assert proposed["state"] == "pending" and proposed["incumbent"] == "team-broken"
    assert proposed["evidence"]["gate"]["paired_examples"] == SUITE_SIZE and not proposed["alarms"]
    refused = operator.post(f"/v1/promotions/{promotion_id}/approve", json={"reason": "mine"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "approval_permission_required"
    assert _served_by_default(operator) == "team-broken"
    _approve_in_browser(stack, promotion_id, "round one fixes the regression")
    applied = _promotion(operator, promotion_id)
    assert applied["state"] == "applied" and applied["decided_by"] == "reviewer"
    assert [r["decision"] for r in applied["receipts"]] == [None, "approved"]
    assert _served_by_default(operator) == "team-r001"

    # 2. Round two is compared with round one.
    two = _settled(operator, _train(operator, {"groups": _groups(8, inverted=False, seed=4),
                                               "config": _config("team-r002", lr=1e-5), "post_eval": POST_EVAL}))
    [evidence] = two["post_eval_gate_evidence"]
    assert evidence["baseline_adapter"] == "team-r001" and evidence["candidate_adapter"] == "team-r002"
    assert _served_by_default(operator) == "team-r001"  # nothing changes without a reviewer

    # 3. Inverted rewards that climb: the gate holds it back; a hand promotion is flagged, never applied.
    hacked = _settled(operator, _train(operator, {"groups": _climbing_inverted_groups(48, seed=5),
                                                  "config": _config("team-hacked", lr=2e-3),
                                                  "post_eval": POST_EVAL}))
    assert hacked["gate_outcome"] in ("regression", "demoted"), hacked["post_eval_gate_evidence"]
    print("inverted round:", hacked["gate_outcome"], hacked["post_eval_verdict"])
    if hacked["gate_outcome"] == "regression":  # a demoted adapter left the registry; nothing to request
        flagged = operator.post("/v1/promotions", json={"candidate": "team-hacked", "reason": "reward went up"}).json()
        assert flagged["state"] == "pending" and flagged["flagged"] is True, flagged
        assert any("training reward rose" in alarm for alarm in flagged["alarms"]), flagged["alarms"]
        rejected = reviewer.post(f"/v1/promotions/{flagged['id']}/reject", json={"reason": "the alarm is real"})
        assert rejected.status_code == 200 and rejected.json()["state"] == "rejected"
    assert _served_by_default(operator) == "team-r001"

    # 4. Round two by hand, then the rollback to round one: each a promotion, approved and recorded.
    for name, reason in (("team-r002", "round two by hand"), ("team-r001", "round two regressed: roll back")):
        asked = operator.post(f"/v1/adapters/{name}/activate", json={"reason": reason})
        assert asked.status_code == 202 and asked.json()["state"] == "pending", asked.text
        approved = reviewer.post(f"/v1/promotions/{asked.json()['id']}/approve", json={"reason": reason})
        assert approved.status_code == 200, approved.text
        assert _applied(reviewer, asked.json()["id"])["state"] == "applied"
        assert _served_by_default(operator) == name
    history = operator.get("/v1/adapters/team-r001/detail").json()["transitions"]
    assert [t["to_state"] for t in history][-3:] == ["active", "available", "active"]
    assert "roll back" in history[-1]["reason"]
    links = {x["link"]: x for x in operator.get("/v1/adapters/team-r001/verify").json()["links"]}
    assert links["activation"]["ok"] and links["promotion"]["ok"], links
