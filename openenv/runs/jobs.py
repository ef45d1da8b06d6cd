"""The `openenv.run` job (control queue): one admitted run, through the shared collector.

Stages (the run's state, persisted at each change): `discovering` (discovery of every URL,
`openenv.collector.collect.discover`), `collecting` (`collect`: groups x candidates, whose last
step is the identity re-verification), `revalidating` (every episode finished: discovery again),
then the three artifacts are published together into the run directory
`<adapter_dir>/.openenv/runs/<run-id>/` (rollouts.jsonl, replay.json, summary.json, beside
run.json) and a rollout run is `rollout_ready` with its manifest and the summary's `stats`.
A `kind: train` run first re-checks its sealed contract and snapshots a named behavior adapter
(openenv.training.behavior), collects with every reply held to the contract's behavior policy,
embeds the contract and the training selection in its summary, then is `submitting`: selection
and the GRPO job (openenv.training.submission); the job ends there and the run follows the
training job (openenv.training.follow).

The collection runs on its own event loop in a thread; this (the job's) thread owns every
database write: it persists progress, watches for cancellation (`ctx.should_stop()`: the job was
asked to stop, or the worker is shutting down) and cancels the collection task, which closes every
session. A cancellation publishes nothing. Any failure ends the run `failed` with its typed
`kiln.openenv-run-failure.v1` and the job fails with the same code. Imports no torch.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

from django.conf import settings

from core.canonical import sha256_digest
from core.errors import KilnError
from openenv.collector import ChatCompletionPolicy, CollectionError
from openenv.collector.collect import collect, discover, publish
from openenv.collector.config import adapter_name
from openenv.collector.diagnosis import collection_warnings
from openenv.collector.errors import policy_refusal_hint
from openenv.models import COLLECTION_STATES, OpenEnvRun, RunState
from openenv.runs import services
from openenv.runs.request import collection_config
from openenv.runs.selectors import ARTIFACT_FILES, run_dir_for

TICK_SECONDS = 0.2
REQUEST_TIMEOUT_S = 900.0
_GROUP = re.compile(r"^group (\d+) candidate (\d+)$")


BROKER_HINT = ("Redis (the message broker) or the GPU worker went away while the run was sampling; check that "
               "kiln serve (or KILN_REDIS_URL's Redis and a GPU worker) is running")


def broker_lost(exc: BaseException) -> bool:
    """Whether `exc` says the broker (Redis) or its connection went away."""
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis is a dependency
        return isinstance(exc, ConnectionError)
    return isinstance(exc, RedisConnectionError | RedisTimeoutError | ConnectionError)


def unexpected_failure(exc: BaseException, stage: str) -> dict:
    """The failure of an exception nothing narrower classified: the broker gone is retryable (a new
    attempt may succeed once it is back), anything else an `internal_error`."""
    message = f"{type(exc).__name__}: {exc}"
    if broker_lost(exc):
        return services.failure("internal_error", stage, f"the message broker went away mid-run: {message}",
                                retryable=True, hint=BROKER_HINT)
    return services.failure("internal_error", stage, message,
                            hint="an unexpected error ended the run; the control worker's log has the traceback "
                                 "(report it if it recurs)")


def _chat_post():
    """The policy's transport: Kiln's own chat route through the infer queue (no HTTP)."""
    from django.db import connections

    from adapters.serving.sync_client import chat_completion_sync

    def call(body: dict) -> dict:
        try:
            return chat_completion_sync(body, timeout=REQUEST_TIMEOUT_S)
        except KilnError as exc:
            # 503/504 (the worker shutting down or lost, a timeout) pass; a retry may succeed
            raise CollectionError("openenv_policy_failed", f"the model server answered {exc.code}: {exc.message}",
                                  failure_code="collection_failed", retryable=exc.status in (503, 504),
                                  hint=policy_refusal_hint(exc.code, exc.hint)) from None
        except Exception as exc:
            if not broker_lost(exc):
                raise
            raise CollectionError("openenv_policy_unreachable", f"the model service could not be reached "
                                  f"mid-run: {type(exc).__name__}: {exc}", failure_code="collection_failed",
                                  retryable=True, hint=BROKER_HINT) from None
        finally:
            connections.close_all()  # the readiness reads opened this thread's own connection

    async def post(body: dict) -> dict:
        return await asyncio.to_thread(call, body)

    return post


def make_policy(run: OpenEnvRun, ctx):
    """The behavior policy of a run: the served model (with the run's adapter) with rollout provenance."""
    from adapters.serving.selectors import wait_for_inference_ready

    wait_for_inference_ready(ctx)
    return ChatCompletionPolicy(_chat_post(), adapter=adapter_name(run.request["adapter"]))


class _Execution(threading.Thread):
    """discover, then collect, on a private event loop; the job's thread reads `snapshot()`."""

    def __init__(self, config, policy, group_size: int):
        super().__init__(name="kiln-openenv-run", daemon=True)
        self.config, self.policy, self.group_size = config, policy, group_size
        self.lock = threading.Lock()
        self.phase = RunState.DISCOVERING
        self.environments: list[dict] | None = None
        self.finished = 0
        self.per_group: dict[int, int] = {}
        self.bundle = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._cancelled = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to the job's thread
            self.error = exc

    async def _main(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        if self._cancelled.is_set():
            raise asyncio.CancelledError()
        inspections = await discover(self.config)
        with self.lock:
            self.environments = [inspection.identity for inspection in inspections]
            self.phase = RunState.COLLECTING
        self.bundle = await collect(self.config, self.policy, on_progress=self._progress, inspections=inspections)

    def _progress(self, done: int, total: int, label: str) -> None:
        match = _GROUP.match(label)
        with self.lock:
            self.finished = done
            if match:
                group = int(match.group(1))
                self.per_group[group] = self.per_group.get(group, 0) + 1
            if done >= total:
                self.phase = RunState.REVALIDATING

    def snapshot(self) -> tuple:
        with self.lock:
            groups = sum(1 for n in self.per_group.values() if n >= self.group_size)
            return self.phase, self.environments, self.finished, groups

    def cancel(self) -> None:
        self._cancelled.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop already ended
                pass


STAGES = {RunState.DISCOVERING: "discovery", RunState.COLLECTING: "collection",
          RunState.REVALIDATING: "identity_verification"}


def _persist(run: OpenEnvRun, snapshot: tuple, last: tuple | None) -> None:
    from django.db import OperationalError

    phase, environments, finished, groups = snapshot
    request = run.request
    progress = {"groups_completed": groups, "groups_total": request["groups"], "rollouts_completed": finished,
                "rollouts_total": request["groups"] * request["group_size"]}
    try:
        if last is None or phase != last[0] or environments != last[1]:
            fields = {"state": phase, "stage": STAGES[phase], "progress": progress}
            if environments is not None:
                fields["environments"] = environments
            services.run_transition(run, from_states=COLLECTION_STATES, **fields)
        elif (finished, groups) != last[2:]:
            services.run_progress(run, progress)
    except OperationalError:
        return  # a locked database: the next tick writes the newer counts


def _stop_reason(ctx) -> str | None:
    from core.jobs.runner import shutting_down

    if not ctx.should_stop():
        return None
    return "shutdown" if shutting_down() and not ctx._cancel_seen else "cancel"


def _end_stopped(run: OpenEnvRun, reason: str, ctx):
    from core.jobs.runner import JobCancelled

    if reason == "shutdown":
        services._interrupted(run, "its worker shut down")
        raise KilnError("run_interrupted", "the worker shut down while the run was executing")
    services.run_mark_cancelled(run, reason=f"cancelled while {run.state}")
    raise JobCancelled()


def _fail(run: OpenEnvRun, fail: dict):
    services.run_fail(run, fail)
    raise KilnError(fail["code"], fail["message"], hint=fail.get("hint", ""))


def run_stage_job(ctx, run: OpenEnvRun | None, state: str, stage: str, body) -> dict:
    """A run's job for one stage: `body(ctx, run)` when the run is (still) in `state`, else a skip (the run
    is gone, or already past that stage). The run ends with its job, unless it already ended: cancelled
    when the job is, failed (`unexpected_failure` at `stage`: internal_error) on any other error; either way the next
    queued runs are admitted. The collection job (below) and the environment evaluation's
    (openenv/training/evaluation.py) both run this way."""
    if run is None or run.state != state:
        return {"run_id": ctx.payload["run_id"], "skipped": run.state if run else "missing"}
    from core.jobs.runner import JobCancelled

    try:
        return body(ctx, run)
    except JobCancelled:
        run.refresh_from_db()
        if not run.is_terminal:
            services.run_mark_cancelled(run, reason=f"cancelled while {run.state}")
        raise
    except Exception as exc:
        run.refresh_from_db()
        if not run.is_terminal:
            services.run_fail(run, unexpected_failure(exc, stage))
        raise
    finally:
        services.runs_admit()


def run_openenv_job(ctx) -> dict:
    run = OpenEnvRun.objects.filter(id=ctx.payload["run_id"]).first()
    return run_stage_job(ctx, run, RunState.DISCOVERING, "orchestration", _execute)


def run_credentials(run: OpenEnvRun, stage: str) -> list:
    """The run's credential handles as Credentials, their tokens read now from this worker's
    environment (openenv.server_credentials); a handle gone from the configuration, or a token
    variable unset here, fails the run `persisted_contract_invalid` before any connection."""
    from openenv import server_credentials
    from openenv.client.errors import OpenEnvError
    from openenv.metrics import count_authenticated

    try:
        credentials = server_credentials.resolve(run.request.get("credential_ids"), run.request["environment_urls"])
    except OpenEnvError as exc:
        _fail(run, services.failure("persisted_contract_invalid", stage, exc.message, hint=exc.hint))
    count_authenticated("environment_evaluation" if stage == "environment_evaluation" else "run", credentials)
    return credentials


def _execute(ctx, run: OpenEnvRun) -> dict:
    directory = run_dir_for(run)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(run, services.failure("artifact_publication_failed", "artifact_publication",
                                    f"cannot create the run directory {directory}: {exc}"))
    services.run_transition(run, from_states=[RunState.DISCOVERING], run_dir=str(directory))
    config = collection_config(run.request, directory, credentials=run_credentials(run, "discovery"),
                               reply_timeout_s=settings.KILN.openenv_reply_timeout_secs)
    train = run.kind == "train"
    if train:
        _seal_behavior(run, directory)
        config.training_contract = run.training_contract
    try:
        policy = make_policy(run, ctx)
    except KilnError as exc:
        _fail(run, services.failure("collection_failed", "discovery",
                                    f"the model service is not ready: {exc.code}: {exc.message}",
                                    retryable=exc.status == 503, hint=exc.hint))
    if train:
        from openenv.training.behavior import ContractPolicy

        policy = ContractPolicy(policy, run.training_contract["behavior_policy"])
    execution = _Execution(config, policy, run.request["group_size"])
    execution.start()
    last = None
    reason = None
    while execution.is_alive():
        execution.join(TICK_SECONDS)
        snapshot = execution.snapshot()
        if snapshot != last:
            _persist(run, snapshot, last)
            last = snapshot
        reason = reason or _stop_reason(ctx)
        if reason:
            execution.cancel()
            execution.join()
            break
    run.refresh_from_db()
    reason = reason or _stop_reason(ctx)
    if reason or isinstance(execution.error, asyncio.CancelledError):
        _end_stopped(run, reason or "cancel", ctx)
    if execution.error is not None:
        error = execution.error
        if isinstance(error, CollectionError):
            _fail(run, error.as_failure())
        if isinstance(error, Exception) and hasattr(error, "failure_code"):
            wrapped = CollectionError.from_client(error, stage=STAGES.get(run.state, "collection"))
            _fail(run, wrapped.as_failure())
        _fail(run, unexpected_failure(error, STAGES.get(run.state, "orchestration")))
    _persist(run, execution.snapshot(), last)
    return _publish(run, execution.bundle, directory, ctx)


def _seal_behavior(run: OpenEnvRun, directory: Path) -> None:
    """kind train: the sealed contract re-checked, and a named behavior adapter snapshotted privately."""
    from openenv.training import contract as contracts
    from openenv.training.behavior import BehaviorDrift, snapshot_behavior_adapter

    try:
        contracts.check_contract(run.training_contract, run.training_contract_sha256)
    except contracts.ContractInvalid as exc:
        _fail(run, services.failure("persisted_contract_invalid", "admission", str(exc),
                                    hint="submit the run again"))
    try:
        snapshot = snapshot_behavior_adapter(run, directory)
    except BehaviorDrift as exc:
        _fail(run, services.failure(exc.code if exc.code == "training_evidence_invalid" else "run_admission_failed",
                                    "admission", exc.message, retryable=exc.retryable, hint=exc.hint))
    if snapshot is not None:
        services.run_transition(run, from_states=[RunState.DISCOVERING], behavior_snapshot=snapshot)


def _publish(run: OpenEnvRun, bundle, directory: Path, ctx) -> dict:
    # A cancel that came after collection's last check still wins: it was answered 200 with
    # cancel_requested, so the run must not go on to publish (or to train) as if it had not come.
    run.refresh_from_db()
    if run.cancel_requested or _stop_reason(ctx):
        _end_stopped(run, _stop_reason(ctx) or "cancel", ctx)
    try:
        publish(bundle)
    except CollectionError as exc:
        _fail(run, exc.as_failure())
    summary = bundle.summary_value
    artifacts = [{"kind": kind, "file": ARTIFACT_FILES[kind], "sha256": sha256_digest(data), "bytes": len(data)}
                 for kind, data in (("dataset", bundle.dataset), ("replay", bundle.replay),
                                    ("summary", bundle.summary))]
    request = run.request
    progress = {"groups_completed": request["groups"], "groups_total": request["groups"],
                "rollouts_completed": summary["rollout_count"], "rollouts_total": summary["rollout_count"]}
    environments = [environment["identity"] for environment in summary["environments"]]
    train = run.kind == "train"
    from core.contracts.groups import admit_jsonl

    groups = admit_jsonl(bundle.dataset).groups
    warnings = collection_warnings(groups)
    if not services.run_transition(run, from_states=COLLECTION_STATES, unless_cancel_requested=True,
                                   state=RunState.SUBMITTING if train else RunState.ROLLOUT_READY,
                                   stage="training_submission" if train else "artifact_publication",
                                   artifacts=artifacts, progress=progress, environments=environments,
                                   rollout_stats=summary["stats"],
                                   warnings=list(run.warnings or []) + warnings):
        if run.cancel_requested and run.state in COLLECTION_STATES:  # asked for while the files were written
            _end_stopped(run, "cancel", ctx)
        raise KilnError("openenv_run_state_changed", f"run {run.id} became {run.state} during publication")
    if train:
        from openenv.training.submission import submit_training

        return {**submit_training(run, groups),
                "dataset_sha256": summary["dataset_sha256"], "rollouts": summary["rollout_count"]}
    return {"run_id": str(run.id), "state": run.state, "dataset_sha256": summary["dataset_sha256"],
            "rollouts": summary["rollout_count"], "stats": summary["stats"]}
