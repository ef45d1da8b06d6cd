"""A train run's environment evaluation: the `openenv.environment_eval` job (control queue) (reference-spec
§1.6, §4.10-4.12).

- `environment_eval_start(run, from_states=..., **fields)` is called by the follower
  (openenv.training.follow) once training published its adapter (and any post-eval finished) and the
  request carries `environment_eval`: in one transaction the run moves to `environment_evaluating`
  (its status block `environment_evaluation {state: pending, ...}`) and this kind's job is queued.
  A refused job (a full control queue) fails the run at stage `environment_evaluation`, retryable;
  a cancel asked for meanwhile cancels the run instead.
- `run_environment_eval_job(ctx)`: waits for the served model (`make_policy_factory`: a policy per
  adapter through the infer queue, as the collection's `openenv.runs.jobs.make_policy`), then
  `openenv.environment_eval.run_environment_eval` on the training collection's own config: baseline =
  the behavior adapter (its private snapshot's revision) or base, candidate = the published output
  adapter (its content revision), the training contract's behavior policy as the baseline's expected
  identity. Progress goes into the status block (`collecting_baseline`, `collecting_candidate`, with
  the side's counts). Then `openenv.environment_promotion.environment_eval_conclude` acts on the
  outcome (passed + auto_load → the promotion workflow; passed without → kept; rejected or
  inconclusive → never served; no gate → diagnostic) and appends the receipt, in the transaction
  that adds the six side artifacts and `environment_eval_receipt` (files under
  `environment-evaluation/`) to the manifest and completes the run.
- A failure is the run's typed failure at stage `environment_evaluation` (`exc.as_failure()`); a
  cancellation (cooperative: the collection in flight is cancelled, nothing is published) ends the
  run `cancelled`; a worker shutdown fails it `run_interrupted` at `restoration` (as restoration does
  for a run found in this state with nobody executing it, openenv.runs.services.runs_restore).
Imports no torch.
"""

from __future__ import annotations

from django.conf import settings
from django.db import OperationalError, transaction
from django.utils import timezone

from core.errors import KilnError
from openenv.collector import CollectionError
from openenv.collector.config import adapter_name
from openenv.environment_eval import (
    EnvironmentEvalCancelled,
    EnvironmentEvalError,
    EvalPlan,
    EvalPolicy,
    run_environment_eval,
)
from openenv.models import OpenEnvRun, RunState
from openenv.runs import services

JOB_KIND = "openenv.environment_eval"
STAGE = "environment_evaluation"
OUT_DIR = "environment-evaluation"
PROGRESS_KEYS = ("side", "groups_completed", "groups_total", "rollouts_completed", "rollouts_total")


class _StateChanged(Exception):
    pass


def wants_environment_eval(run: OpenEnvRun) -> bool:
    return run.kind == "train" and (run.request or {}).get("environment_eval") is not None


def plan_of(run: OpenEnvRun) -> EvalPlan:
    request = run.request
    return EvalPlan.of(request["environment_eval"], train_seed_start=request["seed_start"],
                       train_groups=request["groups"])


def _candidate_revision(run: OpenEnvRun) -> str | None:
    from adapters.models import Adapter, AdapterState

    row = Adapter.objects.filter(name=run.request["output_adapter"], state=AdapterState.PUBLISHED,
                                 training_job_id=run.training_job_id).first()
    return row.content_sha256 if row is not None and row.content_sha256 else None


def policies_of(run: OpenEnvRun) -> tuple[EvalPolicy, EvalPolicy]:
    """(baseline, candidate): the behavior adapter (or base) and the output adapter the training published."""
    snapshot = run.behavior_snapshot or {}
    baseline = EvalPolicy(adapter_name(run.request["adapter"]), content_sha256=snapshot.get("content_sha256"))
    revision = _candidate_revision(run)
    if revision is None:
        raise EnvironmentEvalError("environment_eval_candidate_missing",
                                   f"the output adapter {run.request['output_adapter']!r} of training job "
                                   f"{run.training_job.uuid if run.training_job else None} is not published",
                                   failure_code="training_evidence_invalid",
                                   hint="the trained adapter was removed (or demoted) before it could be evaluated")
    return baseline, EvalPolicy(run.request["output_adapter"], content_sha256=revision)


def _side(policy: EvalPolicy) -> dict:
    return {"adapter": policy.adapter, "adapter_content_revision": policy.content_sha256}


def pending_block(run: OpenEnvRun, plan: EvalPlan, baseline: EvalPolicy, candidate: EvalPolicy) -> dict:
    rollouts = plan.groups * plan.group_size
    return {"state": "pending", "seed_start": plan.seed_start, "groups": plan.groups, "group_size": plan.group_size,
            "gate": plan.to_json().get("gate"), "baseline": _side(baseline), "candidate": _side(candidate),
            "progress": {"side": None, "groups_completed": 0, "groups_total": plan.groups, "rollouts_completed": 0,
                         "rollouts_total": rollouts}}


def _fail(run: OpenEnvRun, failure: dict):
    services.run_fail(run, failure)
    raise KilnError(failure["code"], failure["message"], hint=failure.get("hint", ""))


# --- the start (the follower) ----------------------------------------------------------------------

def environment_eval_start(run: OpenEnvRun, *, from_states, **fields) -> bool:
    """Move the run to environment_evaluating and queue its job (one transaction); whether the run changed."""
    from core.jobs.services import job_submit

    if run.cancel_requested:
        return services.run_mark_cancelled(run, reason="cancelled before the environment evaluation started")
    try:
        plan = plan_of(run)
        baseline, candidate = policies_of(run)
    except EnvironmentEvalError as exc:
        return services.run_transition(run, from_states=from_states, state=RunState.FAILED, stage=STAGE,
                                       failure=exc.as_failure(), **fields)
    try:
        with transaction.atomic():
            job = job_submit(kind=JOB_KIND, payload={"run_id": str(run.id)}, user=run.submitted_by,
                             title=f"OpenEnv environment evaluation {str(run.id)[:8]}")
            if not services.run_transition(run, from_states=from_states, state=RunState.ENVIRONMENT_EVALUATING,
                                           stage=STAGE, environment_eval_job=job,
                                           environment_evaluation=pending_block(run, plan, baseline, candidate),
                                           **fields):
                raise _StateChanged()
    except _StateChanged:
        return False
    except KilnError as exc:
        failure = services.failure("environment_evaluation_failed", STAGE,
                                   f"the environment evaluation could not be queued: {exc.code}: {exc.message}",
                                   retryable=exc.status == 503, hint=exc.hint)
        return services.run_transition(run, from_states=from_states, state=RunState.FAILED, stage=STAGE,
                                       failure=failure, **fields)
    return True


# --- the job ---------------------------------------------------------------------------------------

def _chat_post():
    from openenv.runs import jobs

    return jobs._chat_post()


def make_policy_factory(run: OpenEnvRun, ctx):
    """adapter name (None: base) -> the served model's policy with that adapter, once the model is ready."""
    from adapters.serving.selectors import wait_for_inference_ready
    from openenv.collector import ChatCompletionPolicy

    wait_for_inference_ready(ctx)
    return lambda adapter: ChatCompletionPolicy(_chat_post(), adapter=adapter)


class _Persist:
    """on_progress: the status block's state and counts (the record rewritten when the state changes)."""

    def __init__(self, run: OpenEnvRun):
        self.run = run

    def __call__(self, snapshot: dict) -> None:
        run = self.run
        block = dict(run.environment_evaluation or {})
        changed = block.get("state") != snapshot["state"]
        block.update(state=snapshot["state"], progress={k: snapshot.get(k) for k in PROGRESS_KEYS})
        try:
            if changed:
                services.run_transition(run, from_states=[RunState.ENVIRONMENT_EVALUATING],
                                        environment_evaluation=block)
            else:
                OpenEnvRun.objects.filter(id=run.id, state=RunState.ENVIRONMENT_EVALUATING).update(
                    environment_evaluation=block, updated_at=timezone.now())
                run.environment_evaluation = block
        except OperationalError:
            return  # a locked database: the next change writes the newer counts


def _stopped(run: OpenEnvRun, ctx):
    from openenv.runs.jobs import _end_stopped, _stop_reason

    run.refresh_from_db()
    _end_stopped(run, _stop_reason(ctx) or "cancel", ctx)


def run_environment_eval_job(ctx) -> dict:
    from openenv.runs.jobs import run_stage_job

    run = OpenEnvRun.objects.select_related("training_job").filter(id=ctx.payload["run_id"]).first()
    return run_stage_job(ctx, run, RunState.ENVIRONMENT_EVALUATING, STAGE, _evaluate)


def _evaluate(ctx, run: OpenEnvRun) -> dict:
    from openenv.runs.jobs import run_credentials
    from openenv.runs.request import collection_config
    from openenv.runs.selectors import run_dir_for

    if run.cancel_requested or ctx.should_stop():
        _stopped(run, ctx)
    request = run.request
    directory = run_dir_for(run)
    try:
        plan = plan_of(run)
        baseline, candidate = policies_of(run)
    except EnvironmentEvalError as exc:
        _fail(run, exc.as_failure())
    try:
        factory = make_policy_factory(run, ctx)
    except KilnError as exc:
        _fail(run, services.failure("environment_evaluation_failed", STAGE,
                                    f"the model service is not ready: {exc.code}: {exc.message}",
                                    retryable=exc.status == 503, hint=exc.hint))
    expected = (run.training_data or {}).get("behavior_policy") or \
        (run.training_contract or {}).get("behavior_policy")
    try:
        result = run_environment_eval(
            base=collection_config(request, directory, credentials=run_credentials(run, STAGE),
                                   reply_timeout_s=settings.KILN.openenv_reply_timeout_secs), plan=plan,
            baseline=baseline, candidate=candidate,
            out_dir=directory / OUT_DIR, policy_factory=factory, expected_behavior=expected,
            trained_on=list(run.environments or []),
            should_stop=ctx.should_stop, on_progress=_Persist(run))
    except EnvironmentEvalCancelled:
        _stopped(run, ctx)
    except CollectionError as exc:  # EnvironmentEvalError included
        failure = exc.as_failure()
        failure["stage"] = STAGE
        if failure["code"] == "collection_failed":  # the held-out collection: the evaluation's own code
            failure["code"] = "environment_evaluation_failed"
        _fail(run, failure)
    return _conclude(ctx, run, result)


def _entry(artifact: dict) -> dict:
    return {"kind": artifact["kind"], "file": f"{OUT_DIR}/{artifact['file']}", "sha256": artifact["sha256"],
            "bytes": artifact["bytes"]}


def _conclude(ctx, run: OpenEnvRun, result) -> dict:
    from openenv.environment_promotion import environment_eval_conclude

    run.refresh_from_db()
    if run.cancel_requested:
        _stopped(run, ctx)
    try:
        with transaction.atomic():
            conclusion = environment_eval_conclude(result=result, run_id=run.id, request=run.request, job=ctx.job,
                                                   user=ctx.job.submitted_by)
            artifacts = [a for a in run.artifacts or [] if not a["kind"].startswith("environment_eval_")]
            artifacts += [_entry(a) for a in [*result.artifacts, conclusion.artifact]]
            block = {**result.status(outcome=conclusion.outcome), "gate": result.plan.to_json().get("gate"),
                     "receipt_sha256": conclusion.receipt_sha256, "promotion": conclusion.receipt.get("promotion")}
            if not services.run_transition(run, from_states=[RunState.ENVIRONMENT_EVALUATING],
                                           state=RunState.COMPLETED, stage=STAGE, artifacts=artifacts,
                                           environment_evaluation=block):
                raise KilnError("openenv_run_state_changed", f"run {run.id} became {run.state} while its "
                                "environment evaluation concluded")
    except EnvironmentEvalError as exc:
        _fail(run, exc.as_failure())
    except KilnError as exc:
        run.refresh_from_db()
        if run.is_terminal:
            raise
        _fail(run, services.failure("environment_evaluation_failed", STAGE,
                                    f"the outcome could not be recorded: {exc.code}: {exc.message}", hint=exc.hint))
    return {"run_id": str(run.id), "state": run.state, "decision": result.decision, "outcome": conclusion.outcome,
            "receipt_sha256": conclusion.receipt_sha256, "promotion_id": conclusion.promotion_id,
            "activation_job_id": conclusion.activation_job_id}
