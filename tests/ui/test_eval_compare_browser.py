"""An eval compare in a real browser against a real stack: web (daphne), a `gpu,infer` worker serving the
tiny model, a `control` worker (as tests/integration/test_eval_jobs_stack.py).

Chromium opens a five-example arithmetic suite's page, runs a compare of the base model against the
base model (temperature 0, a seed) through its "Run evaluation" form, lands on the eval job's page
and sees the outcome counts the API reports once the job completes, then opens the compare view from
there: per-target counts equal the API's, there is one row per example with both completions, and
the two columns agree (same seeds, same model), so "differing only" shows none.
Screenshots land in /tmp/kiln-ui-eval-*.png.
"""

from __future__ import annotations

from tests.support.browser import PASSWORD, browser_marks, launch, login
from tests.support.stack import wait_until

pytestmark = browser_marks

TIMEOUT_MS = 30_000
TERMINAL = ("completed", "failed", "cancelled")
SUITE = {"name": "sums", "scorer": {"type": "exact"},
         "examples": [{"id": f"q{i}", "messages": [{"role": "user", "content": f"What is {i} + {i + 1}?"}],
                       "target": str(2 * i + 1)} for i in range(1, 6)]}


def test_compare_base_with_base_and_see_the_outcome_counts(stack_factory, tiny_model_dir):
    from playwright.sync_api import expect, sync_playwright

    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
    stack.start_web()
    token = stack.create_user("alice", PASSWORD)
    stack.start_worker("gpu-worker", "gpu,infer", threads=2)
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    stack.start_worker("control-worker", "control", threads=2)
    api = stack.client(token)
    api.timeout = 60
    assert api.post("/v1/eval/suites", json=SUITE).status_code == 200

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            expect.set_options(timeout=TIMEOUT_MS)
            page = login(browser, stack, "alice", path="/ui/evaluations/suites/sums/", timeout_ms=TIMEOUT_MS)

            # Base against base, through the suite page's form.
            page.select_option("#id_target_0", "base")
            page.select_option("#id_target_1", "base")
            page.fill("#id_temperature", "0")
            page.fill("#id_max_tokens", "12")
            page.fill("#id_seed", "42")
            page.locator("#suite-run").screenshot(path="/tmp/kiln-ui-eval-run-form.png")
            page.click("#run-evaluation")
            page.wait_for_url(lambda url: "/ui/jobs/" in url)
            job_id = page.url.rstrip("/").split("/")[-1]
            expect(page.locator("#eval-section")).to_be_visible()
            expect(page.locator("#eval-suite")).to_have_text("sums")

            wait_until(lambda: api.get(f"/v1/jobs/{job_id}").json()["state"] in TERMINAL, 300, interval=0.5,
                       what=f"eval job {job_id} to finish")
            result = api.get(f"/v1/eval/jobs/{job_id}").json()
            assert result["state"] == "completed", result["error"]
            assert result["mode"] == "compare" and result["targets"][0]["label"] == "base" == \
                result["targets"][1]["label"]
            assert result["counts"] is None  # a compare has no pooled counts, each target has its own
            assert sum(sum(t["counts"].values()) for t in result["targets"]) == 10
            page.reload()  # the page is live over its socket too; a reload does not depend on it
            for target in result["targets"]:
                for kind, count in target["counts"].items():
                    expect(page.locator(f"#eval-target-{target['index']}-{kind}")).to_have_text(str(count))
            expect(page.locator("#eval-count")).to_contain_text("10 scored completions")
            page.screenshot(path="/tmp/kiln-ui-eval-job.png", full_page=True)

            page.click("#eval-compare-link")
            expect(page).to_have_url(f"{stack.url}/ui/evaluations/jobs/{job_id}/compare/")
            for target in result["targets"]:
                index = target["index"]
                for kind, count in target["counts"].items():
                    expect(page.locator(f"#compare-target-{index}-{kind}")).to_have_text(str(count))
            rows = page.locator("#compare-table tbody tr.compare-row")
            expect(rows).to_have_count(5)
            for position, example in enumerate(SUITE["examples"]):
                expect(rows.nth(position)).to_have_attribute("data-example-id", example["id"])
            expect(page.locator("#compare-table .compare-cell")).to_have_count(10)
            first = result["examples"][0]
            cell = rows.nth(0).locator(".compare-cell").nth(0)
            expect(cell).to_have_attribute("data-outcome", first["outcome"])
            cell.locator("summary").click()
            expect(cell.locator("pre")).to_be_visible()
            assert cell.locator("pre").inner_text() == first["completion"]
            expect(page.locator("#filter-differing")).to_have_text("Differing only (0)")
            page.screenshot(path="/tmp/kiln-ui-eval-compare.png", full_page=True)

            page.click("#filter-differing")
            expect(page.locator("#compare-table tbody tr.compare-row")).to_have_count(0)
            expect(page.locator("#compare-table")).to_contain_text("No example where the targets differ.")

            page.goto(stack.url + "/ui/evaluations/jobs/")
            row = page.locator(f"#eval-job-{job_id}")
            expect(row).to_contain_text("compare view")
            expect(row).to_contain_text("base, base")
            expect(page.locator("#eval-jobs-body")).to_have_attribute("data-active", "false")
            page.screenshot(path="/tmp/kiln-ui-eval-jobs.png", full_page=True)
        finally:
            browser.close()
