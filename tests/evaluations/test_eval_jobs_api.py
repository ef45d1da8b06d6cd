"""/v1/eval/run, /compare and /jobs: submission checks and stable error codes, listing, cancel or
delete, and the handler run in process (`run_queued_jobs("control")`) with a fake model service in
place of the GPU worker (`chat_completion_sync` replaced, a live worker heartbeat faked), so
results, rerun selection and replay verdicts are checked without a model. The real model service
is exercised by tests/integration/test_eval_jobs_stack.py."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from django.utils import timezone

from adapters.models import Adapter, AdapterState
from core.jobs.models import Job, WorkerHeartbeat
from core.jobs.runner import run_queued_jobs
from evaluations.eval_payloads import example_seed
from tests.evaluations import dataset_support
from tests.evaluations.dataset_support import error, ok, send

pytestmark = pytest.mark.django_db
api, home = dataset_support.api, dataset_support.home  # the shared fixtures

IDENTITY = {"base_model_sha256": "sha256:" + "b" * 64, "inference_config_sha256": "sha256:" + "c" * 64,
            "served_model_id": "tiny",
            "tokenizer": {"vocab_sha256": "sha256:" + "d" * 64, "config_sha256": "sha256:" + "e" * 64,
                          "chat_template_sha256": "sha256:" + "f" * 64}}
ADAPTER_SHA = "sha256:" + "1" * 64
EXAMPLES = [{"id": f"q{i}", "messages": [{"role": "user", "content": f"What is {i} + {i}?"}], "target": str(2 * i)}
            for i in range(1, 6)]


@pytest.fixture
def gpu_worker(db):
    """A live GPU worker's heartbeat with the model loaded (what submission reads the identity from)."""
    now = timezone.now()
    return WorkerHeartbeat.objects.create(worker_id="fake-gpu", hostname=socket.gethostname(), pid=os.getpid(),
                                          queues=["gpu", "infer"], started_at=now, last_seen=now,
                                          status={"model": {"loaded": True, "identity": IDENTITY}})


class FakeModel:
    """Answers i+i right for odd i and wrong for even i; `drift` changes one example's answer."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.drift: str | None = None

    def __call__(self, body, timeout=900.0):
        self.bodies.append(body)
        text = body["messages"][-1]["content"]
        if "refuse" in text:
            from core.errors import KilnError

            raise KilnError("context_length_exceeded", "the prompt is too long", status=400)
        if body.get("adapter") and not Adapter.objects.filter(name=body["adapter"], state=AdapterState.PUBLISHED).exists():
            from core.errors import KilnError  # as the chat route answers (adapters.serving.selectors)

            raise KilnError("adapter_not_found", f"no published adapter is named {body['adapter']!r}", status=404)
        number = int(text.split()[2])
        answer = str(2 * number) if number % 2 else str(2 * number + 1)
        if self.drift and self.drift in text:
            answer += "0"
        tokens = [ord(c) for c in answer]
        policy = {"base_model_sha256": IDENTITY["base_model_sha256"],
                  "inference_config_sha256": IDENTITY["inference_config_sha256"]}
        if body.get("adapter"):
            policy["adapter"] = {"name": body["adapter"], "content_sha256": ADAPTER_SHA}
        provenance = {"seed": body["seed"], "input_token_ids": [1, 2, 3, *tokens], "prompt_token_count": 3,
                      "behavior_policy": policy}
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop",
                             "rollout_provenance": provenance}],
                "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}}


@pytest.fixture
def model(monkeypatch, gpu_worker):
    from adapters.serving import sync_client

    fake = FakeModel()
    monkeypatch.setattr(sync_client, "chat_completion_sync", fake)
    return fake


@pytest.fixture
def suite(api, home):
    return ok(send(api, "post", "/v1/eval/suites", {"name": "sums", "scorer": {"type": "exact"},
                                                     "examples": EXAMPLES}))


def _adapter(home: Path, name: str = "a1"):
    path = home / "adapters" / name
    path.mkdir(parents=True)
    Adapter.objects.create(name=name, state=AdapterState.PUBLISHED, path=str(path), content_sha256=ADAPTER_SHA,
                           published_at=timezone.now())


def _page(api, job_id: str) -> str:
    """The job page (the section the kind declares included), as the token's user in a session."""
    from django.contrib.auth import get_user_model

    api.force_login(get_user_model().objects.get(username="trainer"))
    page = api.get(f"/ui/jobs/{job_id}/")
    assert page.status_code == 200, page.status_code
    return page.content.decode()


def _run(api, body):
    return send(api, "post", "/v1/eval/run", body)


def test_run_is_queued_with_its_hashes_and_a_pinned_suite(api, suite, gpu_worker, home):
    queued = ok(_run(api, {"suite_name": "sums", "generation": {"seed": 11}}))
    assert queued["state"] == "queued" and queued["mode"] == "run" and queued["suite_name"] == "sums"
    assert queued["suite_hash"] == suite["suite_hash"] and queued["targets"] == [None] and queued["seed"] == "11"
    assert queued["effective_generation_hash"].startswith("sha256:")
    job = Job.objects.get(uuid=queued["job_id"])
    assert job.kind == "eval.run" and job.queue == "control"
    pinned = Path(job.payload["suite"]["path"])
    assert pinned.is_relative_to(home / "evals" / "inputs") and pinned.stat().st_mode & 0o777 == 0o444
    assert json.loads(pinned.read_text())["suite_hash"] == suite["suite_hash"]
    assert job.payload["model"]["base_model_sha256"] == IDENTITY["base_model_sha256"]
    again = ok(_run(api, {"suite_name": "sums", "generation": {"seed": "11", "temperature": 0}}))
    assert again["effective_generation_hash"] == queued["effective_generation_hash"]
    derived = ok(_run(api, {"suite_name": "sums"}))
    assert derived["seed"] != "11" and derived["effective_generation_hash"] != queued["effective_generation_hash"]
    assert ok(_run(api, {"suite_name": "sums"}))["seed"] == derived["seed"]  # derived from the suite hash
    inline = ok(_run(api, {"suite": {"name": "inline-sums", "scorer": {"type": "exact"}, "examples": EXAMPLES}}))
    assert inline["suite_hash"] == suite["suite_hash"] and inline["suite_name"] == "inline-sums"


def test_submission_refusals_have_stable_codes(api, suite, gpu_worker, home, settings):
    assert "suite.examples[0].messages" in error(_run(api, {"suite": {"name": "x", "scorer": {"type": "exact"},
                                                                      "examples": [{"id": "a"}]}}),
                                                 400, "eval_invalid_request")
    assert "suite_name" in error(_run(api, {"suite_name": "nope"}), 404, "eval_suite_not_found")
    assert "not int" in error(_run(api, {"suite_name": 12345}), 400, "eval_invalid_request")
    assert error(_run(api, {}), 400, "eval_invalid_request").startswith("suite_name:")
    assert error(_run(api, {"suite_name": "sums", "generation": {"top_p": 0}}), 400,
                 "eval_invalid_request").startswith("generation.top_p:")
    assert error(_run(api, {"suite_name": "sums", "adapter": "ghost"}), 400,
                 "eval_invalid_request").startswith("adapter:")
    assert error(_run(api, {"suite_name": "sums", "adapters": [None]}), 400,
                 "eval_invalid_request").startswith("adapters:")
    assert error(send(api, "post", "/v1/eval/compare", {"suite_name": "sums", "adapters": [None] * 9}), 400,
                 "eval_invalid_request").startswith("adapters:")
    assert error(send(api, "post", "/v1/eval/compare", {"suite_name": "sums", "adapters": [None, 3]}), 400,
                 "eval_invalid_request").startswith("adapters[1]:")
    settings.KILN = replace(settings.KILN, max_queued_jobs=1)
    ok(_run(api, {"suite_name": "sums"}))
    full = _run(api, {"suite_name": "sums"})
    error(full, 503, "eval_queue_full")
    assert full["Retry-After"] == "15"
    assert Job.objects.filter(kind="eval.run").count() == 1
    assert len(list((home / "evals" / "inputs").iterdir())) == 1  # a refusal leaves nothing behind
    gpu_worker.delete()
    settings.KILN = replace(settings.KILN, max_queued_jobs=32)
    error(_run(api, {"suite_name": "sums"}), 503, "inference_unavailable")


def test_a_quarantined_adapter_is_refused_not_scored_zero(api, suite, gpu_worker, home):
    """QA: every example was refused at inference and the job "completed" with accuracy 0.0, exit 0."""
    _adapter(home, "q1")
    Adapter.objects.filter(name="q1").update(quarantined=True)
    jobs_before = Job.objects.count()
    message = error(_run(api, {"suite_name": "sums", "adapter": "q1"}), 409, "adapter_quarantined")
    assert message.startswith("adapter: adapter 'q1' is quarantined") and "cannot be evaluated" in message
    compared = error(send(api, "post", "/v1/eval/compare", {"suite_name": "sums", "adapters": [None, "q1"]}), 409,
                     "adapter_quarantined")
    assert compared.startswith("adapters[1]:")
    assert Job.objects.count() == jobs_before  # nothing queued
    Adapter.objects.filter(name="q1").update(loaded=True)  # an operator served it anyway: it may be evaluated
    assert _run(api, {"suite_name": "sums", "adapter": "q1"}).status_code == 200


def test_tracked_cap_is_503_eval_tracked_full(api, suite, gpu_worker):
    from datetime import timedelta

    from core.jobs.kinds import MAX_TRACKED_JOBS

    recent, old = timezone.now() - timedelta(minutes=30), timezone.now() - timedelta(hours=2)
    Job.objects.bulk_create([Job(kind="eval.run", queue="control", state="failed", finished_at=recent)
                             for _ in range(MAX_TRACKED_JOBS)] +
                            [Job(kind="eval.run", queue="control", state="completed", finished_at=old)])
    full = _run(api, {"suite_name": "sums"})
    error(full, 503, "eval_tracked_full")
    assert full["Retry-After"] == "15"
    Job.objects.filter(kind="eval.run", finished_at=recent).update(finished_at=old)  # an hour later
    ok(_run(api, {"suite_name": "sums"}))


def test_a_full_disk_at_submission_is_507_and_leaves_no_folder(api, suite, gpu_worker, settings, monkeypatch):
    """QA: ENOSPC while pinning the suite was a 500 internal_error and left an empty inputs folder."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("evaluations.eval_services.write_file", full)
    message = error(_run(api, {"suite_name": "sums"}), 507, "adapter_disk_quota_exceeded")
    assert "disk is full" in message
    inputs = settings.KILN.layout.evals / "inputs"
    assert not Job.objects.filter(kind="eval.run").exists()
    assert inputs.is_dir() and list(inputs.iterdir()) == []  # its folder was made, then removed


def test_list_get_cancel_and_delete(api, suite, gpu_worker):
    first = ok(_run(api, {"suite_name": "sums"}))["job_id"]
    second = ok(_run(api, {"suite_name": "sums"}))["job_id"]
    listed = ok(api.get("/v1/eval/jobs"))
    assert [j["job_id"] for j in listed] == [second, first]
    detail = ok(api.get(f"/v1/eval/jobs/{first}"))
    assert detail["state"] == "queued" and detail["examples"] == [] and detail["targets"][0]["label"] == "base"
    assert detail["generation"]["max_tokens"] == 256 and detail["total"] == 5
    error(api.get("/v1/eval/jobs/not-a-uuid"), 404, "eval_job_not_found")
    error(api.get("/v1/eval/jobs/00000000-0000-0000-0000-000000000000"), 404, "eval_job_not_found")
    assert ok(api.delete(f"/v1/eval/jobs/{first}")) == {"job_id": first, "status": "cancelled"}
    assert ok(api.get(f"/v1/eval/jobs/{first}"))["state"] == "cancelled"
    assert ok(api.delete(f"/v1/eval/jobs/{first}")) == {"job_id": first, "status": "deleted"}
    error(api.get(f"/v1/eval/jobs/{first}"), 404, "eval_job_not_found")
    assert [j["job_id"] for j in ok(api.get("/v1/eval/jobs"))] == [second]


def test_run_rerun_and_replay_in_process(api, suite, model, home):
    queued = ok(_run(api, {"suite_name": "sums", "generation": {"seed": 5, "max_tokens": 16}}))
    run_queued_jobs("control")
    result = ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))
    assert result["state"] == "completed", result["error"]
    assert result["counts"] == {"pass": 3, "fail": 2, "invalid": 0, "error": 0} and result["accuracy"] == 0.6
    assert [e["example_id"] for e in result["examples"]] == [e["id"] for e in EXAMPLES]
    first = result["examples"][0]
    assert first["completion"] == "2" and first["completion_token_ids"] == [ord("2")] and first["outcome"] == "pass"
    assert first["finish_reason"] == "stop" and first["seed"] == str(example_seed(5, "q1"))
    assert [b["seed"] for b in model.bodies] == [example_seed(5, e["id"]) for e in EXAMPLES]
    assert all(b["max_tokens"] == 16 and b["rollout_provenance"] for b in model.bodies)
    results = home / "evals" / queued["job_id"] / "results.json"
    assert result["results_path"] == str(results) and json.loads(results.read_text())["summary"]["total"] == 5
    brief = ok(api.get(f"/v1/eval/jobs/{queued['job_id']}?examples=false"))
    assert brief["examples"] == [] and brief["table"] == [] and brief["counts"] == result["counts"]
    listed = ok(api.get("/v1/eval/jobs"))[0]
    assert listed["counts"]["pass"] == 3 and listed["accuracy"] == 0.6

    rerun = ok(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/rerun", {}))
    assert rerun["mode"] == "rerun" and rerun["origin_job_id"] == queued["job_id"] and rerun["seed"] == "5"
    assert rerun["suite_hash"] != suite["suite_hash"]  # the selected examples only
    model.bodies.clear()
    run_queued_jobs("control")
    rerun_result = ok(api.get(f"/v1/eval/jobs/{rerun['job_id']}"))
    assert [e["example_id"] for e in rerun_result["examples"]] == ["q2", "q4"]
    assert rerun_result["counts"]["fail"] == 2 and rerun_result["source_suite_hash"] == suite["suite_hash"]
    assert [b["seed"] for b in model.bodies] == [example_seed(5, "q2"), example_seed(5, "q4")]  # same seeds
    error(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/rerun", {"outcome_kinds": ["invalid"]}), 400,
          "eval_invalid_request")
    error(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/rerun", {"outcome_kinds": ["nope"]}), 400,
          "eval_invalid_request")
    passing = ok(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/rerun",
                      {"outcome_kinds": ["fail"], "include_pass": True, "seed": "9"}))
    assert passing["seed"] == "9" and Job.objects.get(uuid=passing["job_id"]).payload["suite"]["examples"] == 5

    error(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/replay", {"seed": 1}), 400, "eval_invalid_request")
    replay = ok(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/replay", {}))
    assert replay["effective_generation_hash"] == queued["effective_generation_hash"]
    assert ok(api.get(f"/v1/eval/jobs/{replay['job_id']}"))["replay"]["status"] == "pending"
    run_queued_jobs("control")
    assert ok(api.get(f"/v1/eval/jobs/{replay['job_id']}"))["replay"] == {"of": queued["job_id"],
                                                                          "status": "matched", "compared": 5}
    model.drift = "3 + 3"
    drifted = ok(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/replay", {}))
    run_queued_jobs("control")
    verdict = ok(api.get(f"/v1/eval/jobs/{drifted['job_id']}"))["replay"]
    assert verdict["status"] == "mismatch" and verdict["first_mismatch"]["example_id"] == "q3"
    assert verdict["first_mismatch"]["token_index"] == 1 and verdict["first_mismatch"]["char_index"] == 1
    error(send(api, "post", f"/v1/eval/jobs/{rerun['job_id']}x/replay", {}), 404, "eval_job_not_found")
    queued_only = ok(_run(api, {"suite_name": "sums"}))
    error(send(api, "post", f"/v1/eval/jobs/{queued_only['job_id']}/replay", {}), 400, "eval_invalid_request")
    assert 'id="eval-section"' in _page(api, queued_only["job_id"])
    replay_page = _page(api, drifted["job_id"])
    assert 'id="eval-replay-status"' in replay_page and "mismatch" in replay_page
    assert "accuracy" in _page(api, rerun["job_id"]).lower()
    assert result["evidence_error"] is None

    # One changed byte in the published results, then in the pinned suite: the job says so, its
    # examples are not shown as if scored, and replay/rerun refuse by name (not "invalid request").
    original = results.read_bytes()
    results.write_bytes(original.replace(b'"2"', b'"7"', 1))
    tampered = ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))
    assert tampered["examples"] == [] and tampered["evidence_error"]["code"] == "eval_evidence_integrity_failed"
    assert "results.json no longer hashes to" in tampered["evidence_error"]["message"]
    for route in ("replay", "rerun"):
        refused = send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/{route}", {})
        assert "results.json" in error(refused, 409, "eval_evidence_integrity_failed")
        assert "restore the file" in refused.json()["error"]["hint"]
    page = _page(api, queued["job_id"])
    assert 'id="eval-evidence-error"' in page and "eval_evidence_integrity_failed" in page
    results.write_bytes(original)
    pinned = Path(Job.objects.get(uuid=queued["job_id"]).payload["suite"]["path"])
    suite_bytes = pinned.read_bytes()
    pinned.write_bytes(suite_bytes.replace(b"1 + 1", b"1 + 2", 1))
    assert "the pinned suite" in error(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/replay", {}), 409,
                                       "eval_evidence_integrity_failed")
    pinned.unlink()
    assert "cannot be read" in ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))["evidence_error"]["message"]
    pinned.write_bytes(suite_bytes)
    assert ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))["evidence_error"] is None


def test_compare_pairs_targets_by_example_and_refusals_become_errors(api, home, model):
    _adapter(home)
    examples = [*EXAMPLES[:2], {"id": "long", "messages": [{"role": "user", "content": "please refuse 1"}],
                                "target": "x"}]
    ok(send(api, "post", "/v1/eval/suites", {"name": "pair", "scorer": {"type": "exact"}, "examples": examples}))
    queued = ok(send(api, "post", "/v1/eval/compare", {"suite_name": "pair", "adapters": [None, "a1", "base"]}))
    assert queued["mode"] == "compare" and queued["targets"] == [None, "a1", None]
    run_queued_jobs("control")
    result = ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))
    assert result["state"] == "completed", result["error"]
    assert [t["label"] for t in result["targets"]] == ["base", "a1", "base"]
    assert result["targets"][1]["content_sha256"] == ADAPTER_SHA
    assert result["table"] == [{"example_id": "q1", "outcomes": ["pass"] * 3, "agree": True},
                               {"example_id": "q2", "outcomes": ["fail"] * 3, "agree": True},
                               {"example_id": "long", "outcomes": ["error"] * 3, "agree": True}]
    refused = result["examples"][2]
    assert refused["outcome"] == "error" and "context_length_exceeded" in refused["detail"]
    assert all(t["counts"] == {"pass": 1, "fail": 1, "invalid": 0, "error": 1} for t in result["targets"])
    seeds = [b["seed"] for b in model.bodies if "refuse" not in b["messages"][-1]["content"]]
    assert seeds[:2] == seeds[2:4] == seeds[4:]  # every target gets the same per-example seed
    # Three targets: no pooled accuracy or counts at the top level, each target's instead (in order).
    assert result["accuracy"] is None and result["counts"] is None
    assert result["target_accuracies"] == [1 / 3] * 3
    assert result["target_counts"] == [{"pass": 1, "fail": 1, "invalid": 0, "error": 1}] * 3
    [listed] = [j for j in ok(api.get("/v1/eval/jobs")) if j["job_id"] == queued["job_id"]]
    assert listed["accuracy"] is None and listed["counts"] is None
    assert listed["target_accuracies"] == [1 / 3] * 3 and listed["target_counts"] == result["target_counts"]
    html = _page(api, queued["job_id"])
    assert 'id="eval-section"' in html and "context_length_exceeded" in html
    assert 'id="eval-count-pass"' not in html and 'id="eval-accuracy"' not in html  # no pooled figure
    assert '<td class="num mono" id="eval-target-1-pass">1</td>' in html
    assert '<td class="num mono" id="eval-target-2-error">1</td>' in html
    assert '<td class="num mono" id="eval-target-0-accuracy">0.3333</td>' in html


def test_a_changed_adapter_fails_the_job(api, home, model):
    _adapter(home)
    ok(send(api, "post", "/v1/eval/suites", {"name": "sums", "scorer": {"type": "exact"}, "examples": EXAMPLES}))
    queued = ok(_run(api, {"suite_name": "sums", "adapter": "a1"}))
    Adapter.objects.filter(name="a1").update(content_sha256="sha256:" + "2" * 64)
    job = Job.objects.get(uuid=queued["job_id"])
    job.payload["targets"][0]["content_sha256"] = "sha256:" + "2" * 64
    job.save(update_fields=["payload"])
    run_queued_jobs("control")
    result = ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))
    assert result["state"] == "failed" and result["error"]["code"] == "eval_adapter_changed"
    assert not (home / "evals" / queued["job_id"]).exists()  # a failed job publishes nothing


def test_rerun_and_replay_refuse_a_target_deleted_since_like_a_new_run(api, home, model):
    """Both used to queue and end `mismatch` (replay) or all `error` (rerun); they now refuse up front
    with the code and message `eval run` gives for the same adapter."""
    _adapter(home)
    ok(send(api, "post", "/v1/eval/suites", {"name": "sums", "scorer": {"type": "exact"}, "examples": EXAMPLES}))
    queued = ok(_run(api, {"suite_name": "sums", "adapter": "a1"}))
    run_queued_jobs("control")
    assert ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))["state"] == "completed"
    Adapter.objects.filter(name="a1").delete()
    jobs_before = Job.objects.count()
    expected = error(_run(api, {"suite_name": "sums", "adapter": "a1"}), 400, "eval_invalid_request")
    assert expected == "adapter: no published adapter named 'a1'"
    for route in ("rerun", "replay"):
        message = error(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/{route}", {}), 400, "eval_invalid_request")
        assert message == expected, route
    assert Job.objects.count() == jobs_before  # nothing queued


def test_replay_refuses_a_target_republished_with_other_bytes(api, home, model):
    _adapter(home)
    ok(send(api, "post", "/v1/eval/suites", {"name": "sums", "scorer": {"type": "exact"}, "examples": EXAMPLES}))
    queued = ok(_run(api, {"suite_name": "sums", "adapter": "a1"}))
    run_queued_jobs("control")
    Adapter.objects.filter(name="a1").update(content_sha256="sha256:" + "2" * 64)
    for route in ("rerun", "replay"):
        message = error(send(api, "post", f"/v1/eval/jobs/{queued['job_id']}/{route}", {}), 400, "eval_invalid_request")
        assert message.startswith("adapter: adapter 'a1' holds other bytes than when job"), route


def test_an_adapter_deleted_while_its_job_waits_fails_the_job(api, home, model):
    """Its examples were each recorded `error` (adapter_not_found) and the job ended `completed` with
    an accuracy of 0 for an adapter that was never asked."""
    _adapter(home)
    ok(send(api, "post", "/v1/eval/suites", {"name": "sums", "scorer": {"type": "exact"}, "examples": EXAMPLES}))
    queued = ok(_run(api, {"suite_name": "sums", "adapter": "a1"}))
    Adapter.objects.filter(name="a1").delete()
    run_queued_jobs("control")
    result = ok(api.get(f"/v1/eval/jobs/{queued['job_id']}"))
    assert result["state"] == "failed" and result["error"]["code"] == "eval_adapter_changed"
    assert "'a1' was deleted while the job ran" in result["error"]["message"]
    assert not (home / "evals" / queued["job_id"]).exists()
