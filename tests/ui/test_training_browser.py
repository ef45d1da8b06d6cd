"""Training → GRPO in a real browser against a real stack (daphne, Redis, the product settings).

The form is filled and submitted by Chromium (file upload included). No GPU worker runs: a
subprocess that shares the stack's database plays the worker, claiming the job and reporting the
metrics the GRPO trainer writes, so the test sees the curves and the queue move without a reload.
Screenshots land in /tmp/kiln-ui-training-*.png.
"""

from __future__ import annotations

import json
import re
import sys

from tests.support.browser import PASSWORD, TIMEOUT_MS, browser_marks, launch, login

GROUPS = [
    {"messages": [{"role": "user", "content": "What is 47 + 138? Reply with just the number."}],
     "completions": [{"text": "185", "reward": 1.0}, {"text": "175", "reward": 0.0}, {"text": "185", "reward": 1.0}]},
    {"messages": [{"role": "user", "content": "What is 12 * 12?"}],
     "completions": [{"text": "144", "reward": 1.0}, {"text": "124", "reward": 0.0}]},
]

pytestmark = browser_marks

# Plays the GPU worker from a subprocess on the stack's database: argv = action, job id, JSON.
FAKE_WORKER = r"""
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")
import django
django.setup()
from pathlib import Path
from adapters.services import adapter_publish
from core.jobs import selectors, services
action, job_id, data = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
job = selectors.job_get(job_id=job_id)
if action == "claim":
    assert services.job_claim_next(queue="gpu", worker_id="fake-gpu-worker").uuid == job.uuid
elif action == "progress":
    services.job_report_progress(job=job, progress=data["progress"], message=data["message"], metrics=data["metrics"])
elif action == "publish":
    path = Path(data["path"])
    path.mkdir(parents=True, exist_ok=True)
    (path / "train_receipt.json").write_text(json.dumps(data["receipt"]))
    adapter_publish(name=data["name"], path=path, content_sha256="sha256:" + "5e" * 32,
                    base_model_sha256="sha256:" + "b0" * 32, loaded=False)
    services.job_complete(job=job, result={"adapter_path": str(path)})
"""


def _worker(stack, action: str, job_id: str, data: dict | None = None) -> None:
    stack.run([sys.executable, "-c", FAKE_WORKER, action, job_id, json.dumps(data or {})])


def _metrics(step: int, total: int) -> dict:
    import math

    loss = [{"step": s, "loss": round(0.72 * math.exp(-s / 9) + 0.05 * math.sin(s * 1.7) + 0.08, 4)}
            for s in range(1, step + 1)]
    reward = [{"step": s, "reward_mean": round(0.35 + 0.5 * (1 - math.exp(-s / 8)) + 0.04 * math.cos(s), 4)}
              for s in range(1, step + 1)]
    kl = [{"step": s, "kl_mean": round(0.002 * s + 0.004 * math.sin(s / 2), 5)} for s in range(1, step + 1)]
    return {"loss": loss[-1]["loss"], "step": step, "total_steps": total, "kept_groups": 2 * step - step // 4,
            "filtered_groups": step // 4, "loss_history": loss, "reward_history": reward, "kl_history": kl}


RECEIPT = {
    "schema_version": 1, "receipt_type": "kiln_train_receipt", "adapter_name": "math-r001",
    "produced_at": "2025-06-01T12:00:00Z", "status": "success", "failure_reason": None, "failure_message": None,
    "hyperparameters": {"mode": "grpo", "rank": 16, "alpha": 32.0, "learning_rate": 2e-5, "epochs": 1, "seed": "7"},
    "grpo": {"kl_coeff": 0.1, "clip_epsilon": 0.2, "dynamic_sampling": True, "dynamic_groups_filtered": 6,
             "advantage_mode": "dr_grpo", "is_level": "token", "behavior_policy": "no_importance_correction",
             "policy_audit": {
                 "schema": "kiln.grpo-policy-audit.v1",
                 "importance_sampling": {"ratio_scope": "token", "action_tokens": 18432, "ratio_observations": 0,
                                         "below_clip_count": 0, "above_clip_count": 0},
                 "kl_reference": {"token_observations": 18432, "entropy_mask_applied_tokens": 0,
                                  "mean_policy_reference_log_ratio": 0.0182, "mean_estimator": 0.0179}}},
    "data": {"groups_read": 30, "groups_filtered": 6, "groups_trained": 24, "completions_read": 120,
             "completions_trained": 96, "reward_groups_filtered": 6, "reward_groups_kept": 24},
    "rewards": {"count": 120, "mean": 0.61, "stdev": 0.47, "min": 0.0, "max": 1.0, "group_count": 30,
                "all_pass_group_count": 4, "all_fail_group_count": 2, "degenerate_group_count": 6,
                "group_variance_histogram": [{"label": "0", "count": 6}, {"label": "(0, 0.1]", "count": 5},
                                             {"label": "(0.1, 0.2]", "count": 11}, {"label": "> 0.2", "count": 8}]},
    "phase_timings": {"tokenize_ms": 310, "mask_build_ms": 42, "reference_forward_ms": 2950,
                      "policy_forward_ms": 4120, "backward_ms": 8310, "optimizer_ms": 610,
                      "gpu_writer_wait_ms": 15, "gpu_writer_held_ms": 16400, "gpu_writer_acquisitions": 24},
    "runtime": {"wall_clock_ms": 17850, "peak_vram_mib": 5120},
}


def test_grpo_form_queue_and_live_training_job_page(stack_factory, tiny_model_dir, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    # A configured model (training is refused with 503 mock_mode without one); the worker is played.
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
    stack.start_web()
    stack.create_user("alice", PASSWORD)
    corpus = tmp_path / "math-r001.jsonl"
    corpus.write_text("".join(json.dumps(g) + "\n" for g in GROUPS))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GROUPS[0]).replace("0.0", "NaN") + "\n")

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            expect.set_options(timeout=TIMEOUT_MS)
            page = login(browser, stack, "alice", path="/ui/training/grpo/")
            expect(page.locator("#training-queue[data-source=live]")).to_have_count(1)

            # A NaN reward: the page comes back with the error next to the upload, nothing queued.
            page.set_input_files("#id_jsonl_file", str(bad))
            page.fill("#id_output_name", "math-r001")
            page.click("#submit-grpo")
            expect(page.locator("#error-jsonl_file")).to_contain_text("must be finite")
            expect(page.locator("#id_output_name")).to_have_value("math-r001")
            page.screenshot(path="/tmp/kiln-ui-training-grpo-error.png", full_page=True)

            # A good corpus: queued, and the browser lands on the job page.
            page.set_input_files("#id_jsonl_file", str(corpus))
            page.fill("#id_lora_rank", "16")
            page.fill("#id_seed", "7")
            page.uncheck("#id_auto_load")
            page.click("#submit-grpo")
            expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}/$"))
            job_id = page.url.rstrip("/").rsplit("/", 1)[1]
            expect(page.locator("#job-live[data-source=live]")).to_have_count(1)
            expect(page.locator("#training-section")).to_contain_text("waiting for the first optimizer step")

            # The worker starts and reports optimizer groups: curves grow without a reload.
            page.evaluate("window.kilnSamePage = true")
            _worker(stack, "claim", job_id)
            expect(page.locator("#job-state .badge").first).to_have_text("running")
            _worker(stack, "progress", job_id, {"progress": 6 / 30, "message": "group 6/30",
                                                "metrics": _metrics(6, 30)})
            expect(page.locator("#training-step")).to_contain_text("step 6 / 30")
            _worker(stack, "progress", job_id, {"progress": 22 / 30, "message": "group 22/30",
                                                "metrics": _metrics(22, 30)})
            expect(page.locator("#training-step")).to_contain_text("step 22 / 30")
            points = page.locator("#curve-loss polyline").get_attribute("points")
            assert len(points.split()) == 22
            assert page.evaluate("window.kilnSamePage") is True, "the job page reloaded"
            page.screenshot(path="/tmp/kiln-ui-training-job.png", full_page=True)

            # A second submission waits in the queue behind the running one.
            page.goto(stack.url + "/ui/training/grpo/")
            expect(page.locator("#queue-running")).to_contain_text("math-r001")
            page.set_input_files("#id_jsonl_file", str(corpus))
            page.fill("#id_output_name", "math-r002")
            page.click("#submit-grpo")
            expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}/$"))
            page.goto(stack.url + "/ui/training/grpo/")
            expect(page.locator("#queue-queued")).to_contain_text("#1")
            expect(page.locator("#queue-queued")).to_contain_text("math-r002")
            page.screenshot(path="/tmp/kiln-ui-training-grpo.png", full_page=True)

            # Publication: the job page shows the receipt, live.
            page.goto(f"{stack.url}/ui/jobs/{job_id}/")
            expect(page.locator("#job-live[data-source=live]")).to_have_count(1)
            _worker(stack, "progress", job_id, {"progress": 1.0, "message": "group 30/30",
                                                "metrics": _metrics(30, 30)})
            _worker(stack, "publish", job_id, {"name": "math-r001", "path": str(tmp_path / "adapters" / "math-r001"),
                                               "receipt": RECEIPT})
            expect(page.locator("#job-state .badge").first).to_have_text("completed")
            expect(page.locator("#training-receipt")).to_contain_text("kiln.grpo-policy-audit.v1")
            expect(page.locator("#receipt-link")).to_have_attribute("href", "/v1/adapters/math-r001/receipt")
            page.screenshot(path="/tmp/kiln-ui-training-job-done.png", full_page=True)

            page.goto(stack.url + "/ui/adapters/")
            expect(page.locator("#adapter-row-math-r001 .badge").first).to_have_text("published")
            expect(page.locator("#adapter-row-math-r002 .badge").first).to_have_text("writing")
            page.screenshot(path="/tmp/kiln-ui-training-adapters.png", full_page=True)
            page.click("#adapter-row-math-r001 a >> nth=0")
            expect(page.locator("#adapter-receipt")).to_contain_text("kiln_train_receipt")
            page.screenshot(path="/tmp/kiln-ui-training-adapter.png", full_page=True)
        finally:
            browser.close()
