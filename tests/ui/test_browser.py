"""The dashboard in a real browser against a real stack: daphne, Redis, a GPU worker process.

Debian's chromium is driven through Playwright's sync API (Playwright cannot download browsers
here). The test job is step-gated, so the test decides when progress moves and can check that the
page changes without a reload.
"""

from __future__ import annotations

import re

from tests.support.browser import PASSWORD, TIMEOUT_MS, browser_marks, launch, submit_login
from tests.support.stack import wait_until

pytestmark = browser_marks


def _job_state(stack, token: str, job_id: str) -> str:
    return stack.client(token).get(f"/v1/jobs/{job_id}").json()["state"]


def test_live_progress_and_cancel_in_a_real_browser(stack, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    stack.start_web()
    token = stack.create_user("alice", PASSWORD)
    stack.start_worker("gpu-worker", "gpu,infer")
    gate, later_gate = tmp_path / "gate", tmp_path / "later"
    gate.mkdir()
    later_gate.mkdir()
    (job_id,) = stack.submit("test.steps", {"steps": 3, "gate_dir": str(gate)})
    wait_until(lambda: _job_state(stack, token, job_id) == "running", 30, what="the worker to start the job")

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)

            # Every page needs a login; the form sends us back where we were going.
            page.goto(stack.url + "/ui/jobs/")
            expect(page).to_have_url(re.compile(r"/ui/login/\?next=/ui/jobs/$"))
            submit_login(page, "alice")
            expect(page).to_have_url(stack.url + "/ui/jobs/")
            expect(page.locator(".topbar .user")).to_have_text("alice")

            # The jobs table: its socket replaces the body with a snapshot, then rows follow the job.
            row = page.locator(f"#job-row-{job_id}")
            expect(page.locator("#jobs-body[data-source=live]")).to_have_count(1)
            expect(page.locator(".table-wrap[data-ws=open]")).to_have_count(1)
            expect(row.locator(".badge.state-running")).to_be_visible()
            expect(row.locator(".pct")).to_have_text("0%")
            page.evaluate("window.kilnSamePage = true")
            (gate / "step-1").touch()
            expect(row.locator(".pct")).to_have_text("33%")
            expect(row.locator("td.progress-message")).to_contain_text("step 1/3")
            # A job submitted now appears on top without a reload (it waits: the gpu queue is busy).
            (later_id,) = stack.submit("test.steps", {"steps": 1, "gate_dir": str(later_gate)})
            expect(page.locator("#jobs-body tr.job").first).to_have_id(f"job-row-{later_id}")
            expect(page.locator(f"#job-row-{later_id} .badge.state-queued")).to_be_visible()
            assert page.evaluate("window.kilnSamePage") is True, "the jobs page reloaded"
            page.screenshot(path="/tmp/kiln-ui-jobs.png", full_page=True)

            # The job page follows the same job live.
            row.locator("a").first.click()
            expect(page).to_have_url(f"{stack.url}/ui/jobs/{job_id}/")
            expect(page.locator("#job-live[data-source=live]")).to_have_count(1)
            expect(page.locator("#job-progress .pct")).to_have_text("33%")
            page.evaluate("window.kilnSamePage = true")
            (gate / "step-2").touch()
            expect(page.locator("#job-progress .pct")).to_have_text("67%")
            expect(page.locator("#job-message")).to_have_text("step 2/3")
            expect(page.locator("#job-metrics")).to_contain_text("step")
            expect(page.locator("#job-events")).to_contain_text("step 2/3")
            assert page.evaluate("window.kilnSamePage") is True, "the job page reloaded"
            page.screenshot(path="/tmp/kiln-ui-job.png", full_page=True)

            # Cancel is a plain form POST; the worker stops at its next check and the page shows it.
            page.click("#cancel-job")
            expect(page.locator(".messages")).to_contain_text("Cancellation requested")
            expect(page.locator("#job-state .badge").first).to_have_text("cancelled")
            expect(page.locator("#job-error")).to_contain_text("job_cancelled")
            expect(page.locator("#cancel-job")).to_have_count(0)
            expect(page.locator("#job-progress .pct")).to_have_text("67%")  # it stopped between steps
            page.screenshot(path="/tmp/kiln-ui-job-cancelled.png", full_page=True)
            assert _job_state(stack, token, job_id) == "cancelled"

            page.goto(stack.url + "/ui/")
            expect(page.locator("#count-cancelled .n")).to_have_text("1")
            page.screenshot(path="/tmp/kiln-ui-overview.png", full_page=True)
        finally:
            browser.close()
