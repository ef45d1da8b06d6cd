"""`kiln openenv start|runs|status|artifact|cancel` against the real routes, through an httpx transport
that hands each request to Django's test client (and, after a POST when asked, runs the control
queue in process), with a real openenv==0.10.0 server and the deterministic fake policy."""

from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path

import pytest

from core.jobs.runner import run_queued_jobs
from openenv.models import OpenEnvRun
from tests.openenv.runs.conftest import cli_through, rollout_body

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(600)]


@pytest.fixture
def cli(api, monkeypatch):
    """main([...]) with KilnClient talking to this test's Django through `api`; after a POST the control
    queue runs in process unless `cli.execute` is set false."""
    bridge = types.SimpleNamespace(execute=True)

    def after_post(request):
        if bridge.execute:
            run_queued_jobs("control")

    bridge.run = cli_through(api, monkeypatch, after_post)
    return bridge


def test_start_follow_status_runs_and_artifact(cli, home, counter, policies, tmp_path, capsys):
    request = tmp_path / "openenv-run.json"
    request.write_text(json.dumps(rollout_body(counter.url, idempotency_key="cli:1")))
    assert cli.run("start", "--request", str(request), "--follow") == 0
    out = capsys.readouterr().out.splitlines()
    run_id = out[0].split()[1]
    assert out[0].startswith(f"run {run_id} discovering (sequence 1)")
    assert out[-1].startswith("rollout_ready (artifact_publication) · groups 2/2 · rollouts 4/4 · return mean ")
    stats = OpenEnvRun.objects.get(id=run_id).rollout_stats
    assert f"[{stats['min_episode_return']:.4g}, {stats['max_episode_return']:.4g}]" in out[-1]

    # An exact retry answers the same run.
    assert cli.run("start", "--request", str(request), "--json") == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == run_id
    assert OpenEnvRun.objects.count() == 1

    assert cli.run("status", run_id) == 0
    text = capsys.readouterr().out
    assert f"run       {run_id}  (rollout, sequence 1)" in text and "artifact  dataset" in text
    # what the guide says status exposes: the mean and range, outcomes, recoveries, capacity retries,
    # steps, policy tokens and latency
    assert (f"return    mean {stats['mean_episode_return']:.4g}, range [{stats['min_episode_return']:.4g}, "
            f"{stats['max_episode_return']:.4g}]") in text
    assert (f"outcomes  done 4, max_steps 0, invalid 0, protocol 0; recoveries "
            f"{stats['recoverable_protocol_error_count']}, capacity retries {stats['capacity_retry_count']}; "
            f"{stats['total_environment_steps']} steps, {stats['total_model_tokens']} policy tokens, mean policy "
            f"latency {stats['mean_model_latency_ms']:.0f} ms") in text
    assert cli.run("status", run_id, "--json", "--follow") == 0
    assert json.loads(capsys.readouterr().out)["state"] == "rollout_ready"
    assert cli.run("runs") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["RUN", "KIND", "STATE", "SEQ", "ROLLOUTS", "MEAN_RETURN"]
    assert table[1].split()[:5] == [run_id, "rollout", "rollout_ready", "1", "4/4"]

    output = tmp_path / "rollouts.jsonl"
    assert cli.run("artifact", run_id, "dataset", "--output", str(output), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    data = output.read_bytes()
    assert report == {"schema": "kiln.openenv-artifact-download.v1", "run_id": run_id, "kind": "dataset",
                      "source_url": f"/v1/openenv/runs/{run_id}/artifacts/dataset", "output_path": str(output),
                      "sha256": "sha256:" + hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert data == (home / "adapters" / ".openenv" / "runs" / run_id / "rollouts.jsonl").read_bytes()
    # --output - is standard output (QA: it wrote a file named "-"), the report on standard error
    assert cli.run("artifact", run_id, "dataset", "--output", "-") == 0
    streamed = capsys.readouterr()
    assert streamed.out.encode() == data and f"wrote {len(data)} bytes to standard output" in streamed.err
    assert not (Path.cwd() / "-").exists()
    # An existing output needs --force; a tampered artifact is refused with the server's code.
    assert cli.run("artifact", run_id, "dataset", "--output", str(output)) == 1
    assert "error: openenv_artifact_output_exists" in capsys.readouterr().err
    (home / "adapters" / ".openenv" / "runs" / run_id / "summary.json").write_text("{}\n")
    assert cli.run("artifact", run_id, "summary", "--output", str(tmp_path / "s.json")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: openenv_artifact_integrity_failed: ")
    assert not (tmp_path / "s.json").exists()
    assert cli.run("cancel", run_id) == 1
    assert capsys.readouterr().err.startswith("error: openenv_run_not_cancellable: ")


def test_cancel_a_queued_run_and_errors_are_one_line(cli, home, policies, bounds, tmp_path, capsys):
    bounds(max_active_runs=1)
    cli.execute = False
    request = tmp_path / "r.json"
    request.write_text(json.dumps(rollout_body("http://127.0.0.1:9")))
    assert cli.run("start", "--request", str(request), "--json") == 0
    first = json.loads(capsys.readouterr().out)
    assert cli.run("start", "--request", str(request), "--json") == 0
    second = json.loads(capsys.readouterr().out)
    assert (first["state"], second["state"], second["admission"]["queue_position"]) == ("discovering", "queued", 1)
    assert cli.run("cancel", second["run_id"]) == 0
    assert "state     cancelled (admission)" in capsys.readouterr().out
    request.write_text(json.dumps(rollout_body("http://127.0.0.1:9", surprise=True)))
    assert cli.run("start", "--request", str(request)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: openenv_invalid_request: request: surprise: unknown field (hint: the request takes "
                   "only: " + err[0].split("only: ", 1)[1]]
    assert cli.run("status", "00000000-0000-0000-0000-000000000000") == 1
    assert capsys.readouterr().err.startswith("error: openenv_run_not_found: ")
    assert cli.run("artifact", first["run_id"], "dataset", "--output", str(tmp_path / "d.jsonl")) == 1
    assert capsys.readouterr().err.startswith("error: openenv_artifact_not_ready: ")


def test_artifact_help_names_every_kind_the_server_serves(capsys):
    import itertools
    import re

    from kiln_project.cli.main import main
    from openenv.runs.selectors import ARTIFACT_KINDS

    with pytest.raises(SystemExit):
        main(["openenv", "artifact", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    named = set(re.findall(r"\b[a-z_]+(?:_receipt|_manifest)\b|\b(?:dataset|replay|summary)\b", text))
    for braces in re.findall(r"environment_eval_\{[^}]+\}_\{[^}]+\}", text):  # environment_eval_{a,b}_{c,d}
        sides, whats = (part.split(",") for part in re.findall(r"\{([^}]+)\}", braces))
        named |= {f"environment_eval_{side}_{what}" for side, what in itertools.product(sides, whats)}
    assert set(ARTIFACT_KINDS) <= named


def test_status_lines_up_the_artifacts_whatever_their_kinds_lengths(capsys):
    """A train run's artifacts (`environment_eval_baseline_dataset`, ...) are longer than the
    collection's: sizes and hashes still start in one column."""
    from types import SimpleNamespace

    from kiln_project.cli.openenv_runs_cmd import _show

    kinds = ["dataset", "train_receipt", "environment_eval_baseline_dataset"]
    status = {"run_id": "r", "kind": "train", "admission": {"sequence": 3}, "state": "completed",
              "stage": "environment_evaluation",
              "artifacts": [{"kind": kind, "bytes": 10 ** i, "sha256": f"sha256:{i:064d}"} for i, kind in enumerate(kinds)]}
    assert _show(status, SimpleNamespace(json=False)) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("artifact  ")]
    assert [line.split()[1] for line in lines] == kinds
    assert len({line.index(" B  sha256:") for line in lines}) == 1
