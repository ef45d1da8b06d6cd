"""Services that change OpenEnv runs (reference-spec §1.6, §4.9-4.12).

- `run_create(body, user)`: every step of POST /v1/openenv/runs after the route's own checks
  (enabled, permission, body size), shared by the route and the dashboard's form: the body
  validated once (openenv.runs.request.normalize; 400 `openenv_invalid_request` naming the field),
  the server's checks (loopback-only URLs unless allowed, configured credential handles, a
  published adapter), a train run's preflight (its refusals keep their training codes; the training
  is sealed with `auto_load` false when the environment gate owns promotion), then `run_submit`.
- `run_submit`: idempotency (same key + same normalized request → the original run; a changed
  request → 409), the tracked map (terminal runs past `tracked_run_ttl_secs`, then the oldest
  terminal ones, are evicted; all tracked runs live → 503), then a `queued` row with the next
  stable `sequence`. Concurrent identical POSTs meet the unique key: the loser reads the winner.
- `runs_admit`: a bounded FIFO: while fewer than `max_active_runs` runs are active, the queued
  run with the lowest sequence is admitted (state `discovering`) and its `openenv.run` job is
  queued. Admission is serialized (SQLite: IMMEDIATE transactions; PostgreSQL: an advisory
  lock), so the bound holds across processes. Queued runs hold no environment or model capacity.
- `run_cancel`: a queued run is cancelled at once; an active one at the next boundary of its
  phase (its job is asked to stop); a terminal one is refused (409 openenv_run_not_cancellable).
- `run_transition`: every state change is a conditional UPDATE on the current state, then the
  run.json of the run directory is rewritten atomically.
- `runs_restore` (a control worker's boot) and `run_job_unsuccessful` (the job's hook): never
  admitted queued runs resume in order; every other non-terminal run fails `run_interrupted` at
  stage `restoration`, retryable (a run in `environment_evaluating` is judged by its
  `openenv.environment_eval` job as a collecting run is by its `openenv.run` job: running on a live
  worker, or queued while another control worker lives, it is left alone). A train run past
  submission follows its training job instead
  (queued training resumes on the GPU queue; training that was running on a dead worker fails
  as interrupted, and so does the run). Cancelling a train run in training cancels its training
  job (or its post-eval), and the run ends `cancelled` when that job does; in
  `environment_evaluating` it cancels the evaluation job (cooperatively, at once if still queued).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Max
from django.utils import timezone

from core.artifacts import write_file
from core.db_locks import serialize
from core.errors import KilnError
from openenv import metrics
from openenv.collector.errors import FAILURE_CODES, checked_failure, failure_record
from openenv.models import (
    ACTIVE_STATES,
    COLLECTION_STATES,
    EVALUATION_STATES,
    TERMINAL_STATES,
    TRAINING_STATES,
    OpenEnvRun,
    RunState,
)
from openenv.runs.request import request_digest
from openenv.runs.selectors import RUN_FILE, run_record

log = logging.getLogger(__name__)

JOB_KIND = "openenv.run"
FAILURE_SCHEMA = "kiln.openenv-run-failure.v1"
MAX_RUN_RECORD_BYTES = 2 * 1024 * 1024
WRITE_ATTEMPTS = 8
EVAL_ENDED = ("failed", "cancelled")


def failure(code: str, stage: str, message: str, *, retryable: bool = False, hint: str = "",
            http_status: int | None = None) -> dict:
    """A run failure (openenv.collector.errors.failure_record: closed codes, a hint always)."""
    return failure_record(code, stage, message, retryable=retryable, hint=hint, http_status=http_status)


def _serialize() -> None:
    """Hold the admission lock until the transaction ends (core.db_locks)."""
    serialize("openenv.admission")


def _retrying(fn):
    """Run a short write transaction, again while the database is locked by another writer."""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            return fn()
        except OperationalError as exc:
            if "locked" not in str(exc) or attempt == WRITE_ATTEMPTS - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def run_record_write(run: OpenEnvRun) -> None:
    """Store the v5 record on the row and, once the run directory exists, in its run.json."""
    from openenv.runs.selectors import run_dir_for

    record = run_record(run)
    OpenEnvRun.objects.filter(id=run.id).update(record=record)
    run.record = record
    if not run.run_dir:
        return
    import json

    data = (json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    if len(data) > MAX_RUN_RECORD_BYTES:
        log.warning("run %s: run.json would hold %d bytes (limit %d); not rewritten", run.id, len(data),
                    MAX_RUN_RECORD_BYTES)
        return
    directory = run_dir_for(run)
    if directory.is_dir() and not directory.is_symlink():
        write_file(directory / RUN_FILE, data)


# --- submission --------------------------------------------------------------------------------

def _same_or_conflict(existing: OpenEnvRun, digest: str) -> tuple[OpenEnvRun, bool]:
    if existing.request_digest != digest:
        raise KilnError("openenv_run_idempotency_conflict",
                        f"idempotency key {existing.idempotency_key!r} already names run {existing.id} with a "
                        "different request", status=409,
                        hint="retry with the exact same body, or use a new idempotency_key for a new run")
    metrics.count_submission(replayed=True)
    return existing, False


def _evict() -> None:
    ttl = timedelta(seconds=settings.KILN.openenv_tracked_run_ttl_secs)
    OpenEnvRun.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=timezone.now() - ttl).delete()
    cap = settings.KILN.openenv_max_tracked_runs
    excess = OpenEnvRun.objects.count() - cap + 1
    if excess > 0:
        oldest = list(OpenEnvRun.objects.filter(state__in=TERMINAL_STATES).order_by("finished_at", "sequence")
                      .values_list("id", flat=True)[:excess])
        OpenEnvRun.objects.filter(id__in=oldest).delete()


def _check_output_free(output_adapter: str) -> None:
    """A second train run for the same output adapter would collect all its episodes and only then be
    refused at training submission; refuse it now, before it spends any (under the admission lock)."""
    other = (OpenEnvRun.objects.filter(kind="train").exclude(state__in=TERMINAL_STATES)
             .filter(request__output_adapter=output_adapter).order_by("sequence").first())
    if other is not None:
        raise KilnError("adapter_revision_conflict",
                        f"output_adapter: run {other.id} ({other.state}) is already training {output_adapter!r}",
                        status=409, field="output_adapter",
                        hint="use a new versioned output name for every run, e.g. counter-agent-r002")


def run_submit(*, request: dict, user=None, seal=None) -> tuple[OpenEnvRun, bool]:
    """(run, created): a new queued run, or the original run of an exact idempotent retry.

    `seal()` (kind train) is called only when a new run is created, before its row exists: it
    answers the preflight receipt whose sealed contract the run carries (its refusal refuses the run)."""
    digest = request_digest(request)
    key = request.get("idempotency_key")

    def create() -> tuple[OpenEnvRun, bool]:
        with transaction.atomic():
            _serialize()
            if key is not None:
                existing = OpenEnvRun.objects.filter(idempotency_key=key).first()
                if existing is not None:
                    return _same_or_conflict(existing, digest)
            _evict()
            cap = settings.KILN.openenv_max_tracked_runs
            tracked = OpenEnvRun.objects.count()
            if tracked >= cap:
                raise KilnError("openenv_run_capacity_full",
                                f"{tracked} OpenEnv runs are tracked and none has finished (max_tracked_runs {cap})",
                                status=503, headers={"Retry-After": "30"},
                                hint="wait for runs to finish or cancel some, then submit again")
            sealed = {}
            if seal is not None:
                _check_output_free(request["output_adapter"])
                receipt = seal()
                sealed = {"training_contract": receipt["training_contract"],
                          "training_contract_sha256": receipt["training_contract_sha256"]}
            sequence = (OpenEnvRun.objects.aggregate(top=Max("sequence"))["top"] or 0) + 1
            run = OpenEnvRun.objects.create(**sealed,
                sequence=sequence, idempotency_key=key, request_digest=digest, request=request,
                kind=request["kind"], state=RunState.QUEUED, stage="admission",
                progress={"groups_completed": 0, "groups_total": request["groups"], "rollouts_completed": 0,
                          "rollouts_total": request["groups"] * request["group_size"]},
                submitted_by=user if getattr(user, "is_authenticated", False) else None)
            run_record_write(run)
            metrics.count_submission(replayed=False)
            return run, True

    for _attempt in range(WRITE_ATTEMPTS):
        try:
            run, created = _retrying(create)
            break
        except IntegrityError:
            # A concurrent identical POST won the key (or the sequence): read what it made.
            existing = OpenEnvRun.objects.filter(idempotency_key=key).first() if key is not None else None
            if existing is not None:
                return _same_or_conflict(existing, digest)
    else:
        raise KilnError("openenv_run_create_failed", "could not record the run (sequence contention)", status=500,
                        hint="submit again")
    if created:
        runs_admit()
        run.refresh_from_db()
    return run, created


def _invalid(exc) -> KilnError:
    message = exc.message if exc.message.startswith("request: ") else f"request: {exc.message}"
    return KilnError(getattr(exc, "code", "openenv_invalid_request"), message, status=400, field=exc.field,
                     hint=exc.hint or "see OpenEnvRunRequest in /v1/openapi.json")


def _server_checks(request_value: dict) -> None:
    """What depends on this server: reachable URLs, configured credentials, published adapters."""
    from adapters.selectors import adapter_published_path
    from core.profiles import require_profile_allows
    from openenv.api import _credentials, _endpoints

    # Every run samples its policy's actions: under a profile that refuses inference a new run could only
    # fail at its first action, after discovery and a reset (the guide: admission precedes discovery, so a
    # rejection spends no episodes). An exact retry still answers the run its key already names.
    key = request_value.get("idempotency_key")
    if key is None or not OpenEnvRun.objects.filter(idempotency_key=key).exists():
        require_profile_allows("inference")
    endpoints = _endpoints(request_value["environment_urls"])
    # Handles and origins only: the token is read by the worker when it connects.
    _credentials(request_value["credential_ids"] or [None] * len(endpoints), endpoints, read_tokens=False)
    name = request_value["adapter"]
    if name != "base" and adapter_published_path(name=name) is None:
        # The preflight's and the adapter routes' code (spec §1.6: preflight rejections keep their codes).
        raise KilnError("adapter_not_found", f"request: adapter: no published adapter named {name!r}",
                        status=404, field="adapter", hint="choose base or an adapter that finished training")


def run_create(*, body: dict, user=None) -> tuple[OpenEnvRun, bool]:
    """(run, created) for one OpenEnvRunRequest body: validated, checked against this server, a train
    run preflighted and sealed, then recorded by `run_submit`. Every refusal is a KilnError."""
    from openenv.runs.request import RunRequestError, normalize

    try:
        value = normalize(body)
    except RunRequestError as exc:
        raise _invalid(exc) from None
    _server_checks(value)
    seal = None
    if value["kind"] == "train":
        from openenv.environment_promotion import promotion_owner, training_auto_load
        from openenv.training.preflight import training_preflight

        promotion_owner(value)  # one gate owns promotion (the normalizer refuses both already)

        def seal():
            return training_preflight(adapter=value["adapter"], output_adapter=value["output_adapter"],
                                      training_config=value.get("training_config"),
                                      auto_load=training_auto_load(value), post_eval=value.get("post_eval"))
    return run_submit(request=value, user=user, seal=seal)


# --- admission ---------------------------------------------------------------------------------

def runs_admit() -> list[OpenEnvRun]:
    """Admit queued runs in sequence order while fewer than max_active_runs are active. Not while this
    worker shuts down, nor in an orphan whose supervisor is gone (kill -9 of kiln serve): a run admitted
    then would only fail `run_interrupted` at the next boot, where a never-admitted one resumes."""
    from core.jobs.runner import shutting_down
    from core.jobs.services import job_submit
    from core.jobs.worker_state import orphaned

    if shutting_down():
        return []
    if orphaned():
        log.warning("not admitting queued OpenEnv runs: this worker's supervisor is gone")
        return []

    def admit() -> list[OpenEnvRun]:
        admitted = []
        with transaction.atomic():
            _serialize()
            free = settings.KILN.openenv_max_active_runs - OpenEnvRun.objects.filter(state__in=ACTIVE_STATES).count()
            waiting = OpenEnvRun.objects.filter(state=RunState.QUEUED, admitted_at__isnull=True).order_by("sequence")
            for run in list(waiting[:max(free, 0)]):
                try:
                    job = job_submit(kind=JOB_KIND, payload={"run_id": str(run.id)},
                                     title=f"OpenEnv {run.kind} run {str(run.id)[:8]}", user=run.submitted_by)
                except KilnError as exc:  # the control queue is full: stay queued, admitted later
                    log.warning("run %s stays queued: %s", run.id, exc.message)
                    break
                now = timezone.now()
                if OpenEnvRun.objects.filter(id=run.id, state=RunState.QUEUED).update(
                        state=RunState.DISCOVERING, stage="discovery", admitted_at=now, job=job, updated_at=now):
                    run.refresh_from_db()
                    run_record_write(run)
                    admitted.append(run)
        return admitted

    return _retrying(admit)


# --- transitions -------------------------------------------------------------------------------

def run_transition(run: OpenEnvRun, *, from_states, unless_cancel_requested: bool = False, **fields) -> bool:
    """Move the run (conditional on its state, and with `unless_cancel_requested` on no cancel having
    been asked for), refresh it and rewrite its record."""
    fields["updated_at"] = timezone.now()
    if fields.get("failure") is not None:  # every stored failure: the closed vocabulary, a hint
        fields["failure"] = checked_failure(fields["failure"])
    if fields.get("state") in TERMINAL_STATES:
        fields.setdefault("finished_at", fields["updated_at"])
    block = run.environment_evaluation
    if fields.get("state") in (RunState.FAILED, RunState.CANCELLED) and "environment_evaluation" not in fields \
            and isinstance(block, dict) and "outcome" not in block and block.get("state") not in EVAL_ENDED:
        # the environment evaluation in flight ends with its run
        fields["environment_evaluation"] = {**block, "state": "failed" if fields["state"] == RunState.FAILED
                                            else "cancelled"}

    def update() -> bool:
        with transaction.atomic():
            rows = OpenEnvRun.objects.filter(id=run.id, state__in=list(from_states))
            if unless_cancel_requested:
                rows = rows.filter(cancel_requested=False)
            if not rows.update(**fields):
                return False
            run.refresh_from_db()
            run_record_write(run)
            # Counted in the transition's own transaction: once, and only if the transition commits.
            if fields.get("failure") is not None:
                metrics.count_failure(fields["failure"])
            if fields.get("rollout_stats") is not None:
                metrics.count_collection(fields["rollout_stats"])
            return True

    changed = _retrying(update)
    if not changed:
        run.refresh_from_db()
    return changed


def run_progress(run: OpenEnvRun, progress: dict) -> None:
    """Progress counts only (no record rewrite: run.json changes with the state)."""
    OpenEnvRun.objects.filter(id=run.id, state__in=ACTIVE_STATES).update(progress=progress,
                                                                         updated_at=timezone.now())
    run.progress = progress


def run_fail(run: OpenEnvRun, fail: dict) -> bool:
    non_terminal = [s for s in RunState.values if s not in TERMINAL_STATES]
    return run_transition(run, from_states=non_terminal, state=RunState.FAILED, stage=fail["stage"], failure=fail)


def run_mark_cancelled(run: OpenEnvRun, *, reason: str) -> bool:
    non_terminal = [s for s in RunState.values if s not in TERMINAL_STATES]
    return run_transition(run, from_states=non_terminal, state=RunState.CANCELLED, error=reason[:500])


def run_cancel(*, run: OpenEnvRun, user=None) -> OpenEnvRun:
    """Cancel a queued run now, or an active one at the next boundary of its current phase."""
    from core.accounts.permissions import check_owner_or_permitted
    from core.jobs.models import JobState
    from core.jobs.services import job_cancel

    check_owner_or_permitted(owner_id=run.submitted_by_id, user=user, what=f"run {run.id}",
                             code="openenv_run_cancel_forbidden")
    who = getattr(user, "username", "") or "anonymous"
    if run.is_terminal:
        raise KilnError("openenv_run_not_cancellable", f"run {run.id} is already {run.state}", status=409,
                        hint="only queued or active runs can be cancelled")
    if run.state == RunState.QUEUED and run_transition(run, from_states=[RunState.QUEUED], state=RunState.CANCELLED,
                                                       error=f"cancelled by {who} while queued"):
        return run
    if run.state in TRAINING_STATES:
        from openenv.training.follow import cancel_training_phase_job, post_eval_job_of, run_follow

        training = run.training_job
        if training is not None:
            training.refresh_from_db()
            if not training.is_terminal:
                cancel_training_phase_job(run, training)
            # Looked up after the training's cancel was settled: a training that finished publishing
            # meanwhile has queued its post-eval, which the cancel must reach too.
            training.refresh_from_db()
            post_eval = post_eval_job_of(training)
            if post_eval is not None and not post_eval.is_terminal:
                cancel_training_phase_job(run, post_eval)
        run_transition(run, from_states=TRAINING_STATES, cancel_requested=True)
        run_follow(run)
    elif run.state in EVALUATION_STATES:
        run_transition(run, from_states=EVALUATION_STATES, cancel_requested=True)
        job = run.environment_eval_job
        if job is not None and not job.is_terminal:
            job = job_cancel(job=job, user=user, system=True)
        if job is None or job.is_terminal:  # cancelled before it started (or orphaned): nothing runs
            run_mark_cancelled(run, reason=f"cancelled by {who} before its environment evaluation ran")
            runs_admit()
    elif run.state in COLLECTION_STATES:
        run_transition(run, from_states=COLLECTION_STATES, cancel_requested=True)
        if run.job is not None and not run.job.is_terminal:
            job = job_cancel(job=run.job, user=user, system=True)
            if job.state == JobState.CANCELLED:  # its job had not started: nothing is running
                run_mark_cancelled(run, reason=f"cancelled by {who} before its job started")
                runs_admit()
    run.refresh_from_db()
    return run


# --- restoration -------------------------------------------------------------------------------

def _interrupted(run: OpenEnvRun, why: str) -> bool:
    return run_fail(run, failure("run_interrupted", "restoration", f"the run was {run.state} when {why}",
                                 retryable=True, hint="submit the run again (with a new idempotency_key)"))


def run_job_unsuccessful(job) -> None:
    """The `openenv.run` (or `openenv.environment_eval`) job ended failed or cancelled: a run it left
    non-terminal ends too."""
    from django.db.models import Q

    from core.jobs.models import JobState

    for run in OpenEnvRun.objects.filter(Q(job=job) | Q(environment_eval_job=job)).exclude(state__in=TERMINAL_STATES):
        if run.environment_eval_job_id != job.id and run.state in EVALUATION_STATES:
            continue  # its collection job ended long ago; the evaluation job decides
        stage = "environment_evaluation" if run.environment_eval_job_id == job.id else "orchestration"
        if job.state == JobState.CANCELLED and job.error_code != "job_interrupted":
            run_mark_cancelled(run, reason=job.error_message or "its job was cancelled")
        elif job.error_code in ("job_interrupted", "job_time_limit"):
            _interrupted(run, f"its worker stopped ({job.error_code})")
        else:
            code = job.error_code if job.error_code in FAILURE_CODES else \
                ("environment_evaluation_failed" if stage == "environment_evaluation" else "internal_error")
            why = f"{job.error_code}: " if job.error_code and job.error_code != code else ""
            run_fail(run, failure(code, stage, f"its {job.kind} job {job.uuid} failed: {why}"
                                  f"{job.error_message or 'no message'}",
                                  hint="see the job (kiln jobs, or /ui/ Jobs) and the control worker's log"))
    runs_admit()


def runs_restore(*, worker_id: str | None = None) -> dict:
    """A control worker's boot: fail every admitted non-terminal run nobody is executing, then admit."""
    from core.jobs.liveness import worker_is_dead
    from core.jobs.models import Job, JobEvent, JobState, WorkerHeartbeat
    from core.jobs.selectors import workers_alive
    from core.jobs.services import jobs_fail_interrupted

    others = [w for w in workers_alive() if w.worker_id != worker_id and "control" in (w.queues or [])]
    failed = []
    for run in OpenEnvRun.objects.select_related("job", "environment_eval_job").exclude(
            state__in=TERMINAL_STATES).order_by("sequence"):
        if run.state == RunState.QUEUED and run.admitted_at is None:
            continue  # never admitted: resumes in sequence order below
        if run.state in TRAINING_STATES:
            if _restore_training(run, worker_id):
                failed.append(str(run.id))
            continue
        job = run.environment_eval_job if run.state in EVALUATION_STATES else run.job
        if job is None or job.is_terminal:
            pass
        elif job.state == JobState.RUNNING:
            if job.worker_id == worker_id or not worker_is_dead(
                    WorkerHeartbeat.objects.filter(worker_id=job.worker_id).first()):
                continue  # a live worker executes it
            jobs_fail_interrupted(job_ids=[job.id], reason="its worker stopped while the run was executing")
        elif job.state == JobState.QUEUED:
            if others:
                continue  # another live control worker may claim it now
            now = timezone.now()
            if Job.objects.filter(id=job.id, state=JobState.QUEUED).update(
                    state=JobState.CANCELLED, error_code="job_interrupted", finished_at=now, updated_at=now,
                    error_message="the server restarted after the run was admitted"):
                JobEvent.objects.create(job=job, type="cancelled", message="restoration: the run was interrupted")
        run.refresh_from_db()
        if not run.is_terminal and _interrupted(run, "the server restarted"):
            failed.append(str(run.id))
    admitted = runs_admit()
    return {"interrupted": failed, "admitted": [str(r.id) for r in admitted]}


def _restore_training(run: OpenEnvRun, worker_id: str | None) -> bool:
    """A train run past submission follows its jobs: a job running on a dead worker fails as
    interrupted (so does the run, `run_interrupted` at `restoration`); queued work resumes on its
    own queue. Whether the run failed as interrupted."""
    from core.jobs.liveness import worker_is_dead
    from core.jobs.models import JobState, WorkerHeartbeat
    from core.jobs.services import jobs_fail_interrupted
    from openenv.training.follow import post_eval_job_of, run_follow

    jobs = [run.training_job, run.training_job and post_eval_job_of(run.training_job)]
    for job in jobs:
        if job is None or job.state != JobState.RUNNING or job.worker_id == worker_id:
            continue
        if worker_is_dead(WorkerHeartbeat.objects.filter(worker_id=job.worker_id).first()):
            jobs_fail_interrupted(job_ids=[job.id], reason="its worker stopped while the run was training")
    run = run_follow(run)
    if run.training_job is None and not run.is_terminal:
        return _interrupted(run, "the server restarted")
    return run.state == RunState.FAILED and (run.failure or {}).get("code") == "run_interrupted"

