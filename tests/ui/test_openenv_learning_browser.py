"""The same OpenEnv training run as tests/integration/test_openenv_learning_e2e.py, submitted from the
dashboard in a real browser (issue 15): Training → OpenEnv's form, kind train, against the counter
environment served by `openenv==0.10.0`, with the served tiny model collecting through the real
workers, training, and the held-out environment evaluation with its gate.

Chromium fills every field the CLI run sets (one move per episode, targets 1..3 as the reset
option, thinking off, AdamW 3e-4 as the training config, LoRA rank 8, 80 x 4 held-out groups, the
gate with min_mean_improvement 0.1), submits, and watches the card go to `completed` without a
reload; the card shows the gate's outcome (`promoted`), its counts and exact p, which the test
checks against the run's status and a sign test computed here; the adapter then serves. The run
is seeded, so it measures what the CLI run measures (on the current release: held-out return
-0.13 -> 1.49, 75 better, 2 worse, 3 tied). About 3 minutes. Screenshot: /tmp/kiln-ui-openenv-learning.png.
"""

from __future__ import annotations

import json
import re

import pytest

from evaluations.statistics import sign_test
from tests.integration.test_openenv_learning_e2e import (
    EVAL_GROUP_SIZE,
    EVAL_GROUPS,
    GOOD,
    GROUP_SIZE,
    GROUPS,
    RESET,
)
from tests.support.browser import PASSWORD, browser_marks, launch, login
from tests.support.stack import wait_until

pytestmark = [*browser_marks, pytest.mark.learning, pytest.mark.timeout(1200)]


def test_a_train_run_from_the_form_learns_the_environment_and_its_gate_promotes_it(stack_factory, tiny_model_dir,
                                                                                   tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from tests.openenv.real_server import RealServer, openenv_python
    server = RealServer(openenv_python(), tmp_path / "env", max_sessions=16).start()
    try:
        stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
        stack.start_web()
        token = stack.create_user("alice", PASSWORD)
        stack.start_worker("gpu-worker", "gpu,infer", threads=4)
        stack.start_worker("control-worker", "control", threads=4)
        wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
        api = stack.client(token)
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                expect.set_options(timeout=30_000)
                page = login(browser, stack, "alice", path="/ui/training/openenv/", timeout_ms=30_000)
                page.check("#id_kind_train")
                page.fill("#id_environment_url-0", server.url)
                page.fill("#id_output_adapter", "counter-agent-ui")
                for name, value in (("groups", GROUPS), ("group_size", GROUP_SIZE), ("seed_start", 0),
                                    ("max_steps", 1), ("max_action_tokens", 32), ("concurrency", 16),
                                    ("tc_lora_rank", 8), ("ee_groups", EVAL_GROUPS),
                                    ("ee_group_size", EVAL_GROUP_SIZE), ("gate_min_mean_improvement", 0.1)):
                    page.fill(f"#id_{name}", str(value))
                page.fill("#id_reset_options", json.dumps(RESET))
                page.fill("#id_training_config_json", json.dumps(GOOD))
                page.uncheck("#id_thinking")
                page.check("#id_environment_eval")
                page.check("#id_gate")
                page.click("#submit-openenv")
                card = page.locator("article.run-card").first
                expect(card).to_be_visible()
                run_id = card.get_attribute("id").removeprefix("run-")
                expect(page).to_have_url(re.compile(rf"/ui/training/openenv/#run-{run_id}$"))
                page.evaluate("window.kilnSamePage = true")
                card = page.locator(f"#run-{run_id}")
                expect(card).to_have_attribute("data-state", "completed", timeout=900_000)
                assert page.evaluate("window.kilnSamePage") is True, "the page reloaded"
                page.screenshot(path="/tmp/kiln-ui-openenv-learning.png", full_page=True)

                status = api.get(f"/v1/openenv/runs/{run_id}").json()
                request = status["request"]
                assert (request["kind"], request["max_steps"], request["thinking"], request["reset_options"]) == (
                    "train", 1, False, RESET)
                assert request["training_config"]["learning_rate"] == GOOD["learning_rate"]
                assert request["environment_eval"]["gate"]["min_mean_improvement"] == 0.1
                evidence = status["environment_evaluation"]["evidence"]
                print(json.dumps(evidence, indent=1))
                assert evidence["decision"] == "passed" and evidence["mean_return_improvement"] >= 0.3
                assert evidence["exact_sign_test_p_value"] == pytest.approx(
                    sign_test(evidence["improved_groups"], evidence["regressed_groups"]), rel=1e-9)
                expect(card.locator(".run-gate-outcome")).to_have_text("promoted")
                expect(card.locator(".run-gate-counts")).to_have_text(
                    f"{evidence['improved_groups']} improved, {evidence['regressed_groups']} regressed, "
                    f"{evidence['tied_groups']} tied")
                assert float(card.locator(".run-gate-p").inner_text()) == pytest.approx(
                    evidence["exact_sign_test_p_value"], rel=1e-6)
            finally:
                browser.close()
        # "promoted" queues the activation: its serving canary runs on the GPU worker, then it serves.
        wait_until(lambda: api.get("/v1/adapters/counter-agent-ui").json()["loaded"], 120, interval=0.5,
                   what="the promoted adapter to pass its canary and serve")
    finally:
        server.stop()
