"""`kiln openenv train` when the run fails after it published its collection and adapter (QA: the
environment died during the held-out evaluation; the CLI printed only the failure, though the episodes
were published and the trained adapter was being served)."""

from __future__ import annotations

import hashlib
import json

import httpx

from kiln_project.cli import openenv_runs_cmd
from tests.cli.recording_server import run_cli, serve_commands

RUN = "030db9a7-0000-4000-8000-000000000001"
BODIES = {"dataset": b'{"group": 1}\n', "replay": b'{"replay": true}', "summary": b'{"summary": true}'}


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _status(published: list[str]) -> dict:
    return {"run_id": RUN, "kind": "train", "state": "failed", "stage": "environment_evaluation",
            "admission": {"sequence": 1}, "progress": {"groups_completed": 4, "groups_total": 4},
            "failure": {"code": "environment_unavailable", "stage": "environment_evaluation",
                        "message": "baseline: environment http://127.0.0.1:8511: GET /health failed",
                        "hint": "start the environment again"},
            "warnings": ["26 of 32 episodes ended at an action Kiln refused"],
            "training": {"state": "completed", "adapter_name": "wordle-kill", "job_id": "job-1"},
            "artifacts": [{"kind": kind, "sha256": _digest(BODIES.get(kind, b"x"))} for kind in published]}


def _server(published: list[str]):
    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/openenv/runs" and request.method == "POST":
            return httpx.Response(202, json=_status(published))
        if path.startswith(f"/v1/openenv/runs/{RUN}/artifacts/"):
            body = BODIES[path.rsplit("/", 1)[1]]
            return httpx.Response(200, content=body, headers={"etag": f'"{_digest(body)}"'})
        if path == f"/v1/openenv/runs/{RUN}":
            return httpx.Response(200, json=_status(published))
        return httpx.Response(404, json={"error": {"code": "not_found", "message": path, "hint": ""}})
    return answer


def _train(capsys, tmp_path):
    return run_cli(capsys, "openenv", "train", "--environment", "http://127.0.0.1:8511", "--output-adapter",
                   "wordle-kill", "--output", str(tmp_path / "e.jsonl"), "--replay-output",
                   str(tmp_path / "e.replay.json"), "--summary-output", str(tmp_path / "e.summary.json"))


def test_a_run_failing_after_publication_still_hands_over_its_episodes_warnings_and_adapter(
        monkeypatch, capsys, tmp_path):
    serve_commands(monkeypatch, [openenv_runs_cmd],
                   _server(["dataset", "replay", "summary", "train_receipt", "adapter_manifest"]))
    code, out, err = _train(capsys, tmp_path)
    assert code == 1 and err.startswith("error: environment_unavailable: run ") and "environment_evaluation" in err
    assert (tmp_path / "e.jsonl").read_bytes() == BODIES["dataset"]
    assert json.loads((tmp_path / "e.summary.json").read_text()) == {"summary": True}
    assert f"episodes  {tmp_path / 'e.jsonl'} ({_digest(BODIES['dataset'])})" in out
    assert "warning   26 of 32 episodes ended at an action Kiln refused" in out
    assert "adapter   wordle-kill (training job job-1;" in out
    assert "it was published before the run failed; kiln adapters list shows whether it serves" in out


def test_a_run_failing_before_publication_copies_nothing_and_names_no_adapter(monkeypatch, capsys, tmp_path):
    serve_commands(monkeypatch, [openenv_runs_cmd], _server([]))
    code, out, err = _train(capsys, tmp_path)
    assert code == 1 and err.startswith("error: environment_unavailable: ")
    assert not list(tmp_path.iterdir()) and "adapter   " not in out and "episodes  " not in out
