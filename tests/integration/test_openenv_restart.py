"""OpenEnv runs across a control worker killed with -9 and started again (issue 15: restart rules).

Through the real processes: web, a GPU worker serving the tiny model, a control worker collecting,
and a real `openenv==0.10.0` counter server. With `max_active_runs = 1`, run A collects (512
one-move episodes, about half a minute) while run B waits queued, never admitted. The control
worker is killed with SIGKILL in the middle of A's collection; a new control worker boots and
restores: A, which was executing, fails `run_interrupted` at stage `restoration` (retryable, no
artifact published), and B, never admitted, resumes in sequence order and completes
`rollout_ready` with its artifacts. (This test found that the job hooks saw the job as loaded, not
as it ended: A was reported `orchestration_failed`; tests/core/test_unsuccessful_hook.py.)"""

from __future__ import annotations

import pytest

from tests.support.stack import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(900)]


def _body(url: str, groups: int, group_size: int, key: str) -> dict:
    return {"kind": "rollout", "idempotency_key": key, "environment_urls": [url], "groups": groups,
            "group_size": group_size, "max_steps": 1, "max_action_tokens": 32, "concurrency": 8,
            "thinking": False, "reset_options": {"targets": [1, 2, 3]}, "capacity_wait_seconds": 30}


def test_a_killed_control_worker_fails_the_run_it_ran_and_resumes_the_queued_one(stack_factory, tiny_model_dir,
                                                                                tmp_path):
    from tests.openenv.real_server import RealServer, openenv_python

    server = RealServer(openenv_python(), tmp_path / "env", max_sessions=8).start()
    try:
        stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir, KILN_OPENENV_MAX_ACTIVE_RUNS="1")
        stack.start_web()
        api = stack.client(stack.create_user("alice"))
        stack.start_worker("gpu-worker", "gpu,infer", threads=4)
        stack.start_worker("control-worker", "control", threads=4)
        wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")

        a = api.post("/v1/openenv/runs", json=_body(server.url, 64, 8, "restart:a")).json()
        b = api.post("/v1/openenv/runs", json=_body(server.url, 2, 2, "restart:b")).json()
        assert b["state"] == "queued" and b["admission"]["queue_position"] == 1, b

        def collecting():
            status = api.get(f"/v1/openenv/runs/{a['run_id']}").json()
            return status if status["state"] == "collecting" and status["progress"]["rollouts_completed"] >= 16 \
                else None

        mid = wait_until(collecting, 180, interval=0.2, what="run A to be collecting")
        stack.kill("control-worker")
        assert mid["progress"]["rollouts_completed"] < mid["progress"]["rollouts_total"]
        assert api.get(f"/v1/openenv/runs/{b['run_id']}").json()["state"] == "queued"

        stack.start_worker("control-worker-2", "control", threads=4)

        def settled(run_id, states):
            status = api.get(f"/v1/openenv/runs/{run_id}").json()
            return status if status["state"] in states else None

        failed = wait_until(lambda: settled(a["run_id"], ("failed", "rollout_ready", "cancelled")), 120,
                            interval=0.5, what="run A to be restored")
        assert failed["state"] == "failed", failed
        failure = failed["failure"]
        assert (failure["code"], failure["stage"], failure["retryable"]) == ("run_interrupted", "restoration", True)
        assert failed["artifacts"] == []
        done = wait_until(lambda: settled(b["run_id"], ("failed", "rollout_ready", "cancelled")), 300,
                          interval=0.5, what="run B to resume and finish")
        assert done["state"] == "rollout_ready", done
        assert done["admission"]["sequence"] == b["admission"]["sequence"] and done["admission"]["admitted_unix_ms"]
        assert [x["kind"] for x in done["artifacts"]] == ["dataset", "replay", "summary"]
        assert done["progress"]["rollouts_completed"] == 4
    finally:
        server.stop()
