"""Training → OpenEnv in a real browser against a real stack (daphne, Redis, the product settings)
and a real OpenEnv server (PyPI openenv==0.10.0 in its own venv, tests/openenv/real_server.py).

Chromium fills the form for a rollout run, clicks Inspect (the schema hash the page shows is the
one the pure client computes), submits, and watches the run card reach rollout_ready without a
reload; then it downloads every artifact link and the bytes hash to the SHA-256 on the card. No
model runs: a subprocess on the stack's database plays the control worker, with the deterministic
fake policy (tests/openenv/collector_fakes.py) in place of the served model, and drains the
control queue the way tests/openenv/runs/ do in process (`run_queued_jobs("control")`).
Screenshots land in /tmp/kiln-ui-openenv-*.png.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sys
from pathlib import Path

import pytest

from tests.support.browser import PASSWORD, browser_marks, launch, login

TIMEOUT_MS = 30_000

pytestmark = [*browser_marks, pytest.mark.timeout(600)]

# The control worker, on the stack's database: the fake policy (a little slow, so the card is seen
# collecting) instead of the model; it drains the control queue until no run is left unfinished.
CONTROL_WORKER = r"""
import asyncio, os, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")
import django
django.setup()
from core.jobs.runner import run_queued_jobs
from openenv.models import TERMINAL_STATES, OpenEnvRun
from openenv.runs import jobs
from tests.openenv.collector_fakes import FakeCounterPolicy

class SlowPolicy(FakeCounterPolicy):
    async def __call__(self, request):
        await asyncio.sleep(0.4)
        return await super().__call__(request)

jobs.make_policy = lambda run, ctx: SlowPolicy()
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    run_queued_jobs("control")
    if OpenEnvRun.objects.exists() and not OpenEnvRun.objects.exclude(state__in=TERMINAL_STATES).exists():
        break
    time.sleep(0.2)
print("control worker done", list(OpenEnvRun.objects.values_list("state", flat=True)), flush=True)
"""


def test_a_rollout_run_from_the_form_inspected_collected_live_and_downloaded(stack, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from openenv.client.discovery import inspect
    from openenv.client.urls import normalize_url
    from tests.openenv.real_server import RealServer, openenv_python

    server = RealServer(openenv_python(), tmp_path / "env", max_sessions=8).start()
    try:
        identity = asyncio.run(inspect(normalize_url(server.url))).identity
        stack.start_web()
        stack.create_user("alice", PASSWORD)
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                expect.set_options(timeout=TIMEOUT_MS)
                page = login(browser, stack, "alice", path="/ui/training/openenv/", timeout_ms=TIMEOUT_MS,
                             accept_downloads=True)
                expect(page.locator("#no-runs")).to_be_visible()

                # A second row can be added and removed (htmx), then Inspect the first.
                page.click("#add-environment")
                expect(page.locator(".env-row")).to_have_count(2)
                page.locator(".env-row").nth(1).locator(".remove-env").click()
                expect(page.locator(".env-row")).to_have_count(1)
                page.fill("#id_environment_url-0", server.url)
                page.click("#inspect-0")
                shown = page.locator("#inspection-0 .inspect-schema-sha256")
                expect(shown).to_have_text(identity["schema_sha256"])
                expect(page.locator("#inspection-0 .inspect-discovery-sha256")).to_have_text(
                    identity["discovery_sha256"])
                expect(page.locator("#inspection-0 .inspect-name")).to_have_text("kiln_counter")
                expect(page.locator("#inspection-0 .catalog")).to_contain_text("Task catalog")
                page.screenshot(path="/tmp/kiln-ui-openenv-inspect.png", full_page=True)

                for selector, value in (("#id_groups", "2"), ("#id_group_size", "2"), ("#id_seed_start", "100"),
                                        ("#id_max_steps", "4"), ("#id_concurrency", "2"),
                                        ("#id_capacity_wait_seconds", "5"), ("#id_reset_options", '{"target": 4}')):
                    page.fill(selector, value)
                key = page.locator("#id_idempotency_key").input_value()
                assert key.startswith("ui:")
                page.click("#submit-openenv")
                card = page.locator("article.run-card").first
                expect(card).to_be_visible()
                run_id = card.get_attribute("id").removeprefix("run-")
                expect(page).to_have_url(re.compile(rf"/ui/training/openenv/#run-{run_id}$"))
                expect(page.locator("#openenv-runs")).to_have_attribute("data-active", "true")
                expect(card.locator(".run-groups")).to_have_text("0 / 2 groups")

                # The control worker collects; the card follows without a reload.
                page.evaluate("window.kilnSamePage = true")
                stack.spawn("control", [sys.executable, "-c", CONTROL_WORKER])
                card = page.locator(f"#run-{run_id}")
                expect(card).to_have_attribute("data-state", "rollout_ready", timeout=180_000)
                assert page.evaluate("window.kilnSamePage") is True, "the page reloaded"
                expect(page.locator("#openenv-runs")).to_have_attribute("data-active", "false")
                expect(card.locator(".run-groups")).to_have_text("2 / 2 groups")
                expect(card.locator(".run-rollouts")).to_have_text("4 / 4 rollouts")
                expect(card.locator(".run-mean-return")).not_to_be_empty()
                expect(card.locator(".run-terminations")).to_contain_text("done")
                expect(card.locator(".artifact")).to_have_count(3)
                expect(card.locator(".cancel-run")).to_have_count(0)
                assert identity["schema_sha256"][:20] in card.locator(".run-environments").inner_text()
                page.screenshot(path="/tmp/kiln-ui-openenv-ready.png", full_page=True)

                for row in card.locator(".artifact").all():
                    kind = row.get_attribute("data-kind")
                    with page.expect_download() as download_info:
                        row.locator(".artifact-link").click()
                    download = download_info.value
                    data = Path(download.path()).read_bytes()
                    assert "sha256:" + hashlib.sha256(data).hexdigest() == row.locator(".artifact-sha256").inner_text()
                    assert download.suggested_filename.startswith(f"openenv-{run_id}-{kind}.")
            finally:
                browser.close()
    finally:
        server.stop()
