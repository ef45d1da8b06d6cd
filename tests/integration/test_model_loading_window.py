"""Work queued while the GPU worker is still loading the model waits for it (issue 11).

The GPU worker's `gpu` queue opens only once the resident model has finished loading, so a job
submitted right after /health first answers does not race the load; it runs after it."""

from __future__ import annotations

import time

import pytest

from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

DELAY = 6.0


def test_gpu_work_queued_during_model_loading_starts_after_the_model_is_resident(stack_factory, tiny_model_dir):
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir, KILN_TEST_MODEL_LOAD_DELAY=DELAY,
                          KILN_EXTRA_JOB_MODULES="tests.support.job_kinds,tests.support.slow_model")
    stack.start_web()
    token = stack.create_user()
    api = stack.client(token)
    stack.start_worker("gpu-worker", "gpu,infer")

    def model():
        workers = [w for w in stack.health()["workers"]["workers"] if "infer" in w["queues"]]
        return (workers[0]["status"].get("model") or {}) if workers else {}

    assert model().get("loaded") is not True  # still inside the loading window
    (job_id,) = stack.submit("test.steps", {"steps": 2, "delay": 0.1})
    seen_queued_while_loading = 0
    while not model().get("loaded"):
        state = api.get(f"/v1/jobs/{job_id}").json()["state"]
        assert state == "queued", f"the job left the queue ({state}) before the model was resident"
        seen_queued_while_loading += 1
        time.sleep(0.3)
    loaded_at = time.time()
    assert seen_queued_while_loading >= 3
    done = wait_until(lambda: (j := api.get(f"/v1/jobs/{job_id}").json())["state"] == "completed" and j, 60,
                      what="the queued job to complete once the model is loaded")
    assert done["result"] == {"steps_done": 2}
    # The job started after the load finished (the heartbeat saw it within a second or so).
    from datetime import datetime

    started = datetime.fromisoformat(done["started_at"].replace("Z", "+00:00")).timestamp()
    assert started >= loaded_at - 2.0
    # Chat works at once too: the model the job waited for is the one being served.
    reply = api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 4}, timeout=60)
    assert reply.status_code == 200, reply.text
