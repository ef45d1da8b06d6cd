"""A train run follows its `training.grpo` job, then that job's post-eval (reference-spec §4.10).

`run_follow(run)` moves the run from its jobs' rows (the database is the truth), and is called
- by `on_job_event` (a post_save receiver on JobEvent, after commit, in whichever process changed
  the job: the GPU worker when training starts or ends, the control worker for the post-eval),
- right after submission, on cancellation and at restoration.
States: `training_queued` (the job is queued) → `training_running` → `post_evaluating` (the job
published the adapter and queued its post-eval) → `environment_evaluating` when the request carries
`environment_eval` (its own control-queue job takes the run from there: openenv.training.evaluation)
→ `completed`; the training job failing fails the run
at stage `training` with `training_failed` (a post-eval: `post_evaluation_failed` at `post_evaluation`),
the job's own code and message in the failure's message (an interrupted worker: `run_interrupted` at
`restoration`, retryable), a cancelled job cancels the run. On publication the run's artifacts gain
`train_receipt` (the adapter's receipt file, checked against the admitted corpus and the output
name) and `adapter_manifest` (`kiln.adapter-manifest.v1`, adapters.manifest: name, content digest, files,
the receipt's sha256 as `receipt_hash`), written into the run directory. Imports no torch.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from adapters.manifest import MANIFEST_FILE
from adapters.manifest import manifest_bytes as build_manifest
from core.canonical import sha256_digest
from core.content_identity import adapter_content_sha256
from openenv.models import TRAINING_STATES, OpenEnvRun, RunState

log = logging.getLogger(__name__)

MAX_SOURCE_BYTES = 4 * 1024 * 1024
FOLLOWED_KINDS = ("training.grpo", "training.post_eval")
FOLLOWED_EVENTS = ("running", "completed", "failed", "cancelled")
ARTIFACT_FILES = {"train_receipt": "train_receipt.json", "adapter_manifest": "adapter_manifest.json"}


class EvidenceInvalid(Exception):
    pass


def post_eval_job_of(job):
    from core.jobs.models import Job

    job_id = (job.result or {}).get("post_eval_job_id")
    return Job.objects.filter(uuid=job_id).first() if job_id else None


def cancel_training_phase_job(run, job) -> None:
    """Cancel the run's training or post-eval job; one already publishing its result (the adapter, the
    gate's decision) can no longer be stopped, and the run says so rather than accept the cancel."""
    from core.errors import KilnError
    from core.jobs.services import job_cancel

    try:
        job_cancel(job=job, system=True)  # the run's own job: its owner was checked by run_cancel
    except KilnError as exc:
        if exc.code != "job_not_cancellable":
            raise
        job.refresh_from_db()
        if job.is_terminal:
            return  # it ended meanwhile: run_follow brings the run up to date
        raise KilnError("openenv_run_not_cancellable", f"run {run.id}: its {job.kind} job finished its work and "
                        "is publishing its result; a cancel can no longer stop it", status=409,
                        hint="wait for the run to end, then reject, unload or delete its adapter") from None


def _read_source(path: Path) -> bytes:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise EvidenceInvalid(f"{path.name} is missing from the published adapter") from None
    if not stat.S_ISREG(info.st_mode):
        raise EvidenceInvalid(f"{path} is not a regular file (a symlink?)")
    if info.st_size > MAX_SOURCE_BYTES:
        raise EvidenceInvalid(f"{path} holds {info.st_size} bytes, over the {MAX_SOURCE_BYTES} limit")
    return path.read_bytes()


def _adapter_artifacts(run: OpenEnvRun, job) -> list[dict]:
    """Copies of the train receipt and the adapter manifest in the run directory (their manifest entries)."""
    from adapters.models import Adapter, AdapterState
    from core.artifacts import write_file
    from openenv.runs.selectors import run_dir_for

    payload = job.payload
    name = payload["adapter_name"]
    adapter = Adapter.objects.filter(name=name, state=AdapterState.PUBLISHED, training_job=job).first()
    if adapter is None or not adapter.path:
        raise EvidenceInvalid(f"training job {job.uuid} published no adapter {name!r}")
    folder = Path(adapter.path)
    receipt_bytes = _read_source(folder / "train_receipt.json")
    try:
        receipt = json.loads(receipt_bytes)
    except ValueError:
        raise EvidenceInvalid("train_receipt.json is not JSON") from None
    corpus = payload["training_data"]["admitted_corpus_sha256"]
    if receipt.get("adapter_name") != name or receipt.get("status") != "success":
        raise EvidenceInvalid(f"train_receipt.json names {receipt.get('adapter_name')!r} ({receipt.get('status')})")
    if (receipt.get("training_data") or {}).get("sha256") != corpus:
        raise EvidenceInvalid("train_receipt.json was not trained on the run's admitted corpus")
    served = ((run.training_contract or {}).get("behavior_policy") or {}).get("base_model_sha256")
    trained = (receipt.get("model") or {}).get("base_model_sha256")
    if served and trained and trained != served:
        raise EvidenceInvalid(f"the trainer's base model {trained} is not the behavior policy's {served}")
    snapshot = run.behavior_snapshot
    if snapshot is not None:
        base = ((receipt.get("adapters") or {}).get("base") or {}).get("adapter_model_sha256")
        if base != snapshot["content_sha256"]:
            raise EvidenceInvalid(f"the warm start used adapter bytes {base}, not the behavior snapshot's "
                                  f"{snapshot['content_sha256']}")
    digest = adapter_content_sha256(folder)
    if digest != adapter.content_sha256:
        raise EvidenceInvalid(f"adapter {name!r} no longer holds its published bytes")
    manifest_path = folder / MANIFEST_FILE  # written at publication (adapters.manifest)
    if manifest_path.exists() or manifest_path.is_symlink():
        manifest_bytes = _read_source(manifest_path)
    else:  # an adapter published before manifests were written
        manifest_bytes = build_manifest(folder, name=name, content_sha256=digest, receipt_bytes=receipt_bytes,
                                        base_model_sha256=adapter.base_model_sha256, base_adapter=adapter.base_adapter,
                                        training_job_id=str(job.uuid), admitted_corpus_sha256=corpus)
    directory = run_dir_for(run)
    out = []
    for kind, data in (("train_receipt", receipt_bytes), ("adapter_manifest", manifest_bytes)):
        write_file(directory / ARTIFACT_FILES[kind], data)
        out.append({"kind": kind, "file": ARTIFACT_FILES[kind], "sha256": sha256_digest(data), "bytes": len(data)})
    return out


def _ended_unsuccessfully(run: OpenEnvRun, job, stage: str) -> None:
    from core.jobs.models import JobState
    from openenv.runs import services

    if job.state == JobState.CANCELLED and job.error_code != "job_interrupted":
        services.run_mark_cancelled(run, reason=f"its {job.kind} job was cancelled")
    elif job.error_code in ("job_interrupted", "job_time_limit"):
        services.run_fail(run, services.failure("run_interrupted", "restoration",
                                                f"its {job.kind} job was interrupted: {job.error_message}",
                                                retryable=True, hint="submit the run again (with a new "
                                                                     "idempotency_key)"))
    else:
        # the closed vocabulary names the stage; the job's own code (e.g. nan_loss) stays in the message
        code, what, status = (("post_evaluation_failed", "post-evaluation", "kiln eval status")
                              if stage == "post_evaluation" else ("training_failed", "training", "kiln train status"))
        cause = ": ".join(part for part in (job.error_code, job.error_message) if part) or "no error recorded"
        services.run_fail(run, services.failure(code, stage, f"{what} job {job.uuid} failed: {cause}",
                                                hint=f"see the {what} job ({status} {job.uuid}) for the cause"))


def _step(run: OpenEnvRun) -> bool:
    """One transition from the jobs' state; whether the run changed."""
    from core.jobs.models import JobState
    from openenv.runs import services
    from openenv.training.evaluation import environment_eval_start, wants_environment_eval

    job = run.training_job
    if job is None:
        return False
    job.refresh_from_db()
    if run.state in (RunState.TRAINING_QUEUED, RunState.TRAINING_RUNNING):
        if job.state == JobState.RUNNING:
            return run.state == RunState.TRAINING_QUEUED and services.run_transition(
                run, from_states=[RunState.TRAINING_QUEUED], state=RunState.TRAINING_RUNNING, stage="training")
        if job.state == JobState.QUEUED:
            return False
        if job.state != JobState.COMPLETED:
            _ended_unsuccessfully(run, job, "training")
            return True
        try:
            artifacts = [a for a in run.artifacts or [] if a["kind"] not in ARTIFACT_FILES] + \
                _adapter_artifacts(run, job)
        except EvidenceInvalid as exc:
            services.run_fail(run, services.failure("training_evidence_invalid", "artifact_publication", str(exc),
                                                    hint="the published adapter does not match the run's corpus"))
            return True
        post_eval = post_eval_job_of(job)
        training = [RunState.TRAINING_QUEUED, RunState.TRAINING_RUNNING]
        if post_eval is None and wants_environment_eval(run):
            return environment_eval_start(run, from_states=training, artifacts=artifacts)
        state = RunState.POST_EVALUATING if post_eval is not None else RunState.COMPLETED
        return services.run_transition(run, from_states=training, state=state,
                                       stage="post_evaluation" if post_eval else "training", artifacts=artifacts)
    if run.state == RunState.POST_EVALUATING:
        post_eval = post_eval_job_of(job)
        if post_eval is None or post_eval.state in (JobState.QUEUED, JobState.RUNNING):
            return False
        if post_eval.state == JobState.COMPLETED:
            if wants_environment_eval(run):
                return environment_eval_start(run, from_states=[RunState.POST_EVALUATING])
            return services.run_transition(run, from_states=[RunState.POST_EVALUATING], state=RunState.COMPLETED,
                                           stage="post_evaluation")
        _ended_unsuccessfully(run, post_eval, "post_evaluation")
        return True
    return False


def run_follow(run: OpenEnvRun) -> OpenEnvRun:
    """Bring a train run up to date with its jobs (a no-op for any other run)."""
    from openenv.runs import services

    run.refresh_from_db()
    moved = False
    for _ in range(4):
        if run.state not in TRAINING_STATES or not _step(run):
            break
        moved = True
        run.refresh_from_db()
    if moved and run.is_terminal:
        services.runs_admit()
    return run


def runs_follow_job(job) -> None:
    """Follow every run that waits on this training or post-eval job."""
    if job.kind == "training.grpo":
        runs = OpenEnvRun.objects.filter(training_job_id=job.id, state__in=TRAINING_STATES)
    else:
        training_job = (job.payload or {}).get("training_job_id")
        runs = OpenEnvRun.objects.filter(training_job__uuid=training_job, state=RunState.POST_EVALUATING) \
            if training_job else OpenEnvRun.objects.none()
    for run in runs.select_related("training_job"):
        run_follow(run)


def on_job_event(sender, instance, created, **kwargs) -> None:
    """post_save of a JobEvent: a followed job started or ended; follow its runs after commit."""
    if not created or instance.type not in FOLLOWED_EVENTS:
        return
    job = instance.job
    if job.kind not in FOLLOWED_KINDS:
        return
    from django.db import transaction

    def follow():
        try:
            runs_follow_job(job)
        except Exception:  # noqa: BLE001 - a follower's failure never fails the job's own change
            log.exception("could not follow OpenEnv runs of job %s", job.uuid)

    transaction.on_commit(follow)
