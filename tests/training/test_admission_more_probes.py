"""POST /v1/train/grpo refuses at admission what would only fail in the worker, and says what it ignored:
- a learning_rate past 1 (1e308 trained and failed `ValueError: Out of range float values ...: nan`);
- a resume from a checkpoint of other data (queued, then failed checkpoint_source_mismatch);
- a rollout summary sent as dataset_path (answered "line 1: is not valid JSON");
- unknown config keys are still ignored (spec §3), but named in the answer with their closest field,
  and `kiln train grpo` prints them as warnings (a misspelt behavior_policy trained silently);
and its hints describe what the contract really accepts."""

from __future__ import annotations

import json

import httpx
import pytest

from core.contracts.groups import admit_groups, admit_jsonl
from core.jobs.models import Job
from evaluations.generation.corpus import SUMMARY_SCHEMA
from kiln_project.cli import train_cmd
from tests.cli.recording_server import run_cli, serve_commands
from tests.training.conftest import GROUP

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def own_home(settings, tmp_path):
    """A KILN_HOME of this test's own: the checkpoints it writes are seen by no other test."""
    from dataclasses import replace

    settings.KILN = replace(settings.KILN, home=tmp_path / "home")


def _post(api, body):
    return api.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")


def _error(response, status, code="training_invalid_request") -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


# ---- learning_rate bound ----------------------------------------------------------------------


@pytest.mark.parametrize("rate", [1e308, 18446744073709551616, 1.5])
def test_a_learning_rate_past_one_is_refused_before_it_queues(api, rate):
    error = _error(_post(api, {"groups": [GROUP], "config": {"learning_rate": rate}}), 400)
    assert error["message"].startswith("config.learning_rate: must be within (0, 1], got ")
    assert "null" in error["hint"]
    assert not Job.objects.exists()


@pytest.mark.parametrize("rate", [1.0, 0.2, 1e-5, None])
def test_learning_rates_in_use_and_null_stay_accepted(api, rate):
    queued = _post(api, {"groups": [GROUP], "config": {"learning_rate": rate}})
    assert queued.status_code == 200, queued.content
    assert Job.objects.get().payload["config"]["learning_rate"] == rate  # null: the optimizer's default


def test_the_openapi_document_shows_the_bound(api):
    schema = api.get("/v1/openapi.json").json()["components"]["schemas"]
    rate = schema["GrpoRequest"]["properties"]["config"]["properties"]["learning_rate"]
    assert rate["anyOf"][0]["maximum"] == 1.0 and rate["anyOf"][1] == {"type": "null"}


# ---- a resume's checkpoint must have trained on this data ---------------------------------------


def _checkpoint(settings, *, source_kind: str, content_sha256: str):
    folder = settings.KILN.layout.adapters / "ckpt-c-checkpoint-step-00000002.kiln-checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"adapter_name": "ckpt-c", "checkpoint_id": "ckpt-c-step-00000002-abc", "effective_config": {"seed": "7"},
                "data": {"source_kind": source_kind, "content_sha256": content_sha256, "item_count": 1}}
    (folder / "checkpoint_manifest.json").write_text(json.dumps(manifest))
    return folder.name


OTHER = {"messages": [{"role": "user", "content": "What is 4 + 4?"}],
         "completions": [{"text": "8", "reward": 1.0}, {"text": "9", "reward": 0.0}]}


def test_a_resume_from_a_checkpoint_of_other_data_is_refused_not_queued(api, settings):
    name = _checkpoint(settings, source_kind="inline", content_sha256=admit_groups([OTHER]).sha256)
    error = _error(_post(api, {"groups": [GROUP], "config": {"output_name": "ckpt-c", "resume_checkpoint": name}}),
                   409, "checkpoint_source_mismatch")
    assert error["message"] == (f"config.resume_checkpoint: checkpoint {name} was trained on other data "
                                f"({admit_groups([OTHER]).sha256}; this request's is {admit_groups([GROUP]).sha256})")
    assert "the exact file that run trained on" in error["hint"] and "leave resume_checkpoint out" in error["hint"]
    assert not Job.objects.exists()


def test_a_resume_of_the_same_bytes_sent_another_way_is_refused_too(api, settings, tmp_path):
    """The worker compares the route as well (data.source_kind): the same groups inline are not the file."""
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(GROUP) + "\n")
    name = _checkpoint(settings, source_kind="dataset_path", content_sha256=admit_jsonl(path.read_bytes()).sha256)
    error = _error(_post(api, {"groups": [GROUP], "config": {"output_name": "ckpt-c", "resume_checkpoint": name}}),
                   409, "checkpoint_source_mismatch")
    assert "the same data sent as dataset_path, not inline groups" in error["message"]
    assert not Job.objects.exists()
    # the very file, by the very route: queued (the worker still checks everything else)
    queued = _post(api, {"dataset_path": str(path), "config": {"output_name": "ckpt-c", "resume_checkpoint": name}})
    assert queued.status_code == 200, queued.content
    assert queued.json()["effective_seed"] == "7"


# ---- a rollout summary is not the rollouts ------------------------------------------------------


@pytest.mark.parametrize("schema, where", [
    (SUMMARY_SCHEMA, {"output": {"path": "/data/run/rollouts.jsonl", "sha256": "sha256:" + "0" * 64}}),
    ("kiln.openenv-rollout-summary.v5", {"configuration": {"output_path": "/data/run/rollouts.jsonl"}}),
])
def test_a_rollout_summary_sent_as_dataset_path_names_the_rollouts_file(api, tmp_path, schema, where):
    summary = tmp_path / "rollout_summary.json"
    summary.write_text(json.dumps({"schema": schema, **where, "stats": {"rollouts": 2}}, indent=2) + "\n")
    error = _error(_post(api, {"dataset_path": str(summary)}), 400)
    assert error["message"] == (f"dataset_path: is a rollout summary ({schema}), not the rollouts: send its "
                                "rollouts file /data/run/rollouts.jsonl instead")
    assert "not valid JSON" not in error["message"] and error["hint"]
    assert not Job.objects.exists()


def test_other_json_objects_keep_the_line_error(api, tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"schema": "something.else", "output": {"path": "/x"}}, indent=2))
    assert "line 1: is not valid JSON" in _error(_post(api, {"dataset_path": str(path)}), 400)["message"]


# ---- hints say what the contract accepts --------------------------------------------------------


def test_the_group_hint_matches_what_admission_accepts(api):
    one = {"messages": GROUP["messages"], "completions": [{"text": "5", "reward": 1.0}]}
    assert _post(api, {"groups": [one]}).status_code == 200  # one completion is a group (the guide: one or more)
    error = _error(_post(api, {"groups": [{"messages": GROUP["messages"], "completions": []}]}), 400)
    assert error["message"] == "groups[0].completions: must be a non-empty list"
    assert "with 1 to 1024 completions" in error["hint"] and "at least two" not in error["hint"]


def test_the_config_hint_points_at_documents_that_exist(api):
    error = _error(_post(api, {"groups": [GROUP], "config": "abc"}), 400)
    assert "GET /v1/openapi.json" in error["hint"] and "GET /v1/config" in error["hint"]
    assert "training reference" not in error["hint"]


# ---- ignored config keys are named ---------------------------------------------------------------


def test_ignored_config_keys_are_answered_with_their_closest_field(api):
    queued = _post(api, {"groups": [GROUP], "config": {"output_name": "typo-r001", "behavior_polcy": "recorded",
                                                        "loss": {"no_polcy_loss": True}, "zzz": 1}})
    assert queued.status_code == 200, queued.content
    answer = queued.json()
    assert answer["state"] == "queued"
    assert answer["ignored_config_keys"] == ["behavior_polcy", "loss.no_polcy_loss", "zzz"]
    assert answer["warnings"] == [
        "config.behavior_polcy is not a GRPO config field and was ignored (did you mean behavior_policy?)",
        "config.loss.no_polcy_loss is not a field of config.loss and was ignored (did you mean loss.no_policy_loss?)",
        "config.zzz is not a GRPO config field and was ignored",
    ]
    assert Job.objects.get().payload["config"]["behavior_policy"] == "no_importance_correction"  # still ignored
    clean = _post(api, {"groups": [GROUP], "config": {"output_name": "clean-r001"}}).json()
    assert clean["ignored_config_keys"] == [] and clean["warnings"] == []
    plan = _post(api, {"groups": [GROUP], "config": {"output_name": "typo-r002", "behavior_polcy": "recorded"},
                       "dry_run": True}).json()
    assert plan["warnings"] == answer["warnings"][:1]
    queued_schema = api.get("/v1/openapi.json").json()["components"]["schemas"]["GrpoQueued"]["properties"]
    assert {"ignored_config_keys", "warnings"} <= set(queued_schema)


def test_kiln_train_grpo_prints_the_warnings(api, monkeypatch, capsys, tmp_path):
    def answer(request: httpx.Request) -> httpx.Response:  # the real API behind the CLI's client
        response = api.post(request.url.path, data=request.content, content_type="application/json")
        return httpx.Response(response.status_code, content=response.content,
                              headers={"content-type": "application/json"})

    serve_commands(monkeypatch, (train_cmd,), answer)
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"groups": [GROUP], "config": {"behavior_polcy": "recorded"}}))
    code, out, err = run_cli(capsys, "train", "grpo", "--file", str(request), "--adapter", "warn-r001")
    assert code == 0 and out.startswith("queued ")
    assert ("kiln: warning: config.behavior_polcy is not a GRPO config field and was ignored (did you mean "
            "behavior_policy?)\n") in err


def test_a_resume_with_another_config_is_refused_before_it_queues(api, settings):
    """The soak's case: `kiln train grpo --file ... --resume-checkpoint` of a recorded-policy run sent
    no_importance_correction and no base adapter; it was queued and failed checkpoint_config_mismatch."""
    from core.contracts.groups import admit_groups
    from core.contracts.grpo_config import GrpoConfig

    folder = settings.KILN.layout.adapters / "cfg-r001-checkpoint-step-00000002.kiln-checkpoint"
    folder.mkdir(parents=True)
    recorded = GrpoConfig.from_dict({"output_name": "cfg-r001", "seed": 7, "kl_coeff": 0.3}).to_dict()
    (folder / "checkpoint_manifest.json").write_text(json.dumps({
        "adapter_name": "cfg-r001", "checkpoint_id": "cfg-r001-step-00000002-abc", "effective_config": recorded,
        "data": {"source_kind": "inline", "content_sha256": admit_groups([GROUP]).sha256, "item_count": 1}}))
    body = {"groups": [GROUP], "config": {"output_name": "cfg-r001", "seed": 7, "resume_checkpoint": folder.name}}
    response = api.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "checkpoint_config_mismatch" and "kl_coeff: 0.3 -> 0.1" in error["message"]
    assert "kiln train resume" in error["hint"]
    assert not Job.objects.filter(kind="training.grpo").exists()
    # How-to-run fields may differ (checkpoint_keep_last was refused while checkpoint_interval was not).
    same = {**body, "config": {**body["config"], "kl_coeff": 0.3, "checkpoint_interval": 5, "checkpoint_keep_last": 1}}
    assert api.post("/v1/train/grpo", data=json.dumps(same), content_type="application/json").status_code == 200


def test_a_checkpoint_replaced_while_its_resume_waits_in_the_queue_is_refused_at_dequeue(
    api, settings, tmp_path, django_capture_on_commit_callbacks
):
    """The queue keeps the checkpoint manifest's digest from admission (reference-spec §3.2): a
    folder put in its place under the same name fails the job (checkpoint_invalid), not trains it."""
    import dataclasses

    from core.canonical import sha256_digest
    from core.contracts.groups import admit_groups
    from core.contracts.grpo_config import GrpoConfig
    from core.jobs.runner import run_queued_jobs

    folder = settings.KILN.layout.adapters / "pin-r001-checkpoint-step-00000002.kiln-checkpoint"
    folder.mkdir(parents=True)
    manifest = {"adapter_name": "pin-r001", "checkpoint_id": "pin-r001-step-00000002-abc",
                "effective_config": GrpoConfig.from_dict({"output_name": "pin-r001", "seed": 7}).to_dict(),
                "data": {"source_kind": "inline", "content_sha256": admit_groups([GROUP]).sha256, "item_count": 1}}
    (folder / "checkpoint_manifest.json").write_text(json.dumps(manifest))
    admitted = sha256_digest((folder / "checkpoint_manifest.json").read_bytes())
    body = {"groups": [GROUP], "config": {"output_name": "pin-r001", "seed": 7, "resume_checkpoint": folder.name}}
    response = _post(api, body)
    assert response.status_code == 200, response.content
    job = Job.objects.get(uuid=response.json()["job_id"])
    assert job.payload["resume_manifest_sha256"] == admitted
    (folder / "checkpoint_manifest.json").write_text(json.dumps(dict(manifest, checkpoint_id="pin-r001-other")))
    settings.KILN = dataclasses.replace(settings.KILN, model_path=tmp_path / "model")  # never reached
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("gpu")
    error = api.get(f"/v1/train/jobs/{job.uuid}").json()["error"]
    assert error["code"] == "checkpoint_invalid" and "changed after the job was admitted" in error["message"]
    assert admitted in error["message"] and error["hint"]


def test_kiln_train_resume_resends_the_jobs_own_request_with_its_checkpoint(api, settings, tmp_path):
    """`kiln train status` told an interrupted recorded-policy run to resume with `kiln train grpo --file`,
    which drops behavior_policy, base_adapter and post_eval: refused (or worse, a resume without its
    gate). `kiln train resume` sends the job's replay_request with config.resume_checkpoint."""
    from core.contracts.groups import admit_jsonl
    from core.jobs.models import JobState
    from kiln_project.cli.train_cmd import detail_lines, resume_request

    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(GROUP) + "\n" + json.dumps(OTHER) + "\n")
    body = {"dataset_path": str(path), "config": {"output_name": "res-r001", "kl_coeff": 0.3, "checkpoint_interval": 1}}
    first = api.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json").json()
    job = Job.objects.get(uuid=first["job_id"])
    folder = settings.KILN.layout.adapters / "res-r001-checkpoint-step-00000001.kiln-checkpoint"
    folder.mkdir(parents=True)
    (folder / "checkpoint_manifest.json").write_text(json.dumps({
        "adapter_name": "res-r001", "checkpoint_id": "res-r001-step-00000001-abc", "training_kind": "grpo",
        "created_at": "2026-12-05T00:00:00Z", "effective_config": job.payload["config"],
        "progress": {"global_step": 1, "total_steps": 2, "epoch_index": 0, "cursor_in_epoch": 1},
        "data": {"source_kind": "dataset_path", "content_sha256": admit_jsonl(path.read_bytes()).sha256, "item_count": 2}}))
    Job.objects.filter(id=job.id).update(state=JobState.FAILED, error_code="job_interrupted",
                                         metrics={"latest_checkpoint": str(folder)})
    from adapters.models import Adapter

    Adapter.objects.filter(name="res-r001").delete()  # the interrupted job's reservation is released
    detail = api.get(f"/v1/train/jobs/{job.uuid}").json()
    assert f"resume with: kiln train resume --job-id {job.uuid}" in "\n".join(detail_lines(detail))
    route, resumed = resume_request(detail, None)
    assert resumed["config"]["resume_checkpoint"] == folder.name and resumed["config"]["kl_coeff"] == 0.3
    response = api.post(route, data=json.dumps(resumed), content_type="application/json")
    assert response.status_code == 200, response.content
    again = Job.objects.get(uuid=response.json()["job_id"])
    assert again.payload["config"]["seed"] == job.payload["config"]["seed"]


def test_kiln_train_resume_of_inline_groups_or_without_a_checkpoint_says_what_to_do():
    from kiln_project.cli.client import CliError
    from kiln_project.cli.train_cmd import resume_request

    checkpoint = {"resume_checkpoint": "x-checkpoint-step-00000001.kiln-checkpoint"}
    with pytest.raises(CliError) as inline:
        resume_request({"job_id": "j", "state": "failed", "replay_request": None, "latest_checkpoint": checkpoint},
                       None)
    assert inline.value.code == "resume_needs_the_request" and checkpoint["resume_checkpoint"] in inline.value.hint
    with pytest.raises(CliError) as none:
        resume_request({"job_id": "j", "state": "failed", "latest_checkpoint": None,
                        "replay_request": {"route": "/v1/train/grpo", "body": {"config": {}}}}, None)
    assert none.value.code == "checkpoint_not_found"


# ---- what becomes of the published adapter is said at submission ------------------------------------


def test_the_queued_answer_says_whether_the_adapter_becomes_active(api, settings, monkeypatch, capsys, tmp_path):
    """QA: the guide's checkpoint example (`kiln train grpo --file F --adapter NAME`) replaced a reviewed,
    promoted adapter with nothing on screen saying it would (auto_load defaults to true)."""
    import types
    from dataclasses import replace

    from training.selectors import after_publication

    def said(config):
        answer = _post(api, {"groups": [GROUP], "config": config}).json()
        assert answer["message"] == f"GRPO training queued; it will publish adapter {config['output_name']}"
        return answer["after_publication"]

    at_once = said({"output_name": "say-r001"})
    assert at_once == ("it becomes active once its serving canary passes, unless a reward-hacking alarm sends it "
                       "to a reviewer (auto_load true, no gate; auto_load false keeps it for review)")
    assert said({"output_name": "say-r002", "auto_load": False}) == (
        "it stays available for review, not active (auto_load false)")
    settings.KILN = replace(settings.KILN, promotion_require_approval=True)
    assert said({"output_name": "say-r003"}) == (
        "making it active waits for a reviewer's approval ([promotion] require_approval)")
    gated = types.SimpleNamespace(config=types.SimpleNamespace(auto_load=True), gate_pending=True)
    assert after_publication(gated) == "if the post_eval gate promotes it, a reviewer's approval then makes it active"
    settings.KILN = replace(settings.KILN, promotion_require_approval=False)
    assert after_publication(gated) == "if the post_eval gate promotes it, it becomes active"
    assert "after_publication" in api.get("/v1/openapi.json").json()["components"]["schemas"]["GrpoQueued"]["properties"]

    # the CLI's stdout stays the one `queued` line; the note goes to stderr
    serve_commands(monkeypatch, [train_cmd], lambda request: httpx.Response(
        200, json={"job_id": "j-1", "state": "queued", "effective_seed": "7", "message": "queued",
                   "after_publication": at_once, "warnings": []}))
    groups = tmp_path / "groups.jsonl"
    groups.write_text(json.dumps(GROUP) + "\n")
    code, out, err = run_cli(capsys, "train", "grpo", "--file", str(groups), "--adapter", "say-r001")
    assert code == 0 and out == "queued j-1 (effective seed 7)\n"
    assert f"kiln: note: once published, {at_once}" in err
