"""A train run's `post_evaluations` (reference-spec §1.6) follow the eval job the post-eval wrapper queued:
its id, state, examples and accuracy; the gate outcome and verdict stay the wrapper's."""

from __future__ import annotations

import types

import pytest

from core.jobs.models import Job
from kiln_project.cli.openenv_runs_cmd import _show
from openenv.runs.selectors import _post_evaluations

pytestmark = pytest.mark.django_db


def _jobs(*, eval_state="running", eval_metrics=None, eval_result=None, wrapper_result=None):
    evaluation = Job.objects.create(kind="eval.run", queue="infer", state=eval_state, metrics=eval_metrics or {},
                                    result=eval_result or {})
    wrapper = Job.objects.create(kind="training.post_eval", queue="control", state="running",
                                 payload={"post_eval": {"suite": "sums-check"}},
                                 metrics={"eval_job_id": str(evaluation.uuid)}, result=wrapper_result or {})
    training = Job.objects.create(kind="training.grpo", queue="gpu", state="completed",
                                  result={"post_eval_job_id": str(wrapper.uuid)})
    return training, wrapper, evaluation


def test_a_running_post_eval_shows_the_eval_jobs_id_and_progress():
    training, wrapper, evaluation = _jobs(eval_metrics={"examples_done": 3, "examples_total": 8, "accuracy": 0.5})
    [entry] = _post_evaluations(training)
    assert entry["job_id"] == str(evaluation.uuid) != str(wrapper.uuid)
    assert (entry["state"], entry["examples_completed"], entry["examples_total"]) == ("running", 3, 8)
    assert entry["suite_name"] == "sums-check"
    assert "headline_accuracy" not in entry  # the pooled running figure mixes in the baseline


def test_a_completed_post_eval_shows_the_adapters_accuracy_and_the_wrappers_verdict():
    training, _, evaluation = _jobs(
        eval_state="completed", eval_metrics={"examples_done": 8, "examples_total": 8, "accuracy": 0.5},
        eval_result={"accuracy": 0.5, "targets": [{"label": "base", "accuracy": 0.25},
                                                   {"label": "counter-agent", "accuracy": 0.75}]},
        wrapper_result={"gate_outcome": "promoted", "post_eval_verdict": "sums-check: ...",
                        "linked_eval_job_ids": []})
    [entry] = _post_evaluations(training)
    assert entry["job_id"] == str(evaluation.uuid)
    assert (entry["examples_completed"], entry["examples_total"], entry["headline_accuracy"]) == (8, 8, 0.75)
    assert (entry["gate_outcome"], entry["post_eval_verdict"]) == ("promoted", "sums-check: ...")


def test_before_the_eval_job_exists_the_wrapper_stands_in():
    wrapper = Job.objects.create(kind="training.post_eval", queue="control", state="queued",
                                 payload={"post_eval": {"suite": "sums-check"}})
    training = Job.objects.create(kind="training.grpo", queue="gpu", result={"post_eval_job_id": str(wrapper.uuid)})
    [entry] = _post_evaluations(training)
    assert (entry["job_id"], entry["state"], entry["examples_completed"]) == (str(wrapper.uuid), "queued", 0)


def test_status_text_has_a_post_eval_line(capsys):
    status = {"run_id": "r1", "kind": "train", "state": "post_evaluating", "stage": "post_evaluation",
              "admission": {"sequence": 4}, "progress": {},
              "post_evaluations": [{"job_id": "e1", "suite_name": "sums-check", "state": "completed",
                                    "examples_completed": 8, "examples_total": 8, "headline_accuracy": 0.75,
                                    "gate_outcome": "promoted"}]}
    assert _show(status, types.SimpleNamespace(json=False)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "post-eval sums-check job e1: completed 8/8 examples · accuracy 0.75 · gate promoted" in lines


def test_the_training_block_links_the_eval_job_not_the_wrapper():
    from openenv.runs.selectors import _training_fields

    training, wrapper, evaluation = _jobs(wrapper_result={"linked_eval_job_ids": []})
    Job.objects.filter(id=wrapper.id).update(result={"linked_eval_job_ids": [str(evaluation.uuid)]})
    Job.objects.filter(id=training.id).update(payload={
        "route": "/v1/train/grpo", "adapter_name": "lnk", "snapshot_path": "/nonexistent",
        "config": {"seed": "1", "output_name": "lnk"}, "training_data": {"source": "inline"}})
    training.refresh_from_db()
    run = types.SimpleNamespace(training_job=training, training_contract=None, training_contract_sha256="",
                                behavior_snapshot=None, training_selection=None, environment_evaluation=None,
                                training_submission=None, training_data=None)
    fields = _training_fields(run)
    assert fields["training"]["linked_eval_job_ids"] == [str(evaluation.uuid)]
    assert [p["job_id"] for p in fields["post_evaluations"]] == [str(evaluation.uuid)]
