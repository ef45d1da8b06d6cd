"""`kiln train grpo --file F`: JSONL of groups goes by the streamed route (`dataset_path`, read by the
server); a JSON batch (a list) or a request object goes inline as written. Before, a JSON batch in
a dataset root was sent as `dataset_path` and the server, reading lines, refused it."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from kiln_project.cli.train_cmd import _submit_grpo

GROUP = {"messages": [{"role": "user", "content": "hi"}],
         "completions": [{"text": "a", "reward": 1}, {"text": "b", "reward": 0}]}


class Client:
    def __init__(self):
        self.posts = []

    def post(self, path, json):
        self.posts.append(json)
        return {"job_id": "j"}


def _args(path):
    return Namespace(file=path, adapter="inl-3", lora_rank=None, checkpoint_interval=None, resume_checkpoint=None,
                     no_shared_prefix_reference=False)


@pytest.mark.parametrize(("text", "streamed"), [
    (json.dumps(GROUP) + "\n" + json.dumps(GROUP) + "\n", True),  # JSONL
    (json.dumps(GROUP) + "\n", True),  # JSONL of one line
    (json.dumps([GROUP, GROUP]), False),  # a JSON batch
    (json.dumps({"groups": [GROUP]}), False),  # a request with only groups
    (json.dumps({"groups": [GROUP], "config": {"kl_coeff": 0.2}}), False),
])
def test_only_jsonl_goes_by_dataset_path(tmp_path, text, streamed):
    path = tmp_path / "batch.json"
    path.write_text(text)
    client = Client()
    _submit_grpo(client, _args(path))
    [body] = client.posts
    assert ("dataset_path" in body) is streamed and ("groups" in body) is not streamed
    if streamed:
        assert body["dataset_path"] == str(path.resolve())
    else:
        assert all(group == GROUP for group in body["groups"])
    assert body["config"]["output_name"] == "inl-3"


def test_the_smoke_test_and_anomaly_flags_reach_the_config(tmp_path):
    from kiln_project.cli.client import CliError
    from kiln_project.cli.main import build_parser

    groups = tmp_path / "groups.jsonl"
    groups.write_text(json.dumps(GROUP) + "\n")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is 2 + 3?\n\nName a colour.\n")
    args = build_parser().parse_args(["train", "grpo", "--file", str(groups), "--adapter", "smoke-r001",
                                      "--adapter-smoke-test", "--adapter-smoke-prompts-file", str(prompts),
                                      "--detect-anomaly"])
    client = Client()
    _submit_grpo(client, args)
    config = client.posts[0]["config"]
    assert config["adapter_smoke_test"] is True and config["detect_anomaly"] is True
    assert config["adapter_smoke_prompts"] == ["What is 2 + 3?", "Name a colour."]
    prompts.write_text(json.dumps(["one", "two"]))
    _submit_grpo(client, args)
    assert client.posts[1]["config"]["adapter_smoke_prompts"] == ["one", "two"]
    plain = build_parser().parse_args(["train", "grpo", "--file", str(groups)])
    _submit_grpo(client, plain)
    assert not {"adapter_smoke_test", "adapter_smoke_prompts", "detect_anomaly"} & set(client.posts[2]["config"])
    lonely = build_parser().parse_args(["train", "grpo", "--file", str(groups), "--adapter-smoke-prompts-file",
                                        str(prompts)])
    with pytest.raises(CliError) as caught:
        _submit_grpo(client, lonely)
    assert caught.value.code == "invalid_arguments"


def test_a_flag_that_replaces_the_request_files_value_says_so(tmp_path, capsys):
    path = tmp_path / "round4b.json"
    path.write_text(json.dumps({"groups": [GROUP], "config": {"output_name": "math-r004b"}}))
    client = Client()
    _submit_grpo(client, _args(path))
    assert client.posts[0]["config"]["output_name"] == "inl-3"
    assert "output_name 'inl-3' replaces 'math-r004b' from the request file" in capsys.readouterr().err
    path.write_text(json.dumps({"groups": [GROUP], "config": {"output_name": "inl-3"}}))
    _submit_grpo(client, _args(path))
    assert capsys.readouterr().err == ""  # the same value: nothing to say


def test_dry_run_sends_the_flag_and_prints_the_plan_not_a_job(tmp_path, monkeypatch, capsys):
    """A plan has no job_id: the command printed it as `queued ...` and crashed (KeyError) before."""
    from kiln_project.cli import train_cmd
    from kiln_project.cli.main import build_parser

    groups = tmp_path / "groups.jsonl"
    groups.write_text(json.dumps(GROUP) + "\n")
    plan = {"mode": "jsonl_grpo_groups_dry_run", "dry_run": True, "would_publish": "inl-3", "effective_seed": "7",
            "training_data": {"rows": 1, "rollouts": 2}, "groups_with_reward_contrast": 1,
            "groups_without_reward_contrast": 0}
    sent = []

    class PlanClient(Client):
        def __init__(self, url=None):
            super().__init__()

        def post(self, path, json):
            sent.append(json)
            return plan

    monkeypatch.setattr(train_cmd, "KilnClient", PlanClient)
    args = build_parser().parse_args(["train", "grpo", "--file", str(groups), "--adapter", "inl-3", "--dry-run"])
    assert train_cmd.run(args) == 0
    assert sent[0]["dry_run"] is True
    out = capsys.readouterr().out
    assert out.startswith("dry run: valid; nothing queued. It would publish inl-3 (effective seed 7) from 1 groups")
    assert "largest step" not in out  # a plan without a memory estimate says nothing of it


def test_a_dry_run_prints_the_largest_steps_memory_and_its_budget():
    from kiln_project.cli.train_cmd import _dry_run_text

    plan = {"would_publish": "x", "training_data": {"rows": 1, "rollouts": 2},
            "memory": {"largest_step": {"total_mib": 1234.5}, "budget_mib": None, "budget_source": None}}
    assert _dry_run_text(plan).endswith("its largest step needs at least 1234.5 MiB beyond the model "
                                        "(no budget set on this server: not checked)")
    plan["memory"].update(budget_mib=8000.0, budget_source="[training] memory_budget_mib")
    assert _dry_run_text(plan).endswith("1234.5 MiB beyond the model of a 8000 MiB budget ([training] memory_budget_mib)")


def test_rollouts_with_provenance_get_a_note_that_the_command_does_not_use_it(tmp_path, capsys):
    recorded = {**GROUP, "completions": [{**c, "provenance": {"schema": "kiln.rollout-provenance.v1"}}
                                         for c in GROUP["completions"]]}
    path = tmp_path / "r.rollouts.jsonl"
    path.write_text(json.dumps(recorded) + "\n")
    _submit_grpo(Client(), _args(path))
    assert "carry recorded provenance, which this command does not use" in capsys.readouterr().err
    path.write_text(json.dumps(GROUP) + "\n")
    _submit_grpo(Client(), _args(path))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("state", "offered"), [("failed", True), ("completed", False), ("running", False)])
def test_status_offers_a_resume_only_for_a_run_that_did_not_finish(state, offered):
    """A completed run's checkpoint was offered as a resume, which the server always refuses
    (adapter_revision_conflict: the adapter is published)."""
    from kiln_project.cli.train_cmd import detail_lines

    detail = {"job_id": "j1", "state": state, "replay_request": {"route": "/v1/train/grpo", "body": {}},
              "latest_checkpoint": {"resume_checkpoint": "a-checkpoint-step-00000005.kiln-checkpoint",
                                    "global_step": 5}}
    line = next(line for line in detail_lines(detail) if line.startswith("checkpoint"))
    assert line.startswith("checkpoint     a-checkpoint-step-00000005.kiln-checkpoint (step 5)")
    assert ("resume with: kiln train resume --job-id j1" in line) is offered


def test_no_auto_load_publishes_without_activating(tmp_path):
    from kiln_project.cli.train_cmd import _with_config

    args = Namespace(adapter="a-r001", lora_rank=None, checkpoint_interval=None, resume_checkpoint=None,
                     no_shared_prefix_reference=False, no_auto_load=True)
    assert _with_config({"groups": [GROUP]}, args)["config"]["auto_load"] is False
    args.no_auto_load = False
    assert "auto_load" not in _with_config({"groups": [GROUP]}, args)["config"]


class ResumeClient:
    """GET of a stopped job with a checkpoint and its replay request; POST queues the resume."""

    def __init__(self, url):
        self.posted = []

    def get(self, path):
        return {"job_id": "j1", "adapter_name": "a-r001", "state": "failed",
                "latest_checkpoint": {"resume_checkpoint": "a-r001-checkpoint-step-00000005.kiln-checkpoint"},
                "replay_request": {"route": "/v1/train/grpo", "body": {"dataset_path": "/d.jsonl",
                                                                       "config": {"output_name": "a-r001"}}}}

    def post(self, path, json):
        self.posted.append((path, json))
        return {"job_id": "j2", "state": "queued", "effective_seed": "7", "message": "queued"}


def test_resume_json_prints_one_json_object(monkeypatch, capsys):
    """QA: `kiln train resume --json | jq -r .job_id` got the text line `queued j2: resumes ...`."""
    from kiln_project.cli import train_cmd

    monkeypatch.setattr(train_cmd, "KilnClient", ResumeClient)
    args = Namespace(url=None, train_command="resume", job_id="3f1f8c5e-0000-4000-8000-000000000001", checkpoint=None,
                     follow=False, json=True)
    assert train_cmd.run(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["job_id"] == "j2" and printed["resumes"] == "a-r001"
    assert printed["resume_checkpoint"] == "a-r001-checkpoint-step-00000005.kiln-checkpoint"
    args.json = False
    assert train_cmd.run(args) == 0
    assert capsys.readouterr().out == "queued j2: resumes a-r001 from a-r001-checkpoint-step-00000005.kiln-checkpoint\n"


def test_resume_of_a_completed_job_or_one_without_a_checkpoint_says_why():
    """QA: a completed job's resume answered adapter_revision_conflict for the name it had published, and a
    job that set checkpoint_interval but stopped before its first checkpoint was told to set one."""
    from kiln_project.cli.client import CliError
    from kiln_project.cli.train_cmd import resume_request

    replay = {"route": "/v1/train/grpo", "body": {"config": {"checkpoint_interval": 25}}}
    done = {"job_id": "j1", "state": "completed", "adapter_name": "math-r001", "replay_request": replay,
            "effective_config": {"checkpoint_interval": 25},
            "latest_checkpoint": {"resume_checkpoint": "math-r001-checkpoint-step-00000025.kiln-checkpoint"}}
    with pytest.raises(CliError) as completed:
        resume_request(done, None)
    assert completed.value.code == "training_job_completed"
    assert "config.base_adapter math-r001 and a new output name" in completed.value.hint
    # an inline-groups job has no replay request: the interval is read from its effective config
    early = {"job_id": "j2", "state": "failed", "adapter_name": "math-r002", "replay_request": None,
             "effective_config": {"checkpoint_interval": 25}}
    with pytest.raises(CliError) as stopped:
        resume_request(early, None)
    assert stopped.value.code == "checkpoint_not_found"
    assert stopped.value.hint == "it stopped before its first checkpoint (every 25 optimizer groups); it can only run again"
    with pytest.raises(CliError) as running:
        resume_request({**early, "state": "running"}, None)
    assert running.value.code == "training_job_not_stopped" and "kiln train cancel --job-id j2" in running.value.hint
    never = {**early, "effective_config": {"checkpoint_interval": None}}
    with pytest.raises(CliError) as unset:
        resume_request(never, None)
    assert unset.value.hint.startswith("set config.checkpoint_interval")
