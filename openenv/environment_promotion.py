"""What an environment evaluation's outcome does to the candidate adapter, and its receipt (reference-spec
§2.8, §4.11; the guide's "only one gate can own promotion").

    owner = promotion_owner(run.request)             # environment_gate | post_eval_gate | auto_load | None
    training_auto_load(run.request)                  # the auto_load the training submission must carry
    conclusion = environment_eval_conclude(result=result, run_id=run.id, request=run.request, job=job)
    conclusion.outcome, conclusion.artifact, conclusion.receipt_row

One promotion owner (spec §1.6 "`gate` ... excludes `post_eval.min_accuracy`", seed 89 "static xor
environment gate"): a request with both gates is refused (`openenv_promotion_owner_conflict`, the
request normalizer refuses it at admission already). With `environment_eval.gate` the environment
gate owns promotion: training must publish the adapter without loading it (a gate defers loading,
`training_auto_load` is false) and any `post_eval` suite is diagnostic only. With
`post_eval.min_accuracy` the static gate owns it and the environment evaluation is diagnostic (no gate
is allowed then). With neither, training's own `auto_load` decides and the evaluation is diagnostic.

Outcome -> adapter (the environment gate owns promotion):
- `passed` + auto_load -> `promoted`: through the promotion workflow, like
  `adapters.promotions.promotion_after_gate`: with `[promotion] require_approval` on, or a
  reward-hacking alarm (`adapters.promotion_evidence`), a pending promotion a person decides;
  otherwise an `adapter.activate` job (`adapters.activation.activation_submit`): serving canary,
  then active, with its activation receipt. If the candidate is missing, not published, already
  active, or its bytes are not the revision that was evaluated, the outcome is `error` and nothing
  is served.
- `passed` without auto_load -> `kept` (published and available, not served);
- `rejected` / `inconclusive` -> never served (left published, not loaded);
- `diagnostic` -> no action.
The receipt (`kiln.openenv-environment-evaluation.v1`, with a `promotion` block saying what was done)
is appended as a `ReceiptKind.ENVIRONMENT_EVAL` row (subject: the candidate adapter) and published as
`receipt.json` (its canonical bytes) in the transaction that requests the promotion or activation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.db import transaction

from core.errors import KilnError
from core.models import Receipt, ReceiptKind
from core.receipts import receipt_record
from evaluations.metrics import count_gate_decision
from openenv.environment_eval import EnvironmentEvalResult, publish_receipt, receipt_digest
from openenv.environment_gate import final_outcome

OWNERS = ("environment_gate", "post_eval_gate", "auto_load")


def _has_env_gate(request: Mapping) -> bool:
    value = request.get("environment_eval")
    return isinstance(value, Mapping) and value.get("gate") is not None


def _has_static_gate(request: Mapping) -> bool:
    value = request.get("post_eval")
    return isinstance(value, Mapping) and value.get("min_accuracy") is not None


def promotion_owner(request: Mapping) -> str | None:
    """Who decides whether the trained adapter is served: exactly one of OWNERS, or None (nobody loads it)."""
    if _has_env_gate(request) and _has_static_gate(request):
        raise KilnError("openenv_promotion_owner_conflict", "environment_eval.gate and post_eval.min_accuracy "
                        "both want to own promotion; only one gate may", status=400, field="environment_eval.gate",
                        hint="drop post_eval.min_accuracy (keep the suite as a diagnostic) or the environment gate")
    if _has_env_gate(request):
        return "environment_gate"
    if _has_static_gate(request):
        return "post_eval_gate"
    return "auto_load" if request.get("auto_load", True) else None


def training_auto_load(request: Mapping) -> bool:
    """The `auto_load` override of the training submission: the request's, except that an environment gate
    defers loading to its own outcome (the static gate defers inside the training/post-eval flow itself)."""
    return bool(request.get("auto_load", True)) and promotion_owner(request) != "environment_gate"


@dataclass
class Conclusion:
    outcome: str                    # diagnostic | promoted | kept | rejected | inconclusive | error
    receipt: dict                   # the receipt body
    receipt_sha256: str             # sha256 of its canonical JSON (= the row's, = receipt.json's bytes)
    receipt_row: Receipt
    artifact: dict                  # the environment_eval_receipt manifest entry
    promotion_id: int | None = None
    activation_job_id: str | None = None
    error: dict | None = None


def _gate_evidence(result: EnvironmentEvalResult, run_id: str, outcome: str) -> dict:
    """The evidence a promotion is decided on (stored with the promotion row; its digest is bound)."""
    return {**result.gate.evidence, "gate": "environment", "outcome": outcome, "openenv_run_id": str(run_id),
            "baseline_adapter": result.baseline.policy.adapter, "candidate_adapter": result.candidate.policy.adapter,
            "baseline_summary_sha256": result.baseline.summary_sha256,
            "candidate_summary_sha256": result.candidate.summary_sha256}


def _promote(result: EnvironmentEvalResult, run_id: str, job, user) -> dict:
    """A passed gate with auto_load: a pending promotion (approval policy or an alarm), else activation."""
    from adapters.activation import activation_submit
    from adapters.models import Adapter, AdapterState
    from adapters.promotions import approval_required, promotion_alarms, promotion_evidence, promotion_request
    from adapters.selectors import adapter_active

    name = result.candidate.policy.adapter
    adapter = Adapter.objects.select_related("training_job").filter(name=name).first()
    if adapter is None or adapter.state != AdapterState.PUBLISHED:
        raise KilnError("adapter_not_found", f"the candidate {name!r} is not a published adapter", status=409)
    evaluated = result.candidate.identity()["adapter_content_revision"]
    if evaluated and adapter.content_sha256 != evaluated:
        raise KilnError("adapter_changed", f"the candidate {name!r} is now {adapter.content_sha256}, but "
                        f"{evaluated} was evaluated", status=409, hint="evaluate the adapter again")
    active = adapter_active()
    if active is not None and active.name == name:
        raise KilnError("adapter_active", f"the candidate {name!r} is already active: the gate did not defer its "
                        "loading", status=409, hint="a gated run submits its training with auto_load false")
    evidence = _gate_evidence(result, run_id, "promoted")
    alarms = promotion_alarms(promotion_evidence(adapter=adapter, gate=evidence))
    if approval_required() or alarms:
        reason = "environment gate passed" + ("; flagged: " + "; ".join(alarms) if alarms else "")
        promotion = promotion_request(candidate=name, user=user, reason=reason, evidence=evidence, job=job)
        return {"action": "promotion_requested", "promotion_id": promotion.id, "alarms": list(promotion.alarms or [])}
    activation = activation_submit(name=name, reason=f"environment gate passed (OpenEnv run {run_id})", job=job,
                                   actor=user)
    return {"action": "activation_submitted", "activation_job_id": str(activation.uuid), "alarms": []}


def environment_eval_conclude(*, result: EnvironmentEvalResult, run_id, request: Mapping, job=None,
                              user=None) -> Conclusion:
    """Act on the outcome, then record and publish the receipt, in one transaction (see the module doc)."""
    owner = promotion_owner(request)
    auto_load = bool(request.get("auto_load", True))
    decision = result.decision
    if decision != "diagnostic" and owner != "environment_gate":
        raise KilnError("openenv_promotion_owner_conflict", f"the environment gate decided {decision!r}, but "
                        f"{owner or 'nobody'} owns promotion for this run", status=409)
    outcome = final_outcome(decision, auto_load)
    name = result.candidate.policy.adapter
    block: dict = {"owner": owner, "candidate": name, "auto_load": auto_load}
    error = None
    with transaction.atomic():
        if outcome == "promoted":
            try:
                with transaction.atomic():
                    block.update(_promote(result, str(run_id), job, user))
            except KilnError as exc:
                outcome, error = "error", {"code": exc.code, "message": exc.message}
                block.update(action="none", error=error)
        elif outcome == "kept":
            block["action"] = "kept"          # published and available, not served
        elif outcome in ("rejected", "inconclusive"):
            block["action"] = "not_served"
        else:
            block["action"] = "none"          # diagnostic: the owner (if any) decides elsewhere
        body = result.receipt(run_id=str(run_id), outcome=outcome, promotion=block)
        row = receipt_record(kind=ReceiptKind.ENVIRONMENT_EVAL, subject=name or "base", body=body, job=job)
        count_gate_decision("environment", outcome)
        artifact = publish_receipt(result, body)
    return Conclusion(outcome=outcome, receipt=body, receipt_sha256=receipt_digest(body), receipt_row=row,
                      artifact=artifact, promotion_id=block.get("promotion_id"),
                      activation_job_id=block.get("activation_job_id"), error=error)
