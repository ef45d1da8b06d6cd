"""Training → Rollouts through the test client: the scorer registry, the generation form, the job's
rollouts section, the downloads and the one-click recorded-policy training.

Submissions go through the real services (evaluations.rollout_services, training.rollout_services,
evaluations.services). The
generation job itself runs in-process through the real job runner and handler
(evaluations.rollout_jobs) with the real scorer sandbox; only the GPU worker is faked, at the
sync transport boundary (tests/rollouts/fakes.py builds answers like runtime_host does).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from core.canonical import sha256_digest
from core.contracts.groups import admit_jsonl
from core.errors import KilnError
from core.jobs import fragments, runner
from core.jobs.models import Job, JobState
from evaluations.models import Scorer
from tests.rollouts.fakes import FakeServer
from training.reward_contrast import groups_with_reward_contrast

pytestmark = pytest.mark.django_db

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo-math"
SCORER = (EXAMPLE / "score_math.py").read_bytes()
TASKS = "\n".join((EXAMPLE / "tasks.jsonl").read_text().splitlines()[:3]) + "\n"
TEMPLATE = (EXAMPLE / "request.json").read_text()
URL = "/ui/training/rollouts/"


@pytest.fixture(autouse=True)
def home(settings, tmp_path):
    """A private KILN_HOME: scorers, pinned inputs and published rollouts land under it."""
    settings.KILN = replace(settings.KILN, home=tmp_path)
    return tmp_path


def _upload(data, name: str) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data.encode() if isinstance(data, str) else data)


def _register(client, name="math-exact", content=SCORER, filename="score_math.py", description="exact sum"):
    return client.post(f"{URL}scorers/", {"scorer_name": name, "scorer_description": description,
                                          "scorer_file": _upload(content, filename)})


def _form(**fields) -> dict:
    form = {"scorer": "math-exact", "adapter": "base", "seeds": "4", "seed_start": "42", "concurrency": "3",
            "thinking_budget_tokens": "", "request_json": "", "tasks_file": _upload(TASKS, "tasks.jsonl"),
            "request_file": _upload(TEMPLATE, "request.json")}
    form.update(fields)
    return {k: v for k, v in form.items() if v is not None}


def _inputs(home: Path) -> list:
    root = home / "rollouts" / "inputs"
    return sorted(root.iterdir()) if root.exists() else []


# ---- the page and the scorer registry ---------------------------------------------------------

def test_page_shows_the_forms_and_the_nav_entry(operator_client):
    html = operator_client.get(URL).content.decode()
    assert 'href="/ui/training/rollouts/" aria-current="page">Rollouts</a>' in html
    assert 'id="rollouts-form"' in html and 'enctype="multipart/form-data"' in html
    for name in ("tasks_file", "request_file", "request_json", "scorer", "adapter", "seeds", "seed_start",
                 "thinking", "thinking_budget_tokens", "concurrency", "scorer_file", "scorer_name"):
        assert f'name="{name}"' in html, name
    assert "no scorer registered yet" in html and 'id="no-scorers"' in html
    assert "{{prompt}}" in html  # the placeholder help is shown literally
    assert "No rollouts generated yet." in html
    assert 'id="needs-permission"' not in html and "<fieldset disabled" not in html


def test_registering_a_scorer_stores_an_executable_file_and_lists_it(operator_client, operator, home):
    response = _register(operator_client)
    assert response.status_code == 302 and response["Location"] == f"{URL}?scorer=math-exact"
    scorer = Scorer.objects.get()
    path = home / "scorers" / "math-exact" / "score_math.py"
    assert (scorer.name, scorer.filename, scorer.path, scorer.created_by) == \
        ("math-exact", "score_math.py", str(path), operator)
    assert path.read_bytes() == SCORER and stat.S_IMODE(path.stat().st_mode) == 0o755
    assert scorer.sha256 == sha256_digest(SCORER) and scorer.size_bytes == len(SCORER)
    assert scorer.description == "exact sum"
    assert [p.name for p in path.parent.iterdir()] == ["score_math.py"]  # no temporary sibling left

    html = operator_client.get(response["Location"]).content.decode()
    assert "Registered scorer math-exact" in html
    assert '<option value="math-exact" selected>math-exact (score_math.py)</option>' in html
    assert 'id="scorer-math-exact"' in html and "exact sum" in html


@pytest.mark.parametrize(("name", "content", "filename", "code", "field"), [
    ("bad name!", SCORER, "s.py", "scorer_invalid", "scorer_name"),
    ("base/../x", SCORER, "s.py", "scorer_invalid", "scorer_name"),
    ("no-shebang", b"print(1.0)\n", "s.py", "scorer_invalid", "scorer_file"),
    ("empty", b"", "s.py", "scorer_invalid", "scorer_file"),
])
def test_scorer_registration_refusals_store_nothing(operator_client, home, name, content, filename, code, field):
    response = _register(operator_client, name=name, content=content, filename=filename)
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="scorer-form-error"' in html and f"<code>{code}</code>" in html
    assert f'id="error-{field}"' in html
    assert not Scorer.objects.exists()
    assert not (home / "scorers").exists() or not any((home / "scorers").iterdir())


def test_a_scorer_name_is_registered_once_and_odd_filenames_are_made_safe(operator_client, home):
    assert _register(operator_client, name="v1", filename="../my scorer$.py").status_code == 302
    assert Scorer.objects.get().filename == "my_scorer_.py"
    assert (home / "scorers" / "v1" / "my_scorer_.py").is_file()
    again = _register(operator_client, name="v1", content=b"#!/bin/sh\necho 0\n")
    assert again.status_code == 409 and "<code>scorer_name_taken</code>" in again.content.decode()
    assert (home / "scorers" / "v1" / "my_scorer_.py").read_bytes() == SCORER  # unchanged


def test_viewers_cannot_register_scorers_or_generate(viewer_client, operator_client, home):
    page = viewer_client.get(URL).content.decode()
    assert 'id="needs-permission"' in page and "<fieldset disabled" in page
    response = _register(viewer_client)
    assert response.status_code == 403 and "cannot register scorers" in response.content.decode()
    assert not Scorer.objects.exists()
    _register(operator_client)
    response = viewer_client.post(URL, _form())
    assert response.status_code == 403 and "cannot generate rollouts" in response.content.decode()
    assert not Job.objects.exists() and _inputs(home) == []


# ---- the generation form ----------------------------------------------------------------------

def test_submitting_queues_a_control_job_with_pinned_inputs(operator_client, operator, home):
    _register(operator_client)
    response = operator_client.post(URL, _form())
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/ui/jobs/{job.uuid}/"
    assert (job.kind, job.queue, job.state, job.submitted_by) == ("rollouts.generate", "control", "queued", operator)
    payload = job.payload
    assert payload["adapter"] == "base" and payload["thinking"] is False
    assert payload["seeds"] == {"start": 42, "count": 4, "last": 45}
    assert payload["concurrency"] == 3 and payload["requests"] == 12
    assert payload["scorer"] == {"name": "math-exact", "filename": "score_math.py", "sha256": sha256_digest(SCORER)}
    tasks = Path(payload["inputs"]["tasks"]["path"])
    assert tasks.read_text() == TASKS and payload["inputs"]["tasks"]["count"] == 3
    assert payload["inputs"]["tasks"]["sha256"] == sha256_digest(TASKS.encode())
    assert stat.S_IMODE(tasks.stat().st_mode) == 0o444
    assert Path(payload["inputs"]["request_template"]["path"]).read_text() == TEMPLATE
    assert job.title.startswith("Rollouts · 3 tasks × 4 seeds · base · math-exact")

    page = operator_client.get(response["Location"]).content.decode()
    assert 'id="rollouts-section"' in page and "waiting to start" in page
    assert 'id="rollouts-train-form"' in page and 'id="train-on-rollouts"' not in page
    assert "Available once the run completes." in page
    assert "the base model" in page


def test_without_a_model_the_page_says_so_and_generation_is_refused_with_mock_mode(operator_client, home, settings):
    import dataclasses

    _register(operator_client)
    assert 'id="no-model"' not in operator_client.get(URL).content.decode()  # tests/settings.py has one
    settings.KILN = dataclasses.replace(settings.KILN, model_path=None)
    assert "rollout generation is refused" in " ".join(operator_client.get(URL).content.decode().split())
    response = operator_client.post(URL, _form())
    assert response.status_code == 503
    page = response.content.decode()
    assert "<code>mock_mode</code>" in page and "Nothing was queued." in page and "KILN_MODEL_PATH" in page
    assert not Job.objects.exists() and _inputs(home) == []  # refused before anything was pinned


def test_a_pasted_template_and_thinking_are_accepted(operator_client):
    _register(operator_client)
    response = operator_client.post(URL, _form(request_file=None, request_json=TEMPLATE, thinking="on",
                                               thinking_budget_tokens="32"))
    assert response.status_code == 302, response.content.decode()[:3000]
    job = Job.objects.get()
    assert job.payload["thinking"] is True and job.payload["thinking_budget_tokens"] == 32
    assert job.payload["inputs"]["request_template"]["filename"] == "request.json (pasted)"


@pytest.mark.parametrize(("fields", "code", "field", "text"), [
    ({"scorer": ""}, "rollouts_invalid_request", "scorer", "choose a registered scorer"),
    ({"scorer": "nope"}, "rollouts_invalid_request", "scorer", "no registered scorer named"),
    ({"adapter": "missing-r001"}, "rollouts_invalid_request", "adapter", "no published adapter"),
    ({"seeds": "0"}, "rollouts_invalid_request", "seeds", "must lie within 1..64"),
    ({"seeds": "four"}, "rollouts_invalid_request", "seeds", "is not an integer"),
    ({"seed_start": "-1"}, "rollouts_invalid_request", "seed_start", "must lie within"),
    ({"concurrency": "99"}, "rollouts_invalid_request", "concurrency", "must lie within 1..16"),
    ({"thinking_budget_tokens": "16"}, "rollouts_invalid_request", "thinking_budget_tokens", "needs thinking on"),
    ({"tasks_file": None}, "rollouts_invalid_request", "tasks", "upload a tasks.jsonl"),
    ({"tasks_file": _upload('{"id": "a", "prompt": "x"}\n{oops\n', "my-tasks.jsonl")}, "tasks_invalid", "tasks",
     "my-tasks.jsonl:2: not valid JSON"),
    ({"tasks_file": _upload('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', "t.jsonl")},
     "tasks_invalid", "tasks", "duplicate task id"),
    ({"request_json": TEMPLATE}, "rollouts_invalid_request", "request_template", "not both"),
    ({"request_file": None}, "rollouts_invalid_request", "request_template", "a request template is required"),
    ({"request_file": _upload('{"messages": [{"role": "user", "content": "{{prompt}}"}], "n": 2}', "r.json")},
     "template_owned_field", "request_template", "n=1"),
    ({"request_file": _upload('{"messages": [{"role": "user", "content": "{{task.nope}}"}]}', "r.json")},
     "template_field_missing", "request_template", "no field"),
    ({"request_file": _upload('{"messages": [{"role": "user", "content": "{{prompt}}"}], "temperature": 9}',
                              "r.json")}, "request_invalid", "request_template", "temperature"),
])
def test_refusals_are_shown_next_to_their_field_and_queue_nothing(operator_client, home, fields, code, field, text):
    _register(operator_client)
    if "tasks_file" in fields and fields["tasks_file"] is not None:
        fields = {**fields, "tasks_file": _upload(fields["tasks_file"].read(), fields["tasks_file"].name)}
    if fields.get("request_file") is not None:
        fields = {**fields, "request_file": _upload(fields["request_file"].read(), fields["request_file"].name)}
    response = operator_client.post(URL, _form(**fields))
    html = response.content.decode()
    assert response.status_code == 400, html[:2000]
    assert f"<code>{code}</code>" in html and f'id="error-{field}"' in html
    assert text in html.replace("&#x27;", "'").replace("&quot;", '"')
    assert str(home) not in html  # pinned paths are not shown: the uploaded names are
    assert not Job.objects.exists() and _inputs(home) == []


# ---- the job: generation, the rollouts section, downloads, training -----------------------------

@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU worker, faked at the sync transport (the web/worker boundary the job uses)."""
    from adapters.serving import selectors, sync_client

    server = FakeServer()
    monkeypatch.setattr(selectors, "require_inference_ready", lambda: None)
    monkeypatch.setattr(sync_client, "chat_completion_sync", lambda body, timeout=900.0: server(body))
    return server


def _run_queued_control_job() -> Job:
    assert runner._run_one("control", "test-control-worker")
    return Job.objects.get(kind="rollouts.generate")


def test_a_generation_job_publishes_files_stats_and_trains_with_one_click(operator_client, operator, home, fake_gpu):
    _register(operator_client)
    operator_client.post(URL, _form())
    job = _run_queued_control_job()
    assert job.state == JobState.COMPLETED, (job.error_code, job.error_message)
    assert len(fake_gpu.bodies) == 12 and {b["seed"] for b in fake_gpu.bodies} == {42, 43, 44, 45}
    out = home / "rollouts" / str(job.uuid)
    assert job.result["rollouts_path"] == str(out / "rollouts.jsonl")
    assert job.result["summary_path"] == str(out / "summary.json")
    corpus = admit_jsonl((out / "rollouts.jsonl").read_bytes())
    assert corpus.rollouts == corpus.with_provenance == 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["output"]["sha256"] == corpus.sha256 == job.result["output"]["sha256"]
    assert summary["scorer"]["sandboxed"] is True and summary["scorer"]["name"] == "math-exact"
    assert summary["job"]["id"] == str(job.uuid)
    stats = job.result["stats"]
    # The fake answers right on even seeds only: every group has contrast, half the rewards are 1.
    assert stats["count"] == 12 and stats["mean_reward"] == 0.5
    assert (stats["min_reward"], stats["max_reward"], stats["groups_without_contrast"]) == (0.0, 1.0, 0)
    assert job.metrics["requests_done"] == job.metrics["requests_total"] == 12
    assert job.events.filter(type="progress").count() >= 12  # one per scored request (and the start)

    page = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert 'id="rollouts-stats"' in page and 'id="rollouts-mean">0.5<' in page
    assert 'id="rollouts-histogram"' in page and 'id="rollouts-all-flat"' not in page
    assert f'href="/ui/training/rollouts/{job.uuid}/files/rollouts.jsonl"' in page
    assert 'id="train-on-rollouts"' in page

    download = operator_client.get(f"/ui/training/rollouts/{job.uuid}/files/rollouts.jsonl")
    assert download.status_code == 200 and b"".join(download.streaming_content) == corpus.jsonl
    assert "attachment" in download["Content-Disposition"]
    assert operator_client.get(f"/ui/training/rollouts/{job.uuid}/files/../kiln.sqlite3").status_code == 404
    assert operator_client.get(f"/ui/training/rollouts/{job.uuid}/files/other.json").status_code == 404

    # An output name is required; the error is shown on the job page and nothing is queued.
    missing = operator_client.post(f"/ui/training/rollouts/{job.uuid}/train/", {"output_name": " "})
    assert missing.status_code == 400 and 'id="train-error"' in missing.content.decode()
    assert not Job.objects.filter(kind="training.grpo").exists()

    response = operator_client.post(f"/ui/training/rollouts/{job.uuid}/train/", {"output_name": "math-r001"})
    training = Job.objects.get(kind="training.grpo")
    assert response.status_code == 302 and response["Location"] == f"/ui/jobs/{training.uuid}/"
    assert training.submitted_by == operator and training.payload["route"] == URL
    config = training.payload["config"]
    assert config["behavior_policy"] == "recorded" and config["auto_load"] is False
    assert not config.get("base_adapter")
    assert training.payload["training_data"] == {
        "source": "dataset_path", "path": str(out / "rollouts.jsonl"), "admitted_corpus_sha256": corpus.sha256,
        "rows": 3, "rollouts": 12, "groups_with_reward_contrast": groups_with_reward_contrast(corpus.groups)}

    # The name is taken now: the error comes back on the page, with the name typed kept.
    again = operator_client.post(f"/ui/training/rollouts/{job.uuid}/train/", {"output_name": "math-r001"})
    html = again.content.decode()
    assert again.status_code == 409 and "<code>adapter_revision_conflict</code>" in html
    assert 'value="math-r001"' in html
    page = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert 'id="rollouts-training-runs"' in page and str(training.uuid)[:8] in page


def test_viewers_cannot_train_and_unfinished_runs_cannot_be_trained(operator_client, viewer_client, home, fake_gpu):
    _register(operator_client)
    operator_client.post(URL, _form())
    job = Job.objects.get()
    queued = operator_client.post(f"/ui/training/rollouts/{job.uuid}/train/", {"output_name": "early"})
    assert queued.status_code == 409 and "<code>rollouts_not_ready</code>" in queued.content.decode()
    job = _run_queued_control_job()
    page = viewer_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert 'id="train-needs-permission"' in page
    denied = viewer_client.post(f"/ui/training/rollouts/{job.uuid}/train/", {"output_name": "math-r001"})
    assert denied.status_code == 403 and "cannot start training" in denied.content.decode()
    assert not Job.objects.filter(kind="training.grpo").exists()
    # Downloads only need a login.
    assert viewer_client.get(f"/ui/training/rollouts/{job.uuid}/files/summary.json").status_code == 200


def test_a_failed_validation_fails_the_job_and_publishes_nothing(operator_client, home, fake_gpu):
    _register(operator_client)
    operator_client.post(URL, _form())

    def tamper(body, response):
        if body["seed"] == 44:
            response["choices"][0]["seed"] = "7"
        return response

    fake_gpu.tamper = tamper
    job = _run_queued_control_job()
    assert (job.state, job.error_code) == (JobState.FAILED, "rollout_check_failed")
    assert "seed 44" in job.error_message and "check seed" in job.error_message
    out = home / "rollouts" / str(job.uuid)
    assert not out.exists() or os.listdir(out) == []
    page = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert "No rollouts were published" in page and 'id="train-on-rollouts"' not in page
    assert "This run failed and published nothing." in page
    assert operator_client.get(f"/ui/training/rollouts/{job.uuid}/files/rollouts.jsonl").status_code == 404


def test_a_scorer_that_changed_on_disk_fails_the_job(operator_client, home, fake_gpu):
    _register(operator_client)
    operator_client.post(URL, _form())
    path = home / "scorers" / "math-exact" / "score_math.py"
    path.write_bytes(SCORER + b"# edited\n")
    job = _run_queued_control_job()
    assert (job.state, job.error_code) == (JobState.FAILED, "scorer_changed")
    assert fake_gpu.bodies == []


def test_the_live_update_swaps_only_the_train_button(operator_client, home, fake_gpu):
    _register(operator_client)
    operator_client.post(URL, _form())
    job = _run_queued_control_job()
    html = fragments.render_job_update(job)
    assert 'id="rollouts-section"' in html
    assert '<span id="rollouts-train-button" hx-swap-oob="true">' in html and 'id="train-on-rollouts"' in html
    assert 'name="output_name"' not in html  # the typed name is never replaced by a live update


def test_services_refuse_what_the_forms_cannot_send(operator):
    from training.rollout_services import rollouts_train_submit

    with pytest.raises(KilnError) as caught:
        rollouts_train_submit(job=Job(kind="training.grpo"), output_name="x", user=operator)
    assert caught.value.code == "rollouts_not_found"


# ---- the in-cluster transport the job uses (kiln_project/inference/sync_client.py) --------------

class FakeRedis:
    def __init__(self):
        self.lists: dict[str, list] = {}
        self.deleted: list[str] = []
        self.timeouts: list[int] = []
        self.values: dict[str, object] = {}

    def blpop(self, keys, timeout):
        self.timeouts.append(timeout)
        for key in keys:
            if self.lists.get(key):
                return key.encode(), self.lists[key].pop(0)
        return None

    def delete(self, *keys):
        for key in keys:
            self.deleted.append(key)
            self.lists.pop(key, None)

    def get(self, key):  # the claim of the worker that took a request: none here
        return None

    def set(self, key, value, ex=None):
        self.values[key] = value

    def pipeline(self):  # commands run when executed, in order (what transport.close_request needs)
        fake, calls = self, []

        class Pipeline:
            def __getattr__(self, name):
                return lambda *args, **kwargs: calls.append((name, args, kwargs)) or self

            def execute(self):
                return [getattr(fake, name)(*args, **kwargs) for name, args, kwargs in calls]

        return Pipeline()


@pytest.fixture
def transport(monkeypatch):
    from adapters.serving import selectors, sync_client, tasks
    from adapters.serving.transport import events_key

    fake = FakeRedis()
    sent = []
    answers = {"events": [{"type": "done", "response": {"object": "chat.completion"}}]}

    def send(request_id, body):
        sent.append((request_id, body))
        fake.lists[events_key(request_id)] = [json.dumps(e) for e in answers["events"]]

    monkeypatch.setattr(sync_client, "_redis", lambda: fake)
    monkeypatch.setattr(tasks.run_chat_completion, "send", send)
    monkeypatch.setattr(selectors, "require_inference_ready", lambda: None)
    return sync_client, fake, sent, answers


BODY = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "seed": 1, "max_tokens": 8}


def test_sync_client_sends_the_validated_body_and_returns_the_response(transport):
    sync_client, fake, sent, _ = transport
    assert sync_client.chat_completion_sync(dict(BODY), timeout=30) == {"object": "chat.completion"}
    request_id, body = sent[0]
    assert body["messages"] == [{"role": "user", "content": "What is 2 + 3?", "reasoning_content": None,
                                 "name": None, "tool_call_id": None}]
    assert body["seed"] == 1 and body["stream"] is False and body["temperature"] == 1.0  # the model's dump
    assert fake.deleted == [f"kiln:infer:{request_id}", f"kiln:infer:{request_id}:worker"]
    assert fake.values == {f"kiln:infer:{request_id}:closed": 1}  # a redelivery of it is dropped
    assert fake.timeouts == [5]  # the reader checks every 5 s that the request's worker still lives


def test_sync_client_raises_the_workers_error_and_refuses_bad_bodies(transport):
    sync_client, fake, sent, answers = transport
    answers["events"] = [{"type": "error", "code": "generation_failed", "message": "decoding failed", "status": 500}]
    with pytest.raises(KilnError) as caught:
        sync_client.chat_completion_sync(dict(BODY), timeout=30)
    assert (caught.value.code, caught.value.status, caught.value.message) == ("generation_failed", 500, "decoding failed")
    with pytest.raises(KilnError) as caught:  # an adapter the registry never published: refused before sending
        sync_client.chat_completion_sync({**BODY, "adapter": "x"}, timeout=30)
    assert (caught.value.code, caught.value.status) == ("adapter_not_found", 404)
    for body, code in [({**BODY, "temperature": 9}, "validation_error"), ({**BODY, "n": 99}, "n_too_large"),
                       ({**BODY, "max_tokens": 10**6}, "max_tokens_too_large"), ({**BODY, "stream": True},
                                                                                   "stream_unsupported")]:
        with pytest.raises(KilnError) as caught:
            sync_client.chat_completion_sync(body, timeout=30)
        assert caught.value.code == code
    assert len(sent) == 1  # refusals send nothing
    answers["events"] = []
    with pytest.raises(KilnError) as caught:
        sync_client.chat_completion_sync(dict(BODY), timeout=2)
    assert caught.value.code == "inference_timeout" and caught.value.status == 504


def test_sync_client_checks_readiness_before_sending(monkeypatch):
    from adapters.serving import sync_client, tasks

    monkeypatch.setattr(tasks.run_chat_completion, "send", lambda *a: pytest.fail("sent while not ready"))
    with pytest.raises(KilnError) as caught:
        sync_client.chat_completion_sync(dict(BODY), timeout=30)
    assert caught.value.code == "inference_unavailable" and caught.value.status == 503


def test_a_cancelled_run_stops_at_the_next_request_and_publishes_nothing(operator_client, home, fake_gpu,
                                                                         monkeypatch):
    _register(operator_client)
    operator_client.post(URL, _form(concurrency="1"))
    # Cancellation is asked for once two answers came back (as if a user clicked Cancel then).
    monkeypatch.setattr(runner.JobContext, "should_stop", lambda self: len(fake_gpu.bodies) >= 2)
    job = _run_queued_control_job()
    assert (job.state, job.error_code) == (JobState.CANCELLED, "job_cancelled")
    assert len(fake_gpu.bodies) <= 3  # stopped long before the 12 planned requests
    out = home / "rollouts" / str(job.uuid)
    assert not out.exists() or os.listdir(out) == []
