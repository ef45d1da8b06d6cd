"""Promotions in a real browser against a real stack (daphne, Redis, the product settings).

A requester's round two is flagged (the training reward rose while held-out accuracy fell below the
serving adapter's) and waits for a person. The requester, who lacks the approve permission, watches
the promotion's page and the queue in one browser context and sees the buttons disabled with the
reason; a reviewer holding jobs.approve_promotion opens the same promotion in another context, sees
the gate counts and bounds, the reward trend and the alarm, is told a blank reason is not enough,
and approves with a reason. The requester's pages show the decision without a reload.

Approval is asynchronous (an activation job runs the serving canary; no GPU worker runs here), so
the state is asserted to leave `pending` for `approved` (shown "approved — activating") or `applied`.
Screenshots land in /tmp/kiln-ui-promotions-*.png.
"""

from __future__ import annotations

import re
import sys

from tests.support.browser import PASSWORD, TIMEOUT_MS, browser_marks, launch, login

pytestmark = browser_marks

# Runs on the stack's database: r1 serving, r2 trained by a job whose reward rose, and a promotion of
# r2 requested by `requester` with a gate in which r2 is worse on held-out work (the alarm). Prints its id.
SETUP = r"""
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")
import django
django.setup()
from django.contrib.auth import get_user_model
from adapters.promotions import promotion_request
from adapters.services import adapter_publish, adapter_reserve, adapters_root
from core.jobs.models import Job
from core.jobs.services import job_submit
from evaluations.gate import GateArm, paired_wilson_v1

requester = get_user_model().objects.get(username="requester")
job = job_submit(kind="test.steps", payload={"steps": 1}, title="grpo round two", user=requester)
rewards = [{"step": s, "reward_mean": round(0.2 + 0.08 * s, 4)} for s in range(1, 13)]
Job.objects.filter(id=job.id).update(kind="training.grpo", state="completed", metrics={"reward_history": rewards})
job = Job.objects.get(id=job.id)
for name, loaded, training in (("r1", True, None), ("r2", False, job)):
    folder = adapters_root() / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + name.encode())
    adapter_reserve(name=name, job=training, base_adapter="r1" if name == "r2" else "")
    adapter_publish(name=name, path=folder, content_sha256="sha256:" + name.encode().hex().ljust(64, "0"),
                    base_model_sha256="", loaded=loaded)
ids = [f"e{i:02d}" for i in range(20)]
def arm(adapter, passes):
    return GateArm(adapter=adapter, suite_name="held-out", suite_hash="sha256:" + "a" * 64,
                   effective_generation_hash="sha256:" + "9" * 64,
                   outcomes={i: "pass" if n < passes else "fail" for n, i in enumerate(ids)})
gate = paired_wilson_v1(baseline=arm("r1", 16), candidate=arm("r2", 10), eval_job_id="0d6f3a52-9c1e-4b7a-8f00-5b2e1c7d9a10",
                        min_accuracy=0.3).evidence
promotion = promotion_request(candidate="r2", user=requester, reason="round two", evidence=gate)
assert promotion.alarms, promotion.evidence
print(promotion.id)
"""


def test_a_reviewer_approves_in_the_browser_and_another_user_sees_it_live(stack):
    from playwright.sync_api import expect, sync_playwright

    stack.start_web()
    stack.create_user("requester", PASSWORD)
    stack.create_user("reviewer", PASSWORD, "--approver")
    promotion_id = int(stack.run([sys.executable, "-c", SETUP]).stdout.split()[-1])
    detail = f"/ui/promotions/{promotion_id}/"

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            expect.set_options(timeout=TIMEOUT_MS)
            # The requester watches the promotion and the queue; they may not decide.
            watcher = login(browser, stack, "requester", path=detail, height=1000)
            expect(watcher.locator("#promotion-state .badge")).to_have_text("pending")
            expect(watcher.locator("#approve-button")).to_be_disabled()
            expect(watcher.locator("#reject-button")).to_be_disabled()
            expect(watcher.locator("#approve-blocked")).to_contain_text("You lack the approve_promotion permission")
            queue = watcher.context.new_page()
            queue.set_default_timeout(TIMEOUT_MS)
            queue.goto(stack.url + "/ui/promotions/")
            row = queue.locator(f"#promotion-row-{promotion_id}")
            expect(row.locator(".promotion-state .badge")).to_have_text("pending")
            expect(row.locator(".promotion-alarms")).to_contain_text("alarm: 1")
            watcher.evaluate("window.kilnSamePage = true")
            queue.evaluate("window.kilnSamePage = true")

            # The reviewer sees the evidence and the alarm.
            reviewer = login(browser, stack, "reviewer", path=detail, height=1000)
            expect(reviewer.locator("#promotion-alarms")).to_contain_text("training reward rose")
            expect(reviewer.locator("#gate-outcome")).to_have_text("regression")
            expect(reviewer.locator("#gate-regressed")).to_have_text("6")
            expect(reviewer.locator("#gate-candidate-accuracy")).to_have_text("0.5")
            expect(reviewer.locator("#gate-baseline-accuracy")).to_have_text("0.8")
            expect(reviewer.locator("#gate-candidate-bounds")).to_contain_text(" – ")
            expect(reviewer.locator("#reward-trend")).to_contain_text("rose")
            expect(reviewer.locator("#reward-curve polyline")).to_have_count(1)
            expect(reviewer.locator("#approve-button")).to_be_enabled()
            reviewer.screenshot(path="/tmp/kiln-ui-promotions-review.png", full_page=True)

            # A blank reason is refused by the service, shown on the page; nothing is decided.
            reviewer.fill("#approve-reason", "   ")
            reviewer.click("#approve-button")
            expect(reviewer.locator("#decision-error-code")).to_have_text("reason_required")
            expect(reviewer.locator("#promotion-state .badge")).to_have_text("pending")

            reviewer.fill("#approve-reason", "the suite got harder; samples look right")
            reviewer.click("#approve-button")
            expect(reviewer).to_have_url(stack.url + detail)
            decided = re.compile(r"^(approved — activating|applied)$")
            expect(reviewer.locator("#promotion-state .badge")).to_have_text(decided)
            expect(reviewer.locator("#promotion-decided-by")).to_have_text("reviewer")
            approval = reviewer.locator("#promotion-receipts tr.kind-approval")
            expect(approval.locator(".receipt-actor")).to_have_text("reviewer")
            expect(approval).to_contain_text("override")
            reviewer.screenshot(path="/tmp/kiln-ui-promotions-approved.png", full_page=True)

            # The requester's pages show the decision without a reload.
            expect(watcher.locator("#promotion-live")).not_to_have_attribute("data-state", "pending")
            expect(watcher.locator("#promotion-state .badge")).to_have_text(decided)
            expect(watcher.locator("#promotion-decided-by")).to_have_text("reviewer")
            expect(watcher.locator("#promotion-receipts tr.kind-approval .receipt-actor")).to_have_text("reviewer")
            expect(watcher.locator("#approve-form")).to_have_count(0)
            expect(watcher.locator("#promotion-decided")).to_contain_text("decided by reviewer")
            expect(queue.locator(f"#promotion-row-{promotion_id} .promotion-state .badge")).to_have_text(decided)
            expect(queue.locator(f"#promotion-row-{promotion_id} .promotion-decided-by")).to_have_text("reviewer")
            assert watcher.evaluate("window.kilnSamePage") is True and queue.evaluate("window.kilnSamePage") is True
            watcher.screenshot(path="/tmp/kiln-ui-promotions-watcher.png", full_page=True)
        finally:
            browser.close()
