"""The `training.post_eval` job (control queue): evaluate a freshly trained adapter, then let the
held-out gate decide whether it is activated (reference-spec §1.1, §4.11, §5).

The training job publishes the adapter (inactive while a gate is pending) and queues this job in
the same transaction. It then:
1. checks the suite is still the one admitted at submission (its hash was pinned);
2. queues one eval job (`eval.run` in compare mode) over the suite with the baseline (the adapter
   active before training, or the base model) and the candidate as its two targets: both are
   sampled with the same per-example seeds and the same effective-generation hash, paired by
   example id. Without a gate and without `include_baseline` only the candidate is evaluated;
3. waits for it (cancelling it if this job is cancelled);
4. with `min_accuracy`, applies `paired_wilson_v1` (`evaluations.gate`): `promoted` activates the
   adapter when auto_load is on (`kept` otherwise) -- or, with `[promotion] require_approval` or a
   reward-hacking alarm, proposes a pending promotion instead (`promotion_id` in the result;
   `adapters.promotions`), `demoted` removes it (its folder becomes
   `<name>.failed`), `regression`, `inconclusive` and `error` leave it published and unserved while
   the previous adapter keeps serving;
5. appends the gate's evidence as a receipt row (and one for the activation), in the transaction
   that applies the decision.

Training completion (the training job's `finished_at`), the evaluation outcome (this job) and the
activation are three recorded states, each with its time (`training.selectors.post_eval_state`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.contracts.grpo_submission import PostEvalConfig
from core.errors import KilnError
from core.models import ReceiptKind
from core.receipts import receipt_record

POLL_SECONDS = 0.5
GATE_SCHEMA = "kiln.post-eval-gate.v1"
KIND = "training.post_eval"


@dataclass(frozen=True)
class PostEvalJobPayload:
    training_job_id: str
    adapter_name: str
    post_eval: PostEvalConfig
    suite_hash: str
    baseline_adapter: str | None  # the adapter active before training; None: the base model
    auto_load: bool
    extra: dict = field(default_factory=dict)

    @property
    def gated(self) -> bool:
        return self.post_eval.min_accuracy is not None

    @property
    def with_baseline(self) -> bool:
        return self.gated or self.post_eval.include_baseline

    @classmethod
    def of(cls, job) -> PostEvalJobPayload:
        return cls.from_dict(job.payload)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PostEvalJobPayload:
        return cls(training_job_id=str(data["training_job_id"]), adapter_name=data["adapter_name"],
                   post_eval=PostEvalConfig.from_dict(data["post_eval"]), suite_hash=data["suite_hash"],
                   baseline_adapter=data.get("baseline_adapter"), auto_load=bool(data.get("auto_load")))

    def to_dict(self) -> dict[str, Any]:
        return {"training_job_id": self.training_job_id, "adapter_name": self.adapter_name,
                "post_eval": self.post_eval.to_dict(), "suite_hash": self.suite_hash,
                "baseline_adapter": self.baseline_adapter, "auto_load": self.auto_load}


def post_eval_submit(*, training_job, adapter_name: str, post_eval: PostEvalConfig, suite_hash: str,
                     auto_load: bool, user=None):
    """Queue the post-eval of a just-published adapter (called inside the publishing transaction)."""
    from adapters.selectors import adapter_active
    from core.jobs.services import job_submit

    active = adapter_active(excluding=adapter_name)
    payload = PostEvalJobPayload(training_job_id=str(training_job.uuid), adapter_name=adapter_name,
                                 post_eval=post_eval, suite_hash=suite_hash,
                                 baseline_adapter=active.name if active else None, auto_load=auto_load)
    return job_submit(kind=KIND, payload=payload, title=f"Post-eval · {post_eval.suite} · {adapter_name}",
                      user=user or training_job.submitted_by, follow_up=True)


def _wait_for(ctx, eval_job):
    from core.jobs.models import Job
    from core.jobs.services import job_cancel

    terminal = ("completed", "failed", "cancelled")
    while True:
        eval_job = Job.objects.get(id=eval_job.id)
        if eval_job.state in terminal:
            return eval_job
        if ctx.should_stop():
            try:
                job_cancel(job=eval_job, system=True)
            except KilnError as exc:  # it ended, or is publishing its results: the gate decides nothing all the same
                if exc.code != "job_not_cancellable":
                    raise
            from core.jobs.runner import JobCancelled

            raise JobCancelled()
        ctx.report_progress(0.1 + 0.8 * float(eval_job.progress or 0.0), "evaluating",
                            metrics={"eval_job_id": str(eval_job.uuid)})
        time.sleep(POLL_SECONDS)


def _arms(payload: PostEvalJobPayload, eval_job, records: list[dict]):
    from evaluations.gate import GateArm

    result = eval_job.result or {}
    suite = eval_job.payload["suite"]
    arms = []
    for index, adapter in enumerate((payload.baseline_adapter, payload.adapter_name)):
        outcomes = {r["example_id"]: r["outcome"] for r in records if r["target_index"] == index}
        arms.append(GateArm(adapter=adapter, suite_name=suite["name"], suite_hash=suite["suite_hash"],
                            effective_generation_hash=result.get("effective_generation_hash")
                            or eval_job.payload["effective_generation_hash"], outcomes=outcomes))
    return arms


def _verdict(eval_job, payload: PostEvalJobPayload) -> str:
    targets = (eval_job.result or {}).get("targets") or []
    parts = []
    for target in targets:
        accuracy = target.get("accuracy")
        shown = "n/a" if accuracy is None else f"{accuracy:.3f}"
        parts.append(f"{target.get('label')}: {target['counts']['pass']}/{target.get('total')} pass ({shown})")
    return f"{payload.post_eval.suite}: " + "; ".join(parts)


def _error_evidence(payload: PostEvalJobPayload, eval_job_id: str | None, reason: str) -> dict:
    return {"policy_version": "paired_wilson_v1", "suite_policy": payload.post_eval.data_scope,
            "eval_job_id": eval_job_id, "suite_name": payload.post_eval.suite, "suite_hash": payload.suite_hash,
            "baseline_adapter": payload.baseline_adapter, "candidate_adapter": payload.adapter_name,
            "minimum_accuracy": payload.post_eval.min_accuracy, "outcome": "error", "reason": reason}


def _apply(ctx, payload: PostEvalJobPayload, outcome: str, evidence: dict | None, eval_job_id: str | None,
           verdict: str) -> dict:
    """Record the gate, then act on it: `promoted` activates through the serving canary (or proposes a
    promotion when the policy asks for a person, or an alarm fired), `demoted` retires the adapter."""
    from adapters.activation import activate_with_canary
    from adapters.promotions import promotion_after_gate
    from adapters.services import adapter_demote
    from evaluations.metrics import count_gate_decision

    activated_at = demoted_to = promotion = activation_error = canary = None
    with transaction.atomic():
        ctx.begin_publishing()  # a cancel that came while the evaluation ended stops it before any decision
        if outcome == "promoted":
            # [promotion] require_approval, or a reward-hacking alarm: propose; a person approves.
            promotion = promotion_after_gate(candidate=payload.adapter_name, evidence=evidence, job=ctx.job,
                                             user=ctx.job.submitted_by)
        elif outcome == "demoted":
            moved = adapter_demote(name=payload.adapter_name, reason="post_eval gate: demoted below the floor",
                                   job=ctx.job)
            demoted_to = str(moved) if moved else None
        if evidence is not None:
            receipt_record(kind=ReceiptKind.POST_EVAL_GATE, subject=payload.adapter_name, job=ctx.job, body={
                "schema": GATE_SCHEMA, "training_job_id": payload.training_job_id, "evidence": evidence})
            count_gate_decision("post_eval", outcome)
    if outcome == "promoted" and promotion is None:
        try:
            _, canary = activate_with_canary(
                name=payload.adapter_name, reason="post_eval gate passed", job=ctx.job,
                receipt_extra={"gate_outcome": outcome, "training_job_id": payload.training_job_id,
                               "eval_job_id": eval_job_id})
            activated_at = timezone.now().isoformat()
        except KilnError as exc:  # the canary failed (quarantined) or could not run: the previous adapter stays
            activation_error = {"code": exc.code, "message": exc.message}
            ctx.log("not activated", activation_error)
    return {"gate_outcome": outcome, "post_eval_gate_evidence": [evidence] if evidence else [],
            "post_eval_verdict": verdict, "linked_eval_job_ids": [eval_job_id] if eval_job_id else [],
            "evaluated_at": timezone.now().isoformat(), "activated_at": activated_at,
            "activation_error": activation_error, "canary_sha256": canary["sha256"] if canary else None,
            "demoted_to": demoted_to, "adapter_name": payload.adapter_name,
            "promotion_id": promotion.id if promotion is not None else None,
            "promotion_alarms": list(promotion.alarms or []) if promotion is not None else []}


def run_post_eval_job(ctx) -> dict:
    from evaluations.eval_selectors import eval_records
    from evaluations.eval_services import eval_submit
    from evaluations.gate import final_outcome, paired_wilson_v1
    from evaluations.suite_selectors import suite_get

    payload = PostEvalJobPayload.of(ctx.job)
    suite = suite_get(name=payload.post_eval.suite)
    if suite is None or suite.suite_hash != payload.suite_hash:
        reason = (f"suite {payload.post_eval.suite!r} was removed or changed after the training was admitted "
                  f"(admitted {payload.suite_hash})")
        outcome = "error" if payload.gated else None
        evidence = _error_evidence(payload, None, reason) if payload.gated else None
        return {**_apply(ctx, payload, outcome, evidence, None, reason), "error": reason}
    targets = [payload.baseline_adapter, payload.adapter_name] if payload.with_baseline else [payload.adapter_name]
    body = {"suite_name": payload.post_eval.suite, "generation": payload.post_eval.generation or {}}
    try:
        eval_job = eval_submit(body={**body, "adapters": targets}, mode="compare", user=ctx.job.submitted_by)
    except KilnError as exc:
        reason = f"the evaluation could not be queued: {exc.code}: {exc.message}"
        evidence = _error_evidence(payload, None, reason) if payload.gated else None
        return _apply(ctx, payload, "error" if payload.gated else None, evidence, None, reason)
    eval_id = str(eval_job.uuid)
    ctx.log("evaluation queued", {"eval_job_id": eval_id, "targets": targets})
    ctx.report_progress(0.1, "evaluating", metrics={"eval_job_id": eval_id})
    eval_job = _wait_for(ctx, eval_job)
    records = eval_records(job=eval_job) if eval_job.state == "completed" else None
    if records is None:
        error = eval_job.error or {}
        reason = f"the evaluation ended {eval_job.state}: {error.get('code', '')} {error.get('message', '')}".strip()
        evidence = _error_evidence(payload, eval_id, reason) if payload.gated else None
        return _apply(ctx, payload, "error" if payload.gated else None, evidence, eval_id, reason)
    verdict = _verdict(eval_job, payload)
    if not payload.gated:
        return _apply(ctx, payload, None, None, eval_id, verdict)
    baseline, candidate = _arms(payload, eval_job, records)
    gate = paired_wilson_v1(baseline=baseline, candidate=candidate, eval_job_id=eval_id,
                            min_accuracy=payload.post_eval.min_accuracy, candidate_adapter=payload.adapter_name)
    outcome = final_outcome(gate.decision, payload.auto_load)
    evidence = {**gate.evidence, "suite_policy": payload.post_eval.data_scope, "outcome": outcome}
    ctx.report_progress(1.0, f"gate: {outcome}")
    return _apply(ctx, payload, outcome, evidence, eval_id, f"{verdict}. Gate: {outcome}. {gate.reason}")
