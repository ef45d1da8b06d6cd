"""Playwright against Debian's chromium, for the tests that drive a real browser against a real stack.

Playwright cannot download its browsers here, so the tests launch /usr/bin/chromium and are skipped
where it is not installed. The users they log in as are made with PASSWORD (`stack.create_user`).
Playwright is imported inside the functions: collecting these tests must not need it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
PASSWORD = "correct-horse-42"
TIMEOUT_MS = 20_000

needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium (/usr/bin/chromium) is not installed")
# A browser test's module marks: `pytestmark = browser_marks` (or a list that adds to it).
browser_marks = [pytest.mark.browser, pytest.mark.integration, needs_chromium]


def launch(playwright):
    """Debian's chromium, headless, through a `sync_playwright()` handle."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def submit_login(page, username: str, password: str = PASSWORD) -> None:
    """Fill and send the login form the page shows (an anonymous user is sent to it from any page)."""
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("form.stack button[type=submit]")


def login(browser, stack_or_url, username: str, password: str = PASSWORD, path: str = "/ui/", *,
          height: int = 900, timeout_ms: int | None = TIMEOUT_MS, **context_options):
    """A page in a new browser context, logged in as `username` through the login form and back on
    `path` (the form sends the user where they were going). Each call is its own session, so two
    users can be on the stack at once. `timeout_ms=None` keeps Playwright's default timeout;
    `context_options` go to `browser.new_context` (e.g. accept_downloads=True)."""
    from playwright.sync_api import expect

    url = getattr(stack_or_url, "url", stack_or_url)
    page = browser.new_context(viewport={"width": 1360, "height": height}, **context_options).new_page()
    if timeout_ms is not None:
        page.set_default_timeout(timeout_ms)
    page.goto(url + path)
    submit_login(page, username, password)
    expect(page).to_have_url(url + path)
    return page
