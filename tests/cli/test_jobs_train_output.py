"""`kiln jobs` and `kiln train` say what really happened: a cancel that lost the race to completion is not
reported as a cancel, `--limit 0` is refused, `train grpo --follow` prints the job id before following,
and `train status` shows "-" for none and `code: message` for an error, never None or a Python dict."""

from __future__ import annotations

import json

import httpx
import pytest

from kiln_project.cli import jobs_cmd, train_cmd
from tests.cli.recording_server import run_cli, serve_commands

JOB = "3f1f8c5e-0000-4000-8000-000000000002"


def _job(state: str, **extra) -> dict:
    return {"id": JOB, "kind": "grpo", "queue": "gpu", "state": state, "title": "t", "progress": 1.0,
            "progress_message": "", "queue_position": None, "created_at": "2025-01-01T00:00:00Z", **extra}


@pytest.fixture
def server(monkeypatch):
    return serve_commands(monkeypatch, (jobs_cmd, train_cmd), lambda request: httpx.Response(200, json=[]))


_run = run_cli


def test_cancel_follow_of_a_job_that_completed_first_says_so_and_fails(server, capsys):
    server.answer = lambda request: httpx.Response(200, json=_job(
        "running" if request.method == "DELETE" else "completed", progress=0.5 if request.method == "DELETE" else 1.0))
    code, out, err = _run(capsys, "jobs", "cancel", JOB, "--follow")
    assert out == f"{JOB} completed before the cancel took effect\n"
    assert code == 1
    assert err.strip().splitlines()[-1] == (f"error: job_not_cancelled: job {JOB} completed before the cancel took "
                                            f"effect (hint: see it with: kiln jobs show {JOB})")
    assert server.requests == [("DELETE", f"/v1/jobs/{JOB}"), ("GET", f"/v1/jobs/{JOB}")]


def test_cancel_follow_of_a_job_that_was_cancelled_reports_the_cancel(server, capsys):
    server.answer = lambda request: httpx.Response(200, json=_job(
        "running" if request.method == "DELETE" else "cancelled"))
    code, out, _ = _run(capsys, "jobs", "cancel", JOB, "--follow")
    assert (code, out) == (0, f"cancelled {JOB}\n")


def test_cancel_without_follow_of_a_running_job_says_requested(server, capsys):
    server.answer = lambda request: httpx.Response(200, json=_job("running", progress=0.3))
    code, out, _ = _run(capsys, "jobs", "cancel", JOB)
    assert (code, out) == (0, f"cancellation requested for {JOB} (running)\n")


@pytest.mark.parametrize("limit", ["0", "-5", "1001"])
def test_jobs_list_refuses_a_limit_outside_1_to_1000(server, capsys, limit):
    code, out, err = _run(capsys, "jobs", "list", "--limit", limit)
    assert (code, out, server.requests) == (1, "", [])
    assert err == f"error: invalid_limit: --limit must be between 1 and 1000, not {limit}\n"


def test_jobs_list_sends_the_limit_it_was_given(server, capsys):
    code, out, _ = _run(capsys, "jobs", "list", "--limit", "1")
    assert (code, out) == (0, "(none)\n")
    assert server.requests == [("GET", "/v1/jobs?limit=1")]


def test_train_grpo_follow_prints_the_job_id_before_following(server, capsys, tmp_path):
    group = {"messages": [{"role": "user", "content": "hi"}],
             "completions": [{"text": "a", "reward": 1}, {"text": "b", "reward": 0}]}
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(group) + "\n")

    def answer(request):
        if request.method == "POST":
            return httpx.Response(200, json={"job_id": JOB, "effective_seed": 7})
        raise KeyboardInterrupt  # Ctrl-C while following

    server.answer = answer
    code, out, _ = _run(capsys, "train", "grpo", "--file", str(path), "--follow")
    assert code == 130
    assert out == f"queued {JOB} (effective seed 7)\n"
    assert server.requests == [("POST", "/v1/train/grpo"), ("GET", f"/v1/train/status/{JOB}")]


def test_train_status_shows_dashes_for_none_and_code_message_for_an_error(server, capsys):
    detail = {"job_id": JOB, "state": "cancelled", "progress": 0.25, "current_loss": None, "adapter_name": "a-r1",
              "adapter_path": None, "elapsed_secs": 3.5, "gate_outcome": None, "post_eval_verdict": None,
              "error": {"code": "job_cancelled", "message": "cancelled by alice while running"}}
    server.answer = lambda request: httpx.Response(200, json=detail)
    code, out, _ = _run(capsys, "train", "status", "--job-id", JOB)
    assert code == 0
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert lines == {"job_id": JOB, "state": "cancelled", "progress": "0.25", "current_loss": "-",
                     "adapter_name": "a-r1", "adapter_path": "-", "elapsed_secs": "3.5",
                     "error": "job_cancelled: cancelled by alice while running", "gate_outcome": "-",
                     "post_eval_verdict": "-"}
    assert server.requests == [("GET", f"/v1/train/jobs/{JOB}")]


def test_train_status_table_shows_dashes_for_none(server, capsys):
    server.answer = lambda request: httpx.Response(200, json=[
        {"job_id": JOB, "state": "queued", "progress": 0.0, "current_loss": None, "adapter_name": "a",
         "gate_outcome": None}])
    code, out, _ = _run(capsys, "train", "status")
    assert code == 0 and "None" not in out
    assert out.splitlines()[1].split() == [JOB, "queued", "0%", "-", "a", "-"]


def test_train_status_follow_waits_for_the_post_eval_gate(server, capsys, monkeypatch):
    """The guide waits for the adapter and its evaluation outcome: --follow goes on after the training
    completes until the gate has decided."""
    import time

    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # follow's polling pause
    statuses = iter([
        {"job_id": JOB, "state": "completed", "progress": 1.0, "adapter_name": "a-r1", "gate_outcome": None,
         "post_eval_verdict": None},
        {"job_id": JOB, "state": "completed", "progress": 1.0, "adapter_name": "a-r1", "gate_outcome": None,
         "post_eval_verdict": "post-eval pending: the adapter stays inactive until the gate decides"},
        {"job_id": JOB, "state": "completed", "progress": 1.0, "adapter_name": "a-r1", "gate_outcome": "promoted",
         "post_eval_verdict": "passed"},
    ])

    def answer(request):
        if request.url.path.startswith("/v1/train/jobs/"):
            return httpx.Response(200, json={"job_id": JOB, "post_eval": {"suite": "held-out", "min_accuracy": 0.5}})
        return httpx.Response(200, json=next(statuses))

    server.answer = answer
    code, out, _ = _run(capsys, "train", "status", "--job-id", JOB, "--follow")
    assert code == 0
    assert out.splitlines()[0] == f"{JOB}  completed  adapter a-r1  gate promoted"
    assert [path for _, path in server.requests].count(f"/v1/train/status/{JOB}") == 3


def test_follow_waits_for_a_server_that_went_away_for_a_moment(server, capsys, monkeypatch):
    """QA: `--follow` exited 1 connection_failed while kiln serve brought its web process back in 2 s
    and the job completed; now it asks again (one line says so) and reports the job's real end."""
    import kiln_project.cli.output as output

    monkeypatch.setattr("time.sleep", lambda seconds: None)
    answers = iter(["running", "down", "down", "shutting", "completed"])

    def answer(request):
        state = next(answers)
        if state == "down":
            raise httpx.ConnectError("connection refused")
        if state == "shutting":
            return httpx.Response(503, json={"error": {"code": "server_shutting_down", "message": "restart",
                                                       "hint": "retry"}}, headers={"Retry-After": "1"})
        return httpx.Response(200, json=_job(state))

    server.answer = answer
    code, out, err = _run(capsys, "jobs", "show", JOB, "--follow")
    assert code == 0 and f"{JOB}  grpo  completed  100%" in out
    assert err.count("the server did not answer (connection_failed); asking again") == 1
    # no server at all: the first request fails at once, without the "asking again" line (review)
    server.answer = lambda request: (_ for _ in ()).throw(httpx.ConnectError("connection refused"))
    code, _, err = _run(capsys, "jobs", "show", JOB, "--follow")
    assert code == 1 and "error: connection_failed" in err and "asking again" not in err
    # past the grace period the follower gives up with the transport's one line
    calls = []

    def running_then_gone(request):
        calls.append(request)
        if len(calls) > 1:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json=_job("running"))

    server.answer = running_then_gone
    monkeypatch.setattr(output, "RECONNECT_SECONDS", 0.0)
    code, _, err = _run(capsys, "jobs", "show", JOB, "--follow")
    assert code == 1 and "error: connection_failed" in err and "asking again" in err
