"""Read-side views of GRPO jobs: status, detail, queue, in the shapes the reference API uses."""

from __future__ import annotations

import json
from pathlib import Path

from django.utils import timezone

from adapters.models import Adapter, AdapterStatus, AdapterTransition, PromotionState
from adapters.selectors import adapter_promotion
from core.artifacts import CHECKPOINT_MANIFEST
from core.canonical import sha256_digest
from core.jobs.error_hints import job_error
from core.jobs.models import Job, JobState
from training.payloads import GrpoJobPayload

TRAINING_KINDS = ("training.grpo",)


def training_jobs():
    return Job.objects.filter(kind__in=TRAINING_KINDS, deleted_at__isnull=True).order_by("-id")


def training_job_get(*, job_id: str) -> Job | None:
    from core.jobs.selectors import job_get

    job = job_get(job_id=job_id)
    return job if job is not None and job.kind in TRAINING_KINDS else None


def _unix_ms(moment) -> int | None:
    return int(moment.timestamp() * 1000) if moment else None


def post_eval_job(job: Job) -> Job | None:
    """The post-eval of a training job, if it was queued (see training.post_eval_jobs)."""
    job_id = (job.result or {}).get("post_eval_job_id")
    return Job.objects.filter(uuid=job_id).first() if job_id else None


def _post_eval_result(job: Job) -> dict:
    evaluation = post_eval_job(job)
    return (evaluation.result or {}) if evaluation else {}


def post_eval_state(job: Job) -> dict:
    """Training completion, evaluation and activation: three recorded states, each with its time."""
    evaluation = post_eval_job(job)
    result = (evaluation.result or {}) if evaluation else {}
    gate = _gate_fields(job)  # a post-eval job that died before its gate decided: outcome `error`, as gate_outcome says
    adapter = Adapter.objects.filter(training_job=job).first()
    return {
        "training": {"state": job.state, "at": job.finished_at},
        "evaluation": None if evaluation is None else {
            # job_id: the post-eval job (GET /v1/jobs/{id}); eval_job_id: the evaluation it queued, the
            # one GET /v1/eval/jobs/{id} answers (null until it is queued, and once it is deleted)
            "job_id": str(evaluation.uuid), "eval_job_id": next(iter(_linked_eval_job_ids(job)), None),
            "state": evaluation.state, "outcome": gate["gate_outcome"],
            "at": evaluation.finished_at, "error": evaluation.error_code or None,
            # why a gate ended `error` (its evaluation could not be queued, its job was killed)
            "reason": gate["post_eval_verdict"] if gate["gate_outcome"] == "error" else None},
        "activation": _activation_state(job, adapter, result),
    }


def _activation_state(job: Job, adapter, post_eval_result: dict) -> dict:
    """Whether the adapter serves now, and what decides it: the post-eval's inline canary, an auto_load
    activation job (its canary), or a promotion (a reviewer's approval, `kiln adapters activate`) whose
    activation job made this adapter revision active."""
    result = job.result or {}
    promotion_id = result.get("promotion_id") or post_eval_result.get("promotion_id")
    promotion = adapter_promotion(adapter=adapter, promotion_id=promotion_id)
    if promotion is not None:
        promotion_id = promotion.id
    activation_job_id = result.get("activation_job_id") or (
        str(promotion.activation_job.uuid) if promotion is not None and promotion.activation_job else None)
    activation_job = Job.objects.filter(uuid=activation_job_id).first() if activation_job_id else None
    at = post_eval_result.get("activated_at")
    if at is None and activation_job is not None and (activation_job.result or {}).get("activated"):
        at = activation_job.finished_at
    # Replaced or unloaded since: when it stopped serving (its `at` stays the time it was activated).
    deactivated_at = None
    if adapter is not None and not adapter.loaded and at is not None:
        last = (AdapterTransition.objects.filter(adapter=adapter.name, from_state=AdapterStatus.ACTIVE)
                .order_by("-at", "-id").first())
        deactivated_at = last.at if last is not None else None
    return {"active": bool(adapter and adapter.loaded), "at": at, "deactivated_at": deactivated_at,
            "demoted_to": post_eval_result.get("demoted_to"),
            "quarantined": bool(adapter and adapter.quarantined),
            "error": post_eval_result.get("activation_error") or (
                {"code": activation_job.error_code or (activation_job.result or {}).get("code"),
                 "message": activation_job.error_message or (activation_job.result or {}).get("message")}
                if activation_job is not None and not (activation_job.result or {}).get("activated")
                and activation_job.state in ("completed", "failed", "cancelled") else None),
            "activation_job_id": activation_job_id,
            "promotion_id": promotion_id}


def _gate_fields(job: Job) -> dict:
    evaluation = post_eval_job(job)
    result = (evaluation.result or {}) if evaluation else {}
    fields = {"gate_outcome": result.get("gate_outcome"), "post_eval_verdict": result.get("post_eval_verdict"),
              "post_eval_gate_evidence": result.get("post_eval_gate_evidence", [])}
    if evaluation is not None and evaluation.state in ("queued", "running"):
        fields["post_eval_verdict"] = "post-eval pending: the adapter stays inactive until the gate decides"
    elif evaluation is not None and evaluation.state in ("failed", "cancelled") and not fields["gate_outcome"]:
        # the post-eval job died before its gate decided (its worker killed, cancelled): that is the
        # gate's `error` outcome, not a decision still to come
        fields["gate_outcome"] = "error"
        fields["post_eval_verdict"] = (f"the post-training evaluation ended {evaluation.state} before the gate decided "
                                       f"({evaluation.error_code or 'no code'}: {evaluation.error_message or ''}); "
                                       "the adapter stays inactive")
    elif fields["gate_outcome"] == "promoted" and result.get("promotion_id") is not None:
        fields["post_eval_verdict"] = _with_promotion_state(fields["post_eval_verdict"], result["promotion_id"])
    return fields


def _with_promotion_state(verdict: str | None, promotion_id: int) -> str:
    """`promoted` is the gate's decision; with the approval policy (or an alarm) a person still decides
    whether the adapter serves, so the verdict says which promotion waits or how it was decided."""
    promotion = adapter_promotion(adapter=None, promotion_id=promotion_id)
    if promotion is None:
        return verdict or ""
    if promotion.state == PromotionState.PENDING:
        note = (f"the gate passed and proposed promotion {promotion.id}: not active until a reviewer approves it "
                f"(kiln promotions approve {promotion.id} --reason ...)")
    else:
        note = f"the gate passed; promotion {promotion.id} was {promotion.state}"
    return f"{verdict}; {note}" if verdict else note


def training_status(job: Job) -> dict:
    payload = GrpoJobPayload.of(job)
    started = job.started_at
    end = job.finished_at or timezone.now()
    error = job_error(job)
    return {
        "job_id": str(job.uuid),
        "state": job.state,
        "progress": job.progress,
        "current_loss": job.metrics.get("loss"),
        "adapter_name": payload.adapter_name,
        "started_at": started,
        "elapsed_secs": (end - started).total_seconds() if started else 0.0,
        "effective_seed": str(payload.effective_seed),
        "submitted_unix_ms": _unix_ms(job.created_at),
        "finished_unix_ms": _unix_ms(job.finished_at),
        "job_type": "grpo",
        "training_data": payload.training_data,
        "error": error,
        "cancel_requested": job.cancel_requested,
        **_gate_fields(job),
    }


def _receipt(adapter_path: str | None, job: Job, *, strict: bool) -> tuple[dict | None, str | None]:
    """(the job's train receipt, why it could not be read): the published adapter's, or the failure
    receipt a job that failed or was cancelled after admission left under training/receipts/.

    Receipt writes are not atomic (spec §2.9): one caught half-written reads as None with the reason
    (the detail's metadata_error), or raises its OSError/ValueError when `strict` (the job page says
    so instead of showing nothing)."""
    from django.conf import settings

    candidates = [(job.result or {}).get("receipt_path")] + ([str(Path(adapter_path) / "train_receipt.json")]
                                                             if adapter_path else [])
    if job.state in (JobState.FAILED, JobState.CANCELLED):
        candidates.append(str(settings.KILN.layout.failure_receipt(str(job.uuid))))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            try:
                return json.loads(Path(candidate).read_text()), None
            except (OSError, ValueError) as exc:
                if strict:
                    raise
                return None, f"{Path(candidate).name} could not be read ({type(exc).__name__}: {exc})"
    return None, None


def _latest_checkpoint(job: Job, payload: GrpoJobPayload) -> tuple[dict | None, str | None]:
    """(the spec's latest_checkpoint object for the newest checkpoint the job published, from its
    manifest (`resume_checkpoint` is the name to resume from), why it could not be read): None when
    there is none or it was pruned (checkpoint_keep_last), with a reason when its manifest is unreadable.
    A resumed job that has published none yet names the checkpoint it resumed from: resuming again
    from there is what its hint (job_interrupted, job_cancelled) tells the user to do."""
    from django.conf import settings

    from core.artifacts import describe_checkpoint

    path = (job.result or {}).get("latest_checkpoint") or job.metrics.get("latest_checkpoint")
    if not path and payload.config.resume_checkpoint:
        path = settings.KILN.layout.checkpoint(payload.config.resume_checkpoint)
    if not path or not Path(path).exists():
        return None, None
    try:
        return describe_checkpoint(Path(path)), None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"checkpoint {Path(path).name} could not be read ({type(exc).__name__}: {exc})"


def _replay_request(payload: GrpoJobPayload) -> dict | None:
    """The POST that trains this job again on the same data with its effective config (seed included):
    {route, body}. None for inline groups, which are kept only as the job's private snapshot."""
    data = payload.training_data or {}
    if data.get("source") == "dataset_path" and data.get("path"):
        source = {"dataset_path": data["path"]}
    elif data.get("source") == "named_dataset" and data.get("dataset"):
        source = {"dataset": data["dataset"], "dataset_split": data.get("split") or "train"}
    else:
        return None
    body = {**source, "config": payload.config.to_dict()}
    if payload.post_eval is not None:
        body["post_eval"] = payload.post_eval.to_dict()
    return {"route": payload.route, "body": body}


def _checkpoint_error(job: Job, receipt: dict | None) -> str | None:
    """The newest checkpoint that failed to publish (the run went on without it), live or from the receipt."""
    errors = ((receipt or {}).get("checkpoint_errors") or [])
    return errors[-1] if errors else job.metrics.get("checkpoint_error")


def _linked_eval_job_ids(job: Job) -> list[str]:
    evaluation = post_eval_job(job)
    if evaluation is None:
        return []
    linked = (evaluation.result or {}).get("linked_eval_job_ids")
    linked = linked if linked else [str(evaluation.metrics["eval_job_id"])] if evaluation.metrics.get("eval_job_id") else []
    # a deleted eval job is no longer one to follow (its id stays in the gate evidence, the record)
    kept = {str(uuid) for uuid in Job.objects.filter(uuid__in=linked, deleted_at__isnull=True)
            .values_list("uuid", flat=True)}
    return [job_id for job_id in linked if job_id in kept]


def training_detail(job: Job, *, strict_receipt: bool = False) -> dict:
    payload = GrpoJobPayload.of(job)
    adapter = Adapter.objects.filter(training_job=job).first()
    adapter_path = adapter.path if adapter and adapter.path else job.result.get("adapter_path")
    demoted_to = _post_eval_result(job).get("demoted_to")
    if adapter is None and demoted_to:  # the gate demoted it: the folder is `<name>.failed` now (§4.11)
        adapter_path = demoted_to
    receipt, receipt_error = _receipt(adapter_path, job, strict=strict_receipt)
    checkpoint, checkpoint_error = _latest_checkpoint(job, payload)
    return {
        **training_status(job),
        "epoch": job.metrics.get("epoch"),
        "adapter_path": adapter_path,
        "auto_load": payload.config.auto_load,
        "linked_eval_job_ids": _linked_eval_job_ids(job),
        "post_eval_job_id": job.result.get("post_eval_job_id"),
        "activation_job_id": job.result.get("activation_job_id"),
        "states": post_eval_state(job),
        "loss_history": job.metrics.get("loss_history", []),
        "reward_history": job.metrics.get("reward_history", []),
        "kl_history": job.metrics.get("kl_history", []),
        "train_receipt": receipt,
        "replay_request": _replay_request(payload),
        "checkpoint_error": _checkpoint_error(job, receipt),
        "metadata_error": "; ".join(e for e in (receipt_error, checkpoint_error) if e) or None,
        "latest_checkpoint": checkpoint,
        "effective_config": payload.config.to_dict(),  # built-in <- [training.defaults] <- the request
        "config_sources": payload.config_sources or None,
        "server_training_defaults": payload.server_training_defaults,
        "post_eval": payload.post_eval.to_dict() if payload.post_eval else None,
    }


def training_queue() -> dict:
    running = training_jobs().filter(state=JobState.RUNNING).first()
    queued = list(training_jobs().filter(state=JobState.QUEUED).order_by("id"))
    completed = training_jobs().filter(state__in=[JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED])[:20]
    return {
        "running": training_status(running) if running else None,
        "queued": [{"job_id": str(j.uuid), "job_type": "grpo", "adapter_name": GrpoJobPayload.of(j).adapter_name,
                    "position": i + 1} for i, j in enumerate(queued)],
        "completed": [training_status(j) for j in completed],
    }


def checkpoint_manifest_sha256(*, name: str | None) -> str | None:
    """The digest of a checkpoint's manifest file, which lists the digest of every other file: the
    queue keeps it so that the worker trains from the checkpoint admission checked, not one put in its
    place meanwhile (reference-spec §3.2). None without a checkpoint or a readable manifest."""
    from django.conf import settings

    path = settings.KILN.layout.checkpoint(name) if name else None
    try:
        return sha256_digest((path / CHECKPOINT_MANIFEST).read_bytes()) if path else None
    except OSError:
        return None


def submission_warnings(job: Job) -> list[str]:
    """What a queued GRPO job's submitter is warned of: config keys that were ignored (with the close
    match), a held-out gate too small to decide, and a corpus in which no group's rewards differ. The
    API's queued answer and the job page a form lands on both say them."""
    from core.contracts.grpo_config import ignored_key_warnings
    from training.payloads import GrpoJobPayload
    from training.post_eval_admission import gate_warnings
    from training.reward_contrast import reward_contrast_warnings

    payload = GrpoJobPayload.of(job)
    data = payload.training_data
    return ignored_key_warnings(list(payload.ignored_config_keys)) + gate_warnings(payload.post_eval) \
        + reward_contrast_warnings(with_contrast=data.get("groups_with_reward_contrast"), rows=data.get("rows") or 0,
                                   dynamic_sampling=payload.config.dynamic_sampling)


def after_publication(payload: GrpoJobPayload) -> str:
    """What becomes of a training's adapter once it publishes, said at submission: the branches of
    training.runner's auto_load and training.post_eval_jobs' gate, in words (a user following the guide's
    checkpoint example saw a reviewed adapter replaced with nothing on screen saying it would be)."""
    from core.accounts.permissions import approval_required

    if not payload.config.auto_load:
        return "it stays available for review, not active (auto_load false)"
    reviewer = approval_required()
    if payload.gate_pending:
        return ("if the post_eval gate promotes it, " + ("a reviewer's approval then makes it active"
                                                          if reviewer else "it becomes active"))
    if reviewer:
        return "making it active waits for a reviewer's approval ([promotion] require_approval)"
    return ("it becomes active once its serving canary passes, unless a reward-hacking alarm sends it to a "
            "reviewer (auto_load true, no gate; auto_load false keeps it for review)")
