"""The jobs page's live layer in a real browser against a real stack (daphne, Redis): a state-filtered
table drops a row whose job leaves the state, a tab whose session logged out elsewhere stops getting
rows, and no page asks for a /favicon.ico that is not there."""

from __future__ import annotations

from tests.support.browser import TIMEOUT_MS, browser_marks, launch, login

pytestmark = browser_marks


def test_state_filter_live_rows_and_logout_closes_other_tabs(stack):
    from playwright.sync_api import expect, sync_playwright

    stack.start_web()
    token = stack.create_user("alice")
    api = stack.client(token)

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            expect.set_options(timeout=TIMEOUT_MS)
            page = login(browser, stack, "alice", path="/ui/jobs/?state=queued")
            icons = []
            page.on("requestfinished", lambda request: icons.append((request.url, request.response().status))
                    if "favicon" in request.url else None)
            page.reload()
            expect(page.locator(".table-wrap[data-ws=open]")).to_have_count(1)
            expect(page.locator("#jobs-body tr.empty-row")).to_contain_text("No queued jobs.")

            # A job queued now appears; cancelled, it leaves this queued-only table without a reload.
            (job_id,) = stack.submit("test.steps", {"steps": 1})
            expect(page.locator(f"#job-row-{job_id}")).to_have_count(1)
            page.evaluate("window.kilnSamePage = true")
            assert api.delete(f"/v1/jobs/{job_id}").status_code == 200
            expect(page.locator(f"#job-row-{job_id}")).to_have_count(0)
            assert page.evaluate("window.kilnSamePage") is True

            # A second tab of the same session logs out: the first tab's socket closes and stays shut.
            other = page.context.new_page()
            other.goto(stack.url + "/ui/")
            other.click(".topbar form button[type=submit]")
            expect(other).to_have_url(stack.url + "/ui/login/")
            expect(page.locator(".table-wrap[data-ws=closed]")).to_have_count(1)
            (later_id,) = stack.submit("test.steps", {"steps": 1})
            page.wait_for_timeout(3000)  # longer than htmx's first reconnect delay
            expect(page.locator(f"#job-row-{later_id}")).to_have_count(0)
            expect(page.locator(".table-wrap[data-ws=open]")).to_have_count(0)

            assert icons and all(url.endswith("/static/kiln/favicon.svg") and status == 200 for url, status in icons), \
                icons
        finally:
            browser.close()
