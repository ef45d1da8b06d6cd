"""Evaluations → Datasets in a real browser against a real stack (daphne, Redis, the product settings).

Chromium uploads a JSONL file through the page (a bad file first: the error is shown next to the
file and nothing is stored), lands on the dataset's page and sees the split counts the API reports,
previews a re-split, synthesizes a suite from the holdout, picks it in the GRPO form's post-eval
section (min accuracy is disabled with train-set-eval), and finds the dataset with the same counts
in the list. No worker is needed.
Screenshots land in /tmp/kiln-ui-evaluations-*.png.
"""

from __future__ import annotations

import json
import re

from tests.support.browser import PASSWORD, TIMEOUT_MS, browser_marks, launch, login

pytestmark = browser_marks


def _group(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": str(2 * i + 1), "reward": 0.0}],
            "reference": str(2 * i)}


def test_upload_a_dataset_through_the_page_and_see_its_split_counts(stack, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    stack.start_web()
    token = stack.create_user("alice", PASSWORD)
    corpus = tmp_path / "sums.jsonl"
    corpus.write_text("".join(json.dumps(_group(i)) + "\n" for i in range(24)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_group(0)) + "\n{oops\n")

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            expect.set_options(timeout=TIMEOUT_MS)
            page = login(browser, stack, "alice", path="/ui/evaluations/datasets/")
            expect(page.locator("#datasets-empty")).to_be_visible()

            # A broken line: the error sits next to the file, and nothing is stored.
            page.fill("#id_name", "sums")
            page.select_option("#id_format", "grpo_groups")
            page.set_input_files("#id_file", str(bad))
            page.click("#upload-dataset")
            expect(page.locator("#error-file")).to_contain_text("line 2")
            expect(page.locator("#id_name")).to_have_value("sums")
            assert stack.client(token).get("/v1/eval/datasets").json() == []

            page.set_input_files("#id_file", str(corpus))
            page.fill("#id_description", "twenty-four sums")
            page.click("#upload-dataset")
            expect(page).to_have_url(stack.url + "/ui/evaluations/datasets/sums/")
            counts = stack.client(token).get("/v1/eval/datasets/sums").json()["split_counts"]
            assert sum(counts.values()) == 24 and counts["train"] > 0 and counts["holdout"] > 0
            summary = page.locator("#split-counts")
            for partition in ("train", "validation", "holdout"):
                expect(summary).to_have_attribute(f"data-{partition}", str(counts[partition]))
                expect(summary).to_contain_text(f"{counts[partition]} {partition}")
            expect(page.locator(".messages")).to_contain_text("Uploaded dataset sums: 24 rows")
            expect(page.locator("#rows-range")).to_contain_text("of 24")
            page.screenshot(path="/tmp/kiln-ui-evaluations-dataset.png", full_page=True)

            # Preview a re-split: counts appear, the stored split stays.
            page.fill("#id_seed", "7")
            page.fill("#id_train_percent", "50")
            page.click("#split-preview")
            expect(page.locator("#split-preview-result")).to_contain_text("nothing was written")
            assert stack.client(token).get("/v1/eval/datasets/sums").json()["split_counts"] == counts

            # Synthesize a suite from the holdout; it becomes a choice of the GRPO form's post-eval section.
            page.fill("#id_suite_name", "sums-holdout")
            page.click("#synthesize-suite")
            expect(page).to_have_url(stack.url + "/ui/evaluations/suites/sums-holdout/")
            expect(page.locator("#examples-table tbody tr")).to_have_count(counts["holdout"])
            expect(page.locator("#examples-table")).to_contain_text("sums")
            page.screenshot(path="/tmp/kiln-ui-evaluations-suite.png", full_page=True)
            page.goto(stack.url + "/ui/training/grpo/")
            page.select_option("#id_post_eval_suite", "sums-holdout")
            expect(page.locator("#id_post_eval_min_accuracy")).to_be_enabled()
            page.select_option("#id_post_eval_data_scope", "train-set-eval")
            expect(page.locator("#id_post_eval_min_accuracy")).to_be_disabled()
            page.select_option("#id_post_eval_data_scope", "held-out")
            expect(page.locator("#id_post_eval_min_accuracy")).to_be_enabled()
            page.locator("#field-post-eval").screenshot(path="/tmp/kiln-ui-evaluations-post-eval.png")

            page.goto(stack.url + "/ui/evaluations/")
            expect(page.locator("#hub-suite-sums-holdout")).to_contain_text(str(counts["holdout"]))
            expect(page.locator("#eval-jobs")).to_contain_text("No evaluation jobs yet.")
            page.screenshot(path="/tmp/kiln-ui-evaluations-hub.png", full_page=True)

            page.goto(stack.url + "/ui/evaluations/datasets/")
            row = page.locator("#dataset-row-sums")
            expect(row).to_contain_text(f"{counts['train']} train")
            expect(row).to_contain_text(f"{counts['holdout']} holdout")
            expect(row.locator(".split-cell")).to_have_attribute("data-validation", str(counts["validation"]))
            expect(page.locator("nav.sidenav a[aria-current=page]")).to_have_text("Datasets")
            page.screenshot(path="/tmp/kiln-ui-evaluations-datasets.png", full_page=True)
            assert re.search(r"sha256:[0-9a-f]{12}", row.inner_text())
        finally:
            browser.close()
