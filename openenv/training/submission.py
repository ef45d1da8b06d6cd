"""After a train run's artifacts are out: selection, then an ordinary native GRPO job (reference-spec §4.6).

`submit_training(run, groups)` runs in the run's `openenv.run` job with the run `submitting`:
1. the sealed contract must still hash to its digest (else `persisted_contract_invalid`);
2. the behavior identity must be unchanged (openenv.training.behavior; else `training_evidence_invalid`);
3. training selection (openenv.collector.selection): each decision is a warning on the run; when
   nothing is left the run is `completed` with no training job and says why;
4. `training.services.grpo_submit` with the kept groups (canonical AgenticGroups: their action
   segments get the policy gradient, their observation segments ECHO's cross-entropy as the
   contract's `loss.echo` says), exactly the contract's `effective_config` and `post_eval` (the
   receipt's `config_sources` name the fields the server's `[training.defaults]` filled at sealing), in one
   transaction with the run's move to `training_queued` (the GPU worker sees the job only once the
   run names it). A refusal is `training_submission_failed` at stage `training_submission`, its own
   code (e.g. `training_queue_full`) and HTTP status kept in the failure (message, `http_status`).
The run then follows the job (openenv.training.follow).
"""

from __future__ import annotations

from django.db import transaction

from core.errors import KilnError
from openenv.collector.selection import select_for_training, training_data
from openenv.models import OpenEnvRun, RunState
from openenv.runs import services
from openenv.training import contract as contracts
from openenv.training.behavior import BehaviorDrift, check_before_training

STAGE = "training_submission"
NOTHING_LEFT = ("no group carries a usable reward signal after training selection; the run completed "
                "without a training job")


def nothing_left_reason(stats: dict | None) -> str:
    """NOTHING_LEFT, with the likeliest cause when most episodes ended at the model's first invalid
    action: then every group shares the protocol-error return, whatever the environment would pay."""
    stats = stats or {}
    invalid = int(stats.get("invalid_model_action_count") or 0)
    episodes = invalid + sum(int(stats.get(key) or 0) for key in
                             ("done_count", "max_steps_count", "protocol_error_count"))
    if not episodes or invalid * 2 < episodes:
        return NOTHING_LEFT
    return (f"{NOTHING_LEFT}: {invalid} of {episodes} episodes ended at an invalid model action (a reply that "
            "was not one JSON object matching the action schema, which scores the protocol-error reward, or no final "
            "answer after the reasoning, which is left out), so no group kept two different returns")


def _fail(run: OpenEnvRun, code: str, message: str, *, retryable: bool = False, hint: str = "",
          http_status: int | None = None):
    failure = services.failure(code, STAGE, message, retryable=retryable, hint=hint, http_status=http_status)
    services.run_fail(run, failure)
    raise KilnError(failure["code"], failure["message"], hint=failure["hint"])


def submit_training(run: OpenEnvRun, groups: list[dict]) -> dict:
    try:
        contract = contracts.check_contract(run.training_contract, run.training_contract_sha256)
    except contracts.ContractInvalid as exc:
        _fail(run, "persisted_contract_invalid", str(exc), hint="submit the run again")
    try:
        check_before_training(run)
    except BehaviorDrift as exc:
        _fail(run, exc.code if exc.code == "training_evidence_invalid" else "training_submission_failed",
              exc.message, retryable=exc.retryable, hint=exc.hint)
    selection = select_for_training(groups)
    lineage = training_data(selection.groups, selection.indexes) if selection.groups else None
    services.run_transition(run, from_states=[RunState.SUBMITTING], training_selection=selection.summary,
                            training_data=lineage, warnings=list(run.warnings or []) + selection.warnings)
    run.refresh_from_db()
    if run.cancel_requested:
        services.run_mark_cancelled(run, reason="cancelled before training was submitted")
        from core.jobs.runner import JobCancelled

        raise JobCancelled()
    if not selection.groups:
        reason = nothing_left_reason(run.rollout_stats)
        services.run_transition(run, from_states=[RunState.SUBMITTING], state=RunState.COMPLETED, stage=STAGE,
                                error=reason)
        return {"run_id": str(run.id), "state": run.state, "training_job_id": None, "reason": reason}
    from training.services import grpo_submit

    body = {"groups": selection.groups, "config": contract["effective_config"]}
    if contract.get("post_eval") is not None:
        body["post_eval"] = contract["post_eval"]
    try:
        with transaction.atomic():
            sources = contracts.config_sources((run.request or {}).get("training_config"),
                                               contract["effective_config"])
            job, seed = grpo_submit(body=body, user=run.submitted_by, route="/v1/train/grpo",
                                    sealed_sources=sources, openenv_lineage=lineage)
            submission = {"job_id": str(job.uuid), "state": "queued", "effective_seed": str(seed),
                          "message": f"GRPO training queued; it will publish adapter "
                                     f"{contract['effective_config']['output_name']}"}
            if not services.run_transition(run, from_states=[RunState.SUBMITTING], state=RunState.TRAINING_QUEUED,
                                           stage="training", training_job=job, training_submission=submission):
                raise KilnError("openenv_run_state_changed", f"run {run.id} became {run.state} during submission")
    except KilnError as exc:
        run.refresh_from_db()
        if run.is_terminal:
            raise
        _fail(run, "training_submission_failed", f"the training submission was refused: {exc.code}: {exc.message}",
              retryable=exc.status == 503, hint=exc.hint, http_status=exc.status)
    from openenv.training.follow import run_follow

    run_follow(run)
    return {"run_id": str(run.id), "state": run.state, "training_job_id": submission["job_id"],
            "effective_seed": submission["effective_seed"], "groups_submitted": selection.summary["groups_submitted"]}
