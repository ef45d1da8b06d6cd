"""Train on a completed rollout generation job's output: a recorded-policy GRPO submission.

`training.services.grpo_submit` decides everything about it; this only checks that the job
generated rollouts, finished, and still has its published file.
"""

from __future__ import annotations

from core.errors import KilnError
from core.jobs.models import JobState
from evaluations.payloads import RolloutsJobPayload
from evaluations.rollout_selectors import ROLLOUTS_FILE, is_rollouts_job, rollout_file
from evaluations.rollout_services import ROUTE


def rollouts_train_submit(*, job, output_name: str, user=None, route: str = ROUTE):
    """Queue recorded-policy GRPO training on a completed generation job's rollouts; returns the training job."""
    from training.services import grpo_submit

    if not is_rollouts_job(job):
        raise KilnError("rollouts_not_found", "this job did not generate rollouts", status=404)
    if job.state != JobState.COMPLETED:
        raise KilnError("rollouts_not_ready", f"the generation job is {job.state}; only a completed job's rollouts "
                        "can be trained on", status=409)
    path = rollout_file(job=job, name=ROLLOUTS_FILE)
    if path is None:
        raise KilnError("rollouts_missing", f"the published {ROLLOUTS_FILE} of job {job.uuid} is gone", status=409,
                        hint="generate the rollouts again")
    output_name = (output_name or "").strip() if isinstance(output_name, str) else ""
    if not output_name:
        raise KilnError("training_invalid_request", "output_name: name the adapter this training publishes",
                        status=400, field="config.output_name", hint="a new versioned name every round, e.g. math-r001")
    config = {"behavior_policy": "recorded", "output_name": output_name, "auto_load": False}
    adapter = RolloutsJobPayload.of(job).adapter
    if adapter != "base":
        config["base_adapter"] = adapter
    training_job, _seed = grpo_submit(body={"dataset_path": str(path), "config": config}, user=user, route=route)
    return training_job
