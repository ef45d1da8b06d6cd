"""Jobs through real processes: Redis, a dramatiq worker, daphne, the database as the truth."""

from __future__ import annotations

import pytest

from tests.support.stack import wait_until

pytestmark = pytest.mark.integration


def _job(client, job_id: str) -> dict:
    response = client.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_queued_jobs_run_in_fifo_order_with_progress_and_events(stack, tmp_path):
    stack.start_web()
    token = stack.create_user()
    stack.start_worker("gpu-worker", "gpu,infer")
    api = stack.client(token)
    first, second = stack.submit("test.steps", {"steps": 3, "delay": 0.2}, {"steps": 2, "delay": 0.1})
    done = wait_until(lambda: _job(api, second)["state"] == "completed" and _job(api, second), 60,
                      what="second job to complete")
    one = _job(api, first)
    assert one["state"] == "completed"
    assert one["result"] == {"steps_done": 3}
    assert one["progress"] == 1.0
    # FIFO on the exclusive gpu queue: the second started only after the first finished.
    assert done["started_at"] >= one["finished_at"]
    types = [event["type"] for event in one["events"]]
    assert types[:2] == ["queued", "running"]
    assert types.count("progress") == 3
    assert types[-1] == "completed"


def test_cancel_running_job_over_api_and_cli_follow(stack, tmp_path):
    stack.start_web()
    token = stack.create_user()
    stack.start_worker("control-worker", "control")
    api = stack.client(token)
    gate = tmp_path / "gate"
    gate.mkdir()
    (job_id,) = stack.submit("test.control_steps", {"steps": 5, "gate_dir": str(gate)})
    (gate / "step-1").touch()
    wait_until(lambda: _job(api, job_id)["progress"] == pytest.approx(0.2), 30, what="first step")
    response = api.delete(f"/v1/jobs/{job_id}")
    assert response.status_code == 200
    assert response.json()["cancel_requested"] is True
    final = wait_until(lambda: _job(api, job_id)["state"] == "cancelled" and _job(api, job_id), 30,
                       what="cancellation")
    assert final["result"] == {}
    assert final["progress"] == pytest.approx(0.2)  # it stopped between steps, not after all five
    # A finished job cannot be cancelled again: 409 with a stable code.
    again = api.delete(f"/v1/jobs/{job_id}")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "job_not_cancellable"
    # The CLI follows a job to its end and exits non-zero for a cancelled one.
    follow = stack.kiln("jobs", "show", job_id, "--follow", "--url", stack.url, check=False,
                        env={"KILN_API_TOKEN": token})
    assert follow.returncode == 1
    assert "error: job_cancelled" in follow.stderr


def test_failed_job_reports_its_code_through_cli(stack):
    stack.start_web()
    token = stack.create_user()
    stack.start_worker("control-worker", "control")
    (job_id,) = stack.submit("test.fail", {"message": "boom"})
    result = stack.kiln("jobs", "show", job_id, "--follow", "--url", stack.url, check=False,
                        env={"KILN_API_TOKEN": token}, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: test_failure: boom"
    listing = stack.kiln("jobs", "list", "--json", "--url", stack.url, env={"KILN_API_TOKEN": token})
    assert '"state": "failed"' in listing.stdout


def test_killed_worker_fails_running_job_as_interrupted_and_queued_job_still_completes(stack, tmp_path):
    stack.start_web()
    token = stack.create_user()
    api = stack.client(token)
    stack.start_worker("gpu-worker", "gpu,infer")
    gate = tmp_path / "gate"
    gate.mkdir()
    running, waiting = stack.submit("test.steps", {"steps": 3, "gate_dir": str(gate)}, {"steps": 2, "delay": 0.05})
    (gate / "step-1").touch()
    wait_until(lambda: _job(api, running)["progress"] > 0.3, 30, what="first job to make progress")
    assert _job(api, waiting)["state"] == "queued"
    assert _job(api, waiting)["queue_position"] == 1

    stack.kill("gpu-worker")  # SIGKILL: no chance to clean up
    assert _job(api, running)["state"] == "running"  # the row still says running until recovery

    stack.start_worker("gpu-worker-2", "gpu,infer")
    interrupted = wait_until(lambda: _job(api, running)["state"] == "failed" and _job(api, running), 30,
                             what="interrupted job to fail")
    assert interrupted["error"]["code"] == "job_interrupted"
    completed = wait_until(lambda: _job(api, waiting)["state"] == "completed" and _job(api, waiting), 60,
                           what="queued job to complete after restart")
    assert completed["result"] == {"steps_done": 2}
    # Nothing ran twice: the interrupted job has exactly one "running" event.
    assert [e["type"] for e in interrupted["events"]].count("running") == 1


def test_queue_cap_answers_503_with_retry_after(stack_factory):
    stack = stack_factory(KILN_MAX_QUEUED_JOBS=2)
    first, second = stack.submit("test.control_steps", {"steps": 1}, {"steps": 1})
    result = stack.run([__import__("sys").executable, "-m", "tests.support.submit", "test.control_steps", "{}"],
                       check=False)
    assert result.returncode == 3
    assert result.stdout.split() == ["ERROR", "job_queue_full", "503", "30"]
