"""`kiln openenv start --follow` on a train run that created no training job (every group skipped): it
ended on "completed (training_submission)" alone, with no reason, no warnings, and nothing said of the
requested environment evaluation and gate, which never ran (QA)."""

from __future__ import annotations

import json

import httpx

from kiln_project.cli import openenv_runs_cmd
from tests.cli.recording_server import run_cli, serve_commands

RUN = "030db9a7-0000-4000-8000-000000000002"
REASON = "no group had returns that differ: nothing to train on (most episodes ended at a refused action)"
WARNING = "30 of 32 episodes ended at an action Kiln refused (MODEL_ACTION_SCHEMA_MISMATCH)"


def _status(request: dict) -> dict:
    return {"run_id": RUN, "kind": "train", "state": "completed", "stage": "training_submission",
            "admission": {"sequence": 2}, "progress": {"groups_completed": 8, "groups_total": 8,
                                                       "rollouts_completed": 32, "rollouts_total": 32},
            "request": request, "warnings": [WARNING], "error": REASON, "artifacts": [], "post_evaluations": []}


def _answer(request_body: dict):
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/openenv/runs" and request.method == "POST":
            return httpx.Response(202, json=_status(request_body))
        if request.url.path == f"/v1/openenv/runs/{RUN}":
            return httpx.Response(200, json=_status(request_body))
        return httpx.Response(404, json={"error": {"code": "not_found", "message": request.url.path, "hint": ""}})
    return answer


def test_start_follow_says_why_nothing_was_trained_and_that_the_evaluation_did_not_run(monkeypatch, capsys, tmp_path):
    body = {"kind": "train", "environment_urls": ["http://127.0.0.1:8990"], "groups": 8,
            "environment_eval": {"groups": 20, "gate": {"min_mean_improvement": 0.1}}}
    request = tmp_path / "openenv-run.json"
    request.write_text(json.dumps(body))
    serve_commands(monkeypatch, [openenv_runs_cmd], _answer(body))
    code, out, err = run_cli(capsys, "openenv", "start", "--request", str(request), "--follow")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert f"warning   {WARNING}" in lines and f"reason    {REASON}" in lines
    assert lines[-1] == ("env eval  not run and its gate: no training job was created, so there is no candidate "
                         "adapter to evaluate")
    code, out, _ = run_cli(capsys, "openenv", "status", RUN)
    assert code == 0 and out.splitlines()[-1].startswith("env eval  not run and its gate:")
    # without an environment_eval in the request nothing is said of one
    del body["environment_eval"]
    serve_commands(monkeypatch, [openenv_runs_cmd], _answer(body))
    code, out, _ = run_cli(capsys, "openenv", "start", "--request", str(request), "--follow")
    assert code == 0 and "env eval" not in out and f"reason    {REASON}" in out


def test_train_says_each_closing_line_once(monkeypatch, capsys, tmp_path):
    """`train` follows the run as `start --follow` does, then prints its own closing lines: once each."""
    body = {"kind": "train", "environment_eval": {"groups": 20, "gate": {"min_mean_improvement": 0.1}}}
    serve_commands(monkeypatch, [openenv_runs_cmd], _answer(body))
    code, out, err = run_cli(capsys, "openenv", "train", "--environment", "http://127.0.0.1:8990", "--output-adapter",
                             "guess-v1", "--output", str(tmp_path / "e.jsonl"), "--replay-output",
                             str(tmp_path / "e.replay.json"), "--summary-output", str(tmp_path / "e.summary.json"))
    assert code == 0, err
    lines = out.splitlines()
    assert lines.count(f"warning   {WARNING}") == 1 and lines.count(f"reason    {REASON}") == 1
    assert sum(line.startswith("env eval  not run") for line in lines) == 1
