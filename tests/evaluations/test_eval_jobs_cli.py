"""`kiln eval run|compare|status|rerun|replay` against the real API in process (the CLI's HTTP client
routed into Django's test client), with the fake model service of test_eval_jobs_api; `--follow`
runs the control queue in process before it polls."""

from __future__ import annotations

import json

import pytest

from core.jobs.runner import run_queued_jobs
from kiln_project.cli import eval_cmd
from tests.evaluations import dataset_support, test_eval_jobs_api
from tests.evaluations.dataset_support import ok, send
from tests.evaluations.test_eval_cli import kiln  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db
api, home = dataset_support.api, dataset_support.home
gpu_worker, model = test_eval_jobs_api.gpu_worker, test_eval_jobs_api.model


@pytest.fixture
def suite(api, home):
    return ok(send(api, "post", "/v1/eval/suites", {"name": "sums", "scorer": {"type": "exact"},
                                                     "examples": test_eval_jobs_api.EXAMPLES}))


@pytest.fixture
def drained(monkeypatch):
    original = eval_cmd.follow

    def follow(fetch, label, **kwargs):
        run_queued_jobs("control")
        return original(fetch, label, poll_seconds=0.01)

    monkeypatch.setattr(eval_cmd, "follow", follow)


def test_run_follow_status_rerun_and_replay(kiln, suite, model, drained):  # noqa: F811
    code, out, err = kiln("eval", "run", "--suite", "sums", "--seed", "5", "--max-tokens", "16", "--follow")
    assert code == 0, err
    assert "100.0% completed" in err  # the progress line (not a terminal: one line per change)
    assert "base" in out and "pass 3  fail 2  invalid 0  error 0  accuracy 0.6000" in out
    job_id = out.split()[3]
    code, out, _ = kiln("eval", "status", "--json")
    assert code == 0 and json.loads(out)[0]["job_id"] == job_id
    code, out, _ = kiln("eval", "status")
    assert code == 0 and job_id in out and "0.6000" in out
    code, out, _ = kiln("eval", "status", job_id, "--json")
    assert code == 0 and len(json.loads(out)["examples"]) == 5
    code, out, _ = kiln("eval", "rerun", job_id)
    assert code == 0 and out.startswith("queued eval rerun ")
    code, out, err = kiln("eval", "replay", job_id, "--follow")
    assert code == 0, err
    assert f"replay of {job_id}: matched" in out
    model.drift = "2 + 2"
    code, out, err = kiln("eval", "replay", job_id, "--follow")
    assert code == 1 and "replay of" in out and "mismatch at example q2" in out
    assert err.splitlines()[-1].startswith("error: replay_mismatch: ")


def test_compare_and_errors(kiln, suite, model, drained):  # noqa: F811
    code, out, err = kiln("eval", "compare", "--suite", "sums", "--adapter", "base", "--adapter", "base", "--json",
                          "--follow")
    assert code == 0, err
    result = json.loads(out[out.index("{"):])
    assert [row["outcomes"][0] == row["outcomes"][1] for row in result["table"]] == [True] * 5
    # The list shows each target's accuracy, not one pooled figure.
    per_target = [t["accuracy"] for t in result["targets"]]
    code, out, err = kiln("eval", "status")
    [line] = [line for line in out.splitlines() if line.startswith(result["job_id"])]
    assert code == 0 and "/".join(f"{a:.4f}" for a in per_target) in line
    code, out, err = kiln("eval", "run", "--suite", "missing")
    assert code == 1 and out == "" and err.startswith("error: eval_suite_not_found: ")
    code, out, err = kiln("eval", "run", "--suite", "sums", "--temperature", "9")
    assert code == 1 and "generation.temperature" in err
    code, out, err = kiln("eval", "status", "00000000-0000-0000-0000-000000000000")
    assert code == 1 and err.startswith("error: eval_job_not_found: ")
