"""/v1/train/*: submit GRPO training, follow it, cancel it, delete finished jobs.

Web-facing: no torch. The request is described by training.schemas and validated once, by the
torch-free contracts in core.contracts (through training.services).
"""

from __future__ import annotations

from ninja import Body, Router

from core.accounts.auth import require_permission
from core.errors import KilnError
from core.jobs import services as job_services
from core.jobs.models import TERMINAL_STATES
from training import selectors
from training.payloads import GrpoJobPayload
from training.schemas import (
    GrpoDryRun,
    GrpoQueued,
    GrpoRequest,
    JobCancelResult,
    JobDeleted,
    TaggedTraining,
    TaggedTrainingRequest,
    TrainingDetail,
    TrainingQueue,
    TrainingStatus,
)
from training.services import grpo_dry_run, grpo_submit
from training.snapshots import snapshot_discard

router = Router(tags=["training"])


def _submit(request, data: dict, route: str) -> dict:
    require_permission(request, "submit_job")
    if data.get("dry_run") is True:
        return grpo_dry_run(body=data)
    job, seed = grpo_submit(body=data, user=request.user, route=route)
    payload = GrpoJobPayload.of(job)
    ignored = list(payload.ignored_config_keys)  # accepted and ignored (spec §3), but never silently
    return {"job_id": str(job.uuid), "state": "queued", "effective_seed": str(seed),
            "message": f"GRPO training queued; it will publish adapter {payload.adapter_name}",
            "after_publication": selectors.after_publication(payload),
            "ignored_config_keys": ignored,
            "warnings": selectors.submission_warnings(job)}


@router.post("/train/grpo", summary="Queue GRPO training from scored groups", response=GrpoQueued | GrpoDryRun)
def train_grpo(request, body: GrpoRequest):
    return _submit(request, body.as_dict(), "/v1/train/grpo")


@router.post("/train/agentic", summary="Queue GRPO training (agentic alias)", response=GrpoQueued | GrpoDryRun)
def train_agentic(request, body: GrpoRequest):
    return _submit(request, body.as_dict(), "/v1/train/agentic")


@router.post("/training/grpo", summary="Queue GRPO training (compatibility alias)", include_in_schema=False,
             response=GrpoQueued | GrpoDryRun)
def training_grpo_compat(request, body: GrpoRequest):
    return _submit(request, body.as_dict(), "/v1/train/grpo")


# The spec's sibling routes on the training queue. This Kiln trains GRPO (from scored groups or
# OpenEnv episodes); SFT and on-policy distillation are declared and refused, not faked.
NOT_TRAINED_HERE = {"sft": "supervised fine-tuning (SFT)", "opd": "on-policy distillation (OPD)"}


def _not_trained_here(kind: str) -> KilnError:
    return KilnError("not_implemented", f"{NOT_TRAINED_HERE[kind]} is not implemented by this Kiln", status=501,
                     hint="this Kiln trains GRPO: POST /v1/train/grpo with scored groups (or kiln openenv train)")


@router.post("/train", summary="Queue training of the kind the body names (kind: grpo; sft and opd: 501)",
             response=TaggedTraining)
def train_tagged(request, body: TaggedTrainingRequest):
    data = body.as_dict()
    named = data.pop("kind", None)
    kind = named if isinstance(named, str) else None  # a list or an object names no kind (and is unhashable)
    if kind in ("grpo", "agentic"):
        # Recorded as /v1/train/grpo: a job's replay request is a POST its body alone answers.
        return {"picked": "grpo", "training": _submit(request, data, "/v1/train/grpo")}
    require_permission(request, "submit_job")
    if kind in NOT_TRAINED_HERE:
        raise _not_trained_here(kind)
    raise KilnError("training_invalid_request", f"kind: {named!r} is not a training kind", status=400, field="kind",
                    hint='name the kind: "grpo" (trained here), "sft" or "opd" (not implemented: 501)')


@router.post("/train/sft", summary="Queue SFT training (not implemented: 501)")
def train_sft(request, body: dict = Body(default_factory=dict)):  # noqa: B008
    require_permission(request, "submit_job")
    raise _not_trained_here("sft")


@router.post("/train/opd", summary="Queue on-policy distillation (not implemented: 501)")
def train_opd(request, body: dict = Body(default_factory=dict)):  # noqa: B008
    require_permission(request, "submit_job")
    raise _not_trained_here("opd")


def _job_or_404(job_id: str):
    job = selectors.training_job_get(job_id=job_id)
    if job is None:
        raise KilnError("training_job_not_found", f"no training job with id {job_id!r}", status=404,
                        hint="list training jobs with GET /v1/train/status")
    return job


def _lifecycle(status: dict) -> dict:
    """A training job's API lifecycle is queued → running → completed | failed: a cancelled one is
    `failed` with its cancellation as the error (reference-spec §5; the guide's wait loop ends on
    completed or failed). The generic job routes and the pages keep the job's own `cancelled`."""
    if status["state"] != "cancelled":
        return status
    error = status.get("error") or {"code": "job_cancelled", "message": "cancelled on request"}
    return {**status, "state": "failed", "error": error}


@router.get("/train/status", summary="Status of every training job, newest first", response=list[TrainingStatus])
def train_status(request):
    return [_lifecycle(selectors.training_status(job)) for job in selectors.training_jobs()[:200]]


@router.get("/train/status/{job_id}", summary="Status of one training job", response=TrainingStatus)
def train_status_one(request, job_id: str):
    return _lifecycle(selectors.training_status(_job_or_404(job_id)))


@router.get("/train/jobs/{job_id}", summary="Training job detail: loss history, adapter, receipt, checkpoint",
            response=TrainingDetail)
def train_job_detail(request, job_id: str):
    return _lifecycle(selectors.training_detail(_job_or_404(job_id)))


@router.delete("/train/jobs/{job_id}", summary="Delete a finished training job (its events are kept)",
               response=JobDeleted)
def train_job_delete(request, job_id: str):
    require_permission(request, "submit_job")
    job = job_services.job_delete(job=_job_or_404(job_id), user=request.user,
                                  not_finished_code="training_job_already_started",
                                  not_found_code="training_job_not_found",
                                  cancel_how=f"kiln train cancel {job_id}, or DELETE /v1/train/queue/{job_id}")
    return {"job_id": job_id, "status": "deleted", "removed_archive_file": snapshot_discard(job)}


@router.get("/train/queue", summary="The training queue: running, queued in order, recently finished",
            response=TrainingQueue)
def train_queue(request):
    return selectors.training_queue()


@router.delete("/train/queue/{job_id}", summary="Cancel a queued or running training job", response=JobCancelResult,
               exclude_unset=True)
def train_cancel(request, job_id: str):
    require_permission(request, "submit_job")
    job = _job_or_404(job_id)
    if job.state in TERMINAL_STATES:
        raise KilnError("training_job_not_cancellable", f"job {job_id} is already {job.state}", status=409,
                        hint="only queued and running jobs can be cancelled; see its outcome with GET "
                             f"/v1/train/jobs/{job_id}")
    job = job_services.job_cancel(job=job, user=request.user)
    if job.state == "running":
        return {"status": "cancelling", "job_id": job_id,
                "message": "the job stops at the next group boundary and publishes a checkpoint"}
    return {"status": "cancelled", "job_id": job_id}
