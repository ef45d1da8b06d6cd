"""Reads about OpenEnv runs: the `kiln.openenv-run.v5` status document, the list, the run directory.

The status is built from the row: `admission.queue_position` only while a run waits, the
artifacts manifest with each download URL, `rollout_stats` (the published summary's `stats`) once
the artifacts are out, `warnings` (from publication on: most episodes ending at a refused action,
openenv.collector.diagnosis; a train run adds the selection's), and `failure`
(`kiln.openenv-run-failure.v1`) when the run failed. A train
run adds its sealed `training_contract` (and digest) and `training_selection`, and
once submitted `training_job_id`, `training_submission`, `training` (the job's live state) and
`post_evaluations`, and with `environment_eval` the `environment_evaluation` block (state
pending|collecting_baseline|collecting_candidate|completed|failed|cancelled, the plan, both sides'
adapters and revisions, progress, then both sides' stats, the gate's evidence with the exact p
and counts, the outcome, the verdict and the receipt's digest) and `environment_eval_job_id`. `run.json`
holds the same document without the volatile queue position (services.run_record_write).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from django.conf import settings

from openenv.models import OpenEnvRun, RunState

RUN_SCHEMA = "kiln.openenv-run.v5"
LIST_SCHEMA = "kiln.openenv-run-list.v5"
RUN_FILE = "run.json"
ARTIFACT_FILES = {"dataset": "rollouts.jsonl", "replay": "replay.json", "summary": "summary.json",
                  "train_receipt": "train_receipt.json", "adapter_manifest": "adapter_manifest.json"}
ARTIFACT_KINDS = (
    "dataset", "replay", "summary", "train_receipt", "adapter_manifest",
    *(f"environment_eval_{side}_{what}" for side in ("baseline", "candidate") for what in ("dataset", "replay",
                                                                                         "summary")),
    "environment_eval_receipt",
)


def runs_root() -> Path:
    """`<adapter_dir>/.openenv/runs/` (reference-spec §2.8)."""
    return settings.KILN.layout.adapters / ".openenv" / "runs"


def run_dir_for(run: OpenEnvRun) -> Path:
    return runs_root() / str(run.id)


def run_get(*, run_id: str) -> OpenEnvRun | None:
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return OpenEnvRun.objects.select_related("job", "training_job", "environment_eval_job").filter(id=key).first()


def run_list(*, limit: int = 200, before: int | None = None):
    """The newest runs first; `before` (a sequence) pages past the ones already shown."""
    runs = OpenEnvRun.objects.select_related("job", "training_job", "environment_eval_job").order_by("-sequence")
    if before is not None:
        runs = runs.filter(sequence__lt=before)
    return runs[:limit]


def queue_position(run: OpenEnvRun) -> int | None:
    if run.state != RunState.QUEUED or run.admitted_at is not None:
        return None
    return OpenEnvRun.objects.filter(state=RunState.QUEUED, admitted_at__isnull=True,
                                     sequence__lt=run.sequence).count() + 1


def _ms(moment) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def artifact_url(run: OpenEnvRun, kind: str) -> str:
    return f"/v1/openenv/runs/{run.id}/artifacts/{kind}"


def progress_of(run: OpenEnvRun) -> dict:
    request = run.request
    groups, size = request.get("groups", 0), request.get("group_size", 0)
    progress = {"groups_completed": 0, "groups_total": groups, "rollouts_completed": 0,
                "rollouts_total": groups * size}
    progress.update({k: v for k, v in (run.progress or {}).items() if k in progress})
    return progress


def run_record(run: OpenEnvRun, *, live: bool = False) -> dict:
    """The v5 status document; `live` adds the queue position (not persisted in run.json)."""
    admission = {"max_active_runs": settings.KILN.openenv_max_active_runs, "sequence": run.sequence}
    if live:
        position = queue_position(run)
        if position is not None:
            admission["queue_position"] = position
    if run.admitted_at is not None:
        admission["admitted_unix_ms"] = _ms(run.admitted_at)
        admission["queue_wait_ms"] = max(0, _ms(run.admitted_at) - _ms(run.submitted_at))
    out = {
        "schema": RUN_SCHEMA, "run_id": str(run.id), "kind": run.kind, "state": run.state,
        "stage": run.stage or None, "idempotency_key": run.idempotency_key, "request": run.request,
        "submitted_unix_ms": _ms(run.submitted_at), "progress": progress_of(run), "admission": admission,
        "environments": list(run.environments or []),
        "artifacts": [{"kind": a["kind"], "url": artifact_url(run, a["kind"]), "sha256": a["sha256"],
                       "bytes": a["bytes"]} for a in run.artifacts or []],
        "post_evaluations": [], "cancel_requested": run.cancel_requested,
        "job_id": str(run.job.uuid) if run.job_id and run.job else None,
    }
    if run.finished_at is not None:
        out["finished_unix_ms"] = _ms(run.finished_at)
    if run.rollout_stats is not None:
        out["rollout_stats"] = run.rollout_stats
    out["warnings"] = list(run.warnings or [])  # e.g. most episodes ended at a refused action
    if run.kind == "train":
        out.update(_training_fields(run))
    if run.failure is not None:
        out["failure"] = run.failure
        out["error"] = run.failure.get("message")
    elif run.error:
        out["error"] = run.error
    return out


def _post_eval_jobs(job):
    """(the `training.post_eval` wrapper, the `eval.run` job it queued), either None while absent.

    The wrapper records only the eval job's id: `linked_eval_job_ids` once done, `metrics.eval_job_id`
    while it waits on it."""
    from core.jobs.models import Job
    from training.selectors import post_eval_job

    wrapper = post_eval_job(job)
    if wrapper is None:
        return None, None
    linked = (wrapper.result or {}).get("linked_eval_job_ids") or [(wrapper.metrics or {}).get("eval_job_id")]
    return wrapper, Job.objects.filter(uuid=linked[0], deleted_at__isnull=True).first() if linked[0] else None


def _post_evaluations(job) -> list[dict]:
    """The training job's post-evaluation as §1.6 lists it: progress, accuracy and the id to follow
    are the eval job's; the gate outcome and the verdict stay the wrapper's. Until the eval job
    exists (or once deleted) the wrapper stands in, with no examples counted."""
    wrapper, evaluation = _post_eval_jobs(job)
    if wrapper is None:
        return []
    verdict = wrapper.result or {}
    shown = evaluation or wrapper
    metrics = shown.metrics or {}
    entry = {"job_id": str(shown.uuid), "suite_name": (wrapper.payload.get("post_eval") or {}).get("suite"),
             "state": shown.state, "examples_completed": metrics.get("examples_done", 0),
             "examples_total": metrics.get("examples_total", 0), "gate_outcome": verdict.get("gate_outcome"),
             "post_eval_verdict": verdict.get("post_eval_verdict")}
    accuracy = _headline_accuracy(evaluation)
    if accuracy is not None:
        entry["headline_accuracy"] = accuracy
    failed = evaluation if evaluation is not None and evaluation.error_code else wrapper
    if failed.error_code:
        entry["error"] = {"code": failed.error_code, "message": failed.error_message}
    return [entry]


def _headline_accuracy(evaluation) -> float | None:
    """The trained adapter's accuracy once the eval job completed: its targets are [baseline?, adapter],
    so the last target's (the pooled running figure would mix in the baseline)."""
    if evaluation is None or evaluation.state != "completed":
        return None
    targets = (evaluation.result or {}).get("targets") or []
    return targets[-1].get("accuracy") if targets else (evaluation.result or {}).get("accuracy")


def _training_fields(run: OpenEnvRun) -> dict:
    """kind train: the sealed contract, the selection, the training job's live state, its post-eval."""
    out = {"training_contract": run.training_contract, "training_contract_sha256": run.training_contract_sha256 or None}
    if run.behavior_snapshot is not None:
        out["behavior_adapter_snapshot"] = {k: run.behavior_snapshot[k] for k in ("name", "content_sha256")}
    if run.training_selection is not None:
        out["training_selection"] = run.training_selection
    if run.environment_evaluation is not None:
        out["environment_evaluation"] = run.environment_evaluation
        eval_job = run.environment_eval_job
        out["environment_eval_job_id"] = str(eval_job.uuid) if eval_job is not None else None
    job = run.training_job
    if job is None:
        return out
    from training.selectors import training_status

    status = training_status(job)
    _, evaluation = _post_eval_jobs(job)  # the eval job itself is linked, not the wrapper that queued it
    training = {key: status.get(key) for key in ("job_id", "state", "progress", "current_loss", "error",
                                                 "post_eval_verdict", "gate_outcome")}
    training.update(epoch=(job.metrics or {}).get("epoch"), adapter_name=status.get("adapter_name"),
                    adapter_path=(job.result or {}).get("adapter_path"), effective_seed=status.get("effective_seed"),
                    step=(job.metrics or {}).get("step"), total_steps=(job.metrics or {}).get("total_steps"),
                    progress_message=job.progress_message or None,
                    linked_eval_job_ids=[str(evaluation.uuid)] if evaluation is not None else [],
                    training_data=run.training_data)
    out.update(training_job_id=str(job.uuid), training_submission=run.training_submission, training=training,
               post_evaluations=_post_evaluations(job))
    return out


def run_status(run: OpenEnvRun) -> dict:
    return run_record(run, live=True)


def runs_status_list(*, limit: int = 200, before: int | None = None) -> dict:
    return {"schema": LIST_SCHEMA, "runs": [run_status(run) for run in run_list(limit=limit, before=before)]}


def run_owner_ids(run_ids: list) -> dict[str, int | None]:
    """{run id: the submitting user's id (None: anonymous)} for the given runs."""
    return {str(row["id"]): row["submitted_by_id"]
            for row in OpenEnvRun.objects.filter(id__in=[r for r in run_ids if r]).values("id", "submitted_by_id")}
