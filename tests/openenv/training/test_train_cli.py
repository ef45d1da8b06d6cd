"""`kiln openenv train`: the guide's flags become a kind-train run request, posted and followed to the
published adapter, through an httpx transport that hands each request to Django's test client (and
after the POST runs the control queue, then the GPU queue with the real trainer on the tiny model)."""

from __future__ import annotations

import json
import types

import pytest

from core.jobs.models import Job
from core.jobs.runner import run_queued_jobs
from openenv.models import OpenEnvRun
from tests.openenv.runs.conftest import cli_through

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(600)]


@pytest.fixture
def cli(api, monkeypatch, django_capture_on_commit_callbacks):
    posted = []

    def after_post(request):
        posted.append(json.loads(request.content))
        with django_capture_on_commit_callbacks(execute=True):
            run_queued_jobs("control")
            run_queued_jobs("gpu")

    return types.SimpleNamespace(run=cli_through(api, monkeypatch, after_post), posted=posted)


def test_openenv_train_collects_trains_and_follows(cli, home, counter, served, policies, tmp_path, capsys):
    reset = tmp_path / "task.json"
    reset.write_text(json.dumps({"target": 4}))
    code = cli.run("train", "--environment", counter.url, "--groups", "1", "--group-size", "3", "--seed-start",
                   "100", "--max-steps", "2", "--concurrency", "3", "--capacity-wait-seconds", "5",
                   "--reset-options", str(reset), "--output-adapter", "counter-agent", "--lora-rank", "2",
                   "--auto-load", "false", "--output", str(tmp_path / "c.jsonl"),
                   "--replay-output", str(tmp_path / "c.replay.json"), "--summary-output", str(tmp_path / "c.summary.json"))
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert code == 0, (out, captured.err)
    [body] = cli.posted
    assert body["kind"] == "train" and body["environment_urls"] == [counter.url]
    assert body["training_config"] == {"lora_rank": 2, "lora_alpha": 4} and body["auto_load"] is False
    assert body["idempotency_key"].startswith("cli:") and body["reset_options"] == {"target": 4}
    run = OpenEnvRun.objects.get()
    assert out[0].startswith(f"run {run.id} ")
    assert out[1].startswith(f"contract  {run.training_contract_sha256}: rank 2, muon, output counter-agent")
    final = [line for line in out if line.startswith("completed")]
    assert final and "groups 1/1 · rollouts 3/3 · return mean" in final[-1]
    assert "trainer completed 100%" in final[-1]
    assert any(line.startswith("adapter   counter-agent (training job") for line in out)
    assert run.state == "completed" and Job.objects.get(id=run.training_job_id).state == "completed"

    # the collected episodes were copied as `kiln openenv rollout` writes them, and verify offline
    from openenv.verify import verify

    assert f"episodes  {tmp_path / 'c.jsonl'} (sha256:" in captured.out
    assert (f"verify    kiln openenv verify --summary {tmp_path / 'c.summary.json'} --dataset {tmp_path / 'c.jsonl'} "
            f"--replay {tmp_path / 'c.replay.json'}") in out
    report = verify(tmp_path / "c.summary.json", dataset_path=tmp_path / "c.jsonl",
                    replay_path=tmp_path / "c.replay.json").report
    assert report["groups"] == 1 and report["rollouts"] == 3
    published = {a["kind"]: a["sha256"] for a in run.artifacts}
    assert report["dataset_sha256"] == published["dataset"]
    assert not list(tmp_path.glob(".*.part"))  # no partial download left behind

    # --json prints the final status; a flag the spec rejects fails with the server's code.
    assert cli.run("status", str(run.id), "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["training"]["adapter_name"] == "counter-agent"
    assert [a["kind"] for a in status["artifacts"]][-2:] == ["train_receipt", "adapter_manifest"]
    assert cli.run("train", "--environment", counter.url, "--output-adapter", "counter-agent", "--json") == 1
    assert "adapter_revision_conflict" in capsys.readouterr().err


def test_train_refuses_unusable_copies_before_it_submits(cli, home, counter, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    same = str(tmp_path / "x.jsonl")
    assert cli.run("train", "--environment", counter.url, "--output-adapter", "a", "--output", same,
                   "--summary-output", same) == 1
    assert "openenv_invalid_request" in capsys.readouterr().err
    assert cli.run("train", "--environment", counter.url, "--output-adapter", "a", "--replay-output", "/dev/null") == 1
    assert "output_not_a_file" in capsys.readouterr().err
    assert cli.posted == [] and not OpenEnvRun.objects.exists() and not (tmp_path / "x.jsonl").exists()


def _request(*flags: str) -> dict:
    from kiln_project.cli.main import build_parser
    from kiln_project.cli.openenv_train_request import train_request

    args = build_parser().parse_args(["openenv", "train", "--environment", "http://127.0.0.1:8990",
                                      "--output-adapter", "counter-agent", *flags])
    return train_request(args)


def test_the_environment_evaluation_flags_build_the_requests_block():
    assert "environment_eval" not in _request()
    assert _request("--eval-groups", "30")["environment_eval"] == {"groups": 30, "group_size": 1}
    gated = _request("--eval-groups", "40", "--eval-group-size", "4", "--eval-seed-start", "1000",
                     "--gate-min-mean-improvement", "0.1", "--gate-min-mean-return", "-0.5")
    assert gated["environment_eval"] == {"groups": 40, "group_size": 4, "seed_start": 1000,
                                         "gate": {"min_mean_improvement": 0.1, "min_mean_return": -0.5}}
    # --gate alone: the guide's 20 groups of one, the gate's default thresholds.
    assert _request("--gate")["environment_eval"] == {"groups": 20, "group_size": 1, "gate": {}}


def test_the_post_eval_flags_build_the_requests_block():
    from kiln_project.cli.client import CliError

    assert "post_eval" not in _request()
    assert _request("--post-eval-suite", "sums")["post_eval"] == {"suite": "sums"}
    gated = _request("--post-eval-suite", "sums", "--post-eval-min-accuracy", "0.6", "--post-eval-scope", "held-out")
    assert gated["post_eval"] == {"suite": "sums", "min_accuracy": 0.6, "data_scope": "held-out"}
    with pytest.raises(CliError) as refused:
        _request("--post-eval-min-accuracy", "0.6")
    assert refused.value.code == "training_invalid_request" and "--post-eval-suite" in refused.value.message


def test_follow_shows_the_evaluations_side_then_its_decision_with_p_and_counts():
    from kiln_project.cli.openenv_run_text import progress_line

    status = {"state": "environment_evaluating", "stage": "environment_evaluation",
              "progress": {"groups_completed": 2, "groups_total": 2, "rollouts_completed": 4, "rollouts_total": 4},
              "environment_evaluation": {"state": "collecting_candidate",
                                         "progress": {"side": "candidate", "groups_completed": 7, "groups_total": 20}}}
    assert progress_line(status).endswith(" · env eval collecting_candidate candidate 7/20 groups")
    status["environment_evaluation"] = {
        "state": "completed", "outcome": "promoted",
        "evidence": {"decision": "passed", "baseline_mean_return": 0.1875, "candidate_mean_return": 1.175,
                     "improved_groups": 29, "regressed_groups": 2, "tied_groups": 9,
                     "exact_sign_test_p_value": 4.62867e-07}}
    assert progress_line(status).endswith(" · env eval passed: return 0.1875 -> 1.175, improved 29 regressed 2 "
                                          "tied 9, p 4.629e-07 · promoted")


def test_credential_env_names_the_servers_entry_for_that_variable_and_origin():
    from kiln_project.cli.client import CliError
    from kiln_project.cli.openenv_train_request import handles_for_variables

    table = {"team": {"origin": "http://127.0.0.1:8990", "bearer_token_env": "PTOK"},
             "other": {"origin": "http://127.0.0.1:8991", "bearer_token_env": "PTOK"}}
    urls = ["http://127.0.0.1:8990/", "http://127.0.0.1:8991", "http://127.0.0.1:8992"]
    assert handles_for_variables(urls, ["PTOK", "PTOK", "-"], table) == ["team", "other", None]
    with pytest.raises(CliError) as missing:  # no entry reads that variable for that origin
        handles_for_variables(urls[:1], ["OTHER_VAR"], table)
    assert missing.value.code == "openenv_credential_not_found"
    assert "$OTHER_VAR" in missing.value.message and 'bearer_token_env = "OTHER_VAR"' in missing.value.hint
    with pytest.raises(CliError) as misaligned:
        handles_for_variables(urls, ["PTOK"], table)
    assert misaligned.value.code == "openenv_credential_invalid"
    from kiln_project.cli.main import build_parser
    from kiln_project.cli.openenv_train_request import train_request

    args = build_parser().parse_args(["openenv", "train", "--environment", urls[0], "--credential-env", "PTOK",
                                      "--output-adapter", "counter-agent"])
    assert train_request(args, table)["credential_ids"] == ["team"]  # the handle, never the variable or token


def test_credential_env_without_a_server_entry_fails_before_submitting(cli, home, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.run("train", "--environment", "http://127.0.0.1:8990", "--credential-env", "PTOK",
                   "--output-adapter", "a") == 1
    err = capsys.readouterr().err
    assert "openenv_credential_not_found" in err and "$PTOK" in err
    assert cli.posted == [] and not OpenEnvRun.objects.exists()
