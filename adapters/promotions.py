"""Promotions (issue 13): a request to make a candidate adapter the active one, decided by a person.

    promotion_request(candidate="math-r002", user=alice, reason="round two")    # pending
    promotion_approve(promotion_id=p.id, user=bob, reason="better on held-out")  # approved: canary runs
    # ... its adapter.activate job: canary passed -> applied (active); failed or died -> failed
    promotion_reject(promotion_id=p.id, user=bob, reason="alarm is real")        # rejected

Policy (`[promotion]` in kiln.toml, `settings.KILN`): `require_approval` (default: on whenever more
than one active user exists) makes a passed post-eval gate propose a promotion instead of activating
(`promotion_after_gate`); `allow_self_approval` lets the requester approve their own request.

Every request appends a `promotion` receipt row and every decision an `approval` row (same receipts
table) binding the candidate's content digest, the evidence digest, the decision, the person and the
time; `adapters.verify` checks them (link `promotion`).

Reward-hacking alarms (`adapters.promotion_evidence`): e.g. the training reward rose (first vs last points of the
reward history) while the held-out candidate accuracy is below the baseline's. A flagged promotion is
never applied automatically; a person may approve it, and the approval receipt records the override.

Two approvals at once apply once: the decision claims the row with a conditional UPDATE
(`state = pending`) as the first statement of its transaction, then locks it (select_for_update), so
PostgreSQL blocks the second on the row lock and SQLite serialises the writers; the loser sees 0 rows
and answers `promotion_not_pending`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adapters.models import Adapter, AdapterState, Promotion, PromotionState
from adapters.promotion_evidence import promotion_alarms, promotion_evidence, reward_trend  # noqa: F401 (re-exported)
from core.accounts.permissions import APPROVE_PROMOTION, approval_required  # noqa: F401 (re-exported)
from core.canonical import json_digest
from core.db_locks import REGISTRY, serialize
from core.errors import KilnError
from core.models import Receipt, ReceiptKind
from core.receipts import receipt_record

PROMOTION_SCHEMA = "kiln.promotion.v1"
APPROVAL_SCHEMA = "kiln.promotion-approval.v1"
APPROVE_PERMISSION = APPROVE_PROMOTION


# -- policy ----------------------------------------------------------------------------------------

def self_approval_allowed(user=None) -> bool:
    """`[promotion] allow_self_approval`, or no other active user who may approve: nobody else could
    (QA: on a one-user install, or with only viewers beside the admin, a promotion pending for its
    alarms could never be approved)."""
    if getattr(settings.KILN, "promotion_allow_self_approval", False):
        return True
    from django.contrib.auth import get_user_model

    others = get_user_model().objects.filter(is_active=True).exclude(pk=getattr(user, "pk", None))
    return not any(other.has_perm(APPROVE_PROMOTION) for other in others.iterator())


# -- errors ----------------------------------------------------------------------------------------

def _not_found(promotion_id) -> KilnError:
    return KilnError("promotion_not_found", f"no promotion {promotion_id}", status=404,
                     hint="list promotions with GET /v1/promotions (kiln promotions list)")


MAX_REASON_CHARS = 2000  # like every other free text (descriptions)
# Control characters other than tab and newline (C0, DEL, C1): a reason is shown on pages, in
# terminals (`kiln promotions show`) and in receipts, where an escape sequence must never travel.
_CONTROL = frozenset(chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)))


def _check_reason(reason) -> str:
    """A person's reason, stripped, with a browser's CRLF line breaks as newlines: at most
    MAX_REASON_CHARS characters, no control characters but tab and newline (a lone CR included).
    Refused with validation_error."""
    reason = (reason or "").replace("\r\n", "\n").strip()
    if len(reason) > MAX_REASON_CHARS:
        raise KilnError("validation_error", f"reason: at most {MAX_REASON_CHARS} characters, got {len(reason)}",
                        status=422, field="reason", hint="shorten the reason; link to a longer note if needed")
    bad = next((ch for ch in reason if ch in _CONTROL), None)
    if bad is not None:
        raise KilnError("validation_error", f"reason: must not contain control characters (found U+{ord(bad):04X} "
                        f"at {reason.index(bad)})", status=422, field="reason",
                        hint="use plain text; newlines and tabs are allowed")
    return reason


def _require_reason(reason: str) -> str:
    reason = _check_reason(reason)
    if not reason:
        raise KilnError("reason_required", "reason: a decision needs a reason", status=400, field="reason",
                        hint="say why in the reason, e.g. 'held-out accuracy improved' (the CLI's --reason)")
    return reason


def _require_approver(user) -> None:
    if user is None or not getattr(user, "is_authenticated", False) or not user.has_perm(APPROVE_PERMISSION):
        raise KilnError("approval_permission_required", "deciding a promotion needs the approve_promotion "
                        "permission", status=403,
                        hint="ask a user with jobs.approve_promotion (an administrator grants it in /admin/)")


def _username(user) -> str | None:
    return user.username if user is not None and getattr(user, "pk", None) is not None else None


def _saved(user):
    return user if user is not None and getattr(user, "pk", None) is not None else None


# -- services --------------------------------------------------------------------------------------

def promotion_request(*, candidate: str, user=None, reason: str = "", evidence: dict | None = None,
                      job=None, post_eval_job_id: str | None = None) -> Promotion:
    """Propose making `candidate` the active adapter (by hand, or a passed gate with its evidence)."""
    reason = _check_reason(reason)
    with transaction.atomic():
        # Checked and recorded as one step: a delete of the candidate, or an activation, at the same time
        # either happened before (and is seen here) or waits for this promotion (and sees it open).
        serialize(REGISTRY)
        return _record_request(candidate=candidate, user=user, reason=reason, evidence=evidence, job=job,
                               post_eval_job_id=post_eval_job_id)


def _record_request(*, candidate: str, user, reason: str, evidence: dict | None, job,
                    post_eval_job_id: str | None) -> Promotion:
    from adapters.selectors import adapter_active

    adapter = Adapter.objects.select_related("training_job").filter(name=candidate).first()
    if adapter is None:
        raise KilnError("adapter_not_found", f"no adapter named {candidate!r}", status=404, field="candidate",
                        hint="list adapters with GET /v1/adapters")
    if adapter.state != AdapterState.PUBLISHED:
        raise KilnError("adapter_busy", f"adapter {candidate!r} is being written; it cannot be promoted yet",
                        status=409, field="candidate", hint="wait for its training job to finish")
    if adapter.quarantined:
        raise KilnError("adapter_quarantined", f"adapter {candidate!r} is quarantined: its serving canary failed",
                        status=409, field="candidate",
                        hint=f"see why with `kiln adapters verify {candidate}` and its canary in GET "
                             f"/v1/adapters/{candidate}/detail; an operator may serve it anyway with "
                             f"`kiln adapters load {candidate} --allow-quarantined`")
    incumbent = adapter_active()
    if incumbent is not None and incumbent.name == candidate:
        raise KilnError("adapter_active", f"adapter {candidate!r} is already the active adapter", status=409,
                        field="candidate", hint="promote another adapter")
    pending = Promotion.objects.filter(state=PromotionState.PENDING, candidate=candidate,
                                       content_sha256=adapter.content_sha256,
                                       incumbent=incumbent.name if incumbent else None).first()
    if pending is not None:  # asking twice made two identical requests for the approvers
        raise KilnError("promotion_already_pending", f"promotion {pending.id} ({pending.incumbent or 'base'} -> "
                        f"{candidate}) already waits for a decision", status=409, field="candidate",
                        hint=f"an approver decides it: kiln promotions approve {pending.id} (or reject it)")
    full = promotion_evidence(adapter=adapter, gate=evidence, post_eval_job_id=post_eval_job_id)
    alarms = promotion_alarms(full, incumbent=incumbent.name if incumbent else None)
    now = timezone.now()
    promotion = Promotion.objects.create(
        candidate=candidate, content_sha256=adapter.content_sha256,
        incumbent=incumbent.name if incumbent else None,
        incumbent_sha256=incumbent.content_sha256 if incumbent else "", evidence=full,
        evidence_sha256=json_digest(full), alarms=alarms, requested_by=_saved(user), requested_at=now,
        request_reason=reason or "", job=job)
    receipt_record(kind=ReceiptKind.PROMOTION, subject=candidate, job=job, body={
        "schema": PROMOTION_SCHEMA, "promotion_id": promotion.id, "candidate": candidate,
        "candidate_content_sha256": adapter.content_sha256, "incumbent": promotion.incumbent,
        "incumbent_content_sha256": promotion.incumbent_sha256 or None,
        "evidence_sha256": promotion.evidence_sha256, "alarms": alarms, "requested_by": _username(user),
        "reason": reason or "", "requested_at": now.isoformat()})
    return promotion


def promotion_after_gate(*, candidate: str, evidence: dict, job=None, user=None) -> Promotion | None:
    """A post-eval gate passed (`promoted`). With the approval policy on, or with a reward-hacking
    alarm, propose a promotion (pending) and return it; otherwise return None: the caller activates."""
    from adapters.selectors import adapter_active

    adapter = Adapter.objects.select_related("training_job").filter(name=candidate).first()
    if adapter is None:
        return None
    post_id = str(job.uuid) if job is not None else None
    active = adapter_active()
    alarms = promotion_alarms(promotion_evidence(adapter=adapter, gate=evidence, post_eval_job_id=post_id),
                              incumbent=active.name if active else None)
    if not approval_required() and not alarms:
        return None
    reason = ("post_eval gate passed" + ("; flagged: " + "; ".join(alarms) if alarms else ""))[:MAX_REASON_CHARS]
    return promotion_request(candidate=candidate, user=user, reason=reason, evidence=evidence, job=job,
                             post_eval_job_id=post_id)


def _claim(promotion_id: int, to_state: str, user, reason: str) -> tuple[int, Promotion]:
    """The conditional UPDATE that decides who wins, then the row, locked."""
    claimed = Promotion.objects.filter(id=promotion_id, state=PromotionState.PENDING).update(
        state=to_state, decided_by=_saved(user), decided_at=timezone.now(), reason=reason)
    promotion = Promotion.objects.select_for_update().filter(id=promotion_id).first()
    if promotion is None:
        raise _not_found(promotion_id)
    if not claimed:
        raise KilnError("promotion_not_pending", f"promotion {promotion_id} is {promotion.state}, not pending",
                        status=409, hint="only a pending promotion can be decided; request a new one")
    return claimed, promotion


def _decision_receipt(promotion: Promotion, *, decision: str, user, reason: str, override: bool,
                      policy: str | None = None) -> Receipt:
    return receipt_record(kind=ReceiptKind.APPROVAL, subject=promotion.candidate, job=promotion.job, body={
        "schema": APPROVAL_SCHEMA, "promotion_id": promotion.id, "candidate": promotion.candidate,
        "candidate_content_sha256": promotion.content_sha256, "incumbent": promotion.incumbent,
        "evidence_sha256": promotion.evidence_sha256, "decision": decision, "override": override,
        "alarms": list(promotion.alarms or []), "actor": _username(user), "reason": reason,
        "decided_at": (promotion.decided_at or timezone.now()).isoformat(), **({"policy": policy} if policy else {})})


def _candidate_problem(promotion: Promotion) -> str | None:
    candidate = Adapter.objects.select_for_update().filter(name=promotion.candidate).first()
    if candidate is None or candidate.state != AdapterState.PUBLISHED:
        return f"the candidate {promotion.candidate!r} is no longer published"
    if candidate.content_sha256 != promotion.content_sha256:
        return (f"the candidate's content is now {candidate.content_sha256}, the promotion was for "
                f"{promotion.content_sha256}")
    return None


def _stale_problem(promotion: Promotion) -> str | None:
    from adapters.selectors import adapter_active

    active = adapter_active()
    if (active.name if active else None) != promotion.incumbent:
        return (f"it was requested against {promotion.incumbent or 'the base model'}, but "
                f"{active.name if active else 'the base model'} is active now")
    return None


def _start_activation(promotion: Promotion, user, reason: str) -> None:
    """Queue the canary and activation (adapters.activation); it applies the promotion or fails it."""
    from adapters.activation import activation_submit

    job = activation_submit(name=promotion.candidate, reason=f"promotion {promotion.id} approved: {reason}",
                            promotion=promotion, actor=user)
    Promotion.objects.filter(id=promotion.id).update(activation_job=job)


def promotion_approve(*, promotion_id: int, user, reason: str) -> Promotion:
    """Approve a pending promotion: it is `approved` while the serving canary runs in its activation job,
    then `applied` (the candidate is active) or `failed` (the reason says why; nothing changed)."""
    reason = _require_reason(reason)
    _require_approver(user)
    with transaction.atomic():
        serialize(REGISTRY)  # the staleness check below sees every activation committed before it
        _, promotion = _claim(promotion_id, PromotionState.APPROVED, user, reason)
        if promotion.requested_by_id == user.pk and not self_approval_allowed(user):
            raise KilnError("promotion_self_approval", f"promotion {promotion_id} was requested by you; another "
                            "reviewer must approve it", status=403,
                            hint="ask another user with jobs.approve_promotion, or set [promotion] "
                                 "allow_self_approval = true")
        stale = _stale_problem(promotion)
        if stale:
            raise KilnError("promotion_stale", f"promotion {promotion_id} is stale: {stale}", status=409,
                            hint="reject it and request a new promotion against the current adapter")
        failure = _candidate_problem(promotion)
        if failure is None:
            _start_activation(promotion, user, reason)
        else:
            promotion.state = PromotionState.FAILED
            Promotion.objects.filter(id=promotion.id).update(state=PromotionState.FAILED,
                                                             reason=f"{reason} (failed: {failure})")
        _decision_receipt(promotion, decision="approved", user=user, reason=reason, override=bool(promotion.alarms))
    if failure is not None:
        raise KilnError("promotion_failed", f"promotion {promotion_id} could not be applied: {failure}", status=409,
                        hint="the promotion is recorded failed; request a new one")
    return Promotion.objects.get(id=promotion_id)


def promotion_apply(*, promotion_id: int, canary: dict, job=None) -> Promotion:
    """The activation job's canary passed: apply the approved promotion, once, unless the world moved on
    meanwhile (the incumbent changed, the candidate's bytes changed): then it fails with the reason."""
    from adapters.activation import make_active

    with transaction.atomic():
        serialize(REGISTRY)  # two approved promotions applying at once: the second sees the first's incumbent
        promotion = Promotion.objects.select_for_update(of=("self",)).select_related("decided_by").filter(id=promotion_id).first()
        if promotion is None:
            raise _not_found(promotion_id)
        if promotion.state != PromotionState.APPROVED:
            return promotion
        problem = _stale_problem(promotion) or _candidate_problem(promotion)
        if problem:
            Promotion.objects.filter(id=promotion.id).update(state=PromotionState.FAILED,
                                                             reason=f"{promotion.reason} (failed: {problem})")
            return Promotion.objects.get(id=promotion_id)
        evidence = promotion.evidence or {}
        gate = evidence.get("gate") or {}
        extra = {"promotion_id": promotion.id, "activation_job_id": str(job.uuid) if job is not None else None}
        if gate.get("outcome") == "promoted":
            extra.update(gate_outcome="promoted", eval_job_id=gate.get("eval_job_id"),
                         training_job_id=evidence.get("training_job_id"))
        # the others against the same incumbent first: make_active supersedes what is still pending
        # against another incumbent, and these are superseded by this promotion in particular
        Promotion.objects.filter(state=PromotionState.PENDING, incumbent=promotion.incumbent).exclude(
            id=promotion.id).update(state=PromotionState.SUPERSEDED, decided_at=timezone.now(),
                                    reason=f"superseded by promotion {promotion.id}")
        make_active(name=promotion.candidate, actor=promotion.decided_by, job=promotion.job, canary=canary,
                    reason=f"promotion {promotion.id} approved: {promotion.reason}", receipt_extra=extra)
        Promotion.objects.filter(id=promotion.id).update(state=PromotionState.APPLIED)
    return Promotion.objects.get(id=promotion_id)


def promotion_fail(*, promotion_id: int, reason: str) -> bool:
    """An approved promotion could not be applied (its canary failed or could not run, its job died)."""
    promotion = Promotion.objects.filter(id=promotion_id).first()
    if promotion is None:
        return False
    return bool(Promotion.objects.filter(id=promotion_id, state=PromotionState.APPROVED).update(
        state=PromotionState.FAILED, reason=f"{promotion.reason} (failed: {reason})"))


def promotion_for_activation(*, name: str, user, reason: str = "") -> Promotion:
    """`POST /v1/adapters/{name}/activate` (a rollback, or any change of the active adapter) is a
    promotion like any other: with the approval policy on, or an alarm, it waits pending for a reviewer;
    without, the request is its own approval and the activation job starts at once."""
    reason = _check_reason(reason) or f"activate {name} by hand"
    promotion = promotion_request(candidate=name, user=user, reason=reason)
    if approval_required() or promotion.alarms:
        return promotion
    with transaction.atomic():
        _, promotion = _claim(promotion.id, PromotionState.APPROVED, user,
                              f"{reason} (no approval required: [promotion] require_approval is off)")
        _start_activation(promotion, user, reason)
        _decision_receipt(promotion, decision="approved", user=user, reason=promotion.reason, override=False,
                          policy="approval_not_required")
    return Promotion.objects.get(id=promotion.id)


def promotion_reject(*, promotion_id: int, user, reason: str) -> Promotion:
    reason = _require_reason(reason)
    _require_approver(user)
    with transaction.atomic():
        _, promotion = _claim(promotion_id, PromotionState.REJECTED, user, reason)
        _decision_receipt(promotion, decision="rejected", user=user, reason=reason, override=False)
    return Promotion.objects.get(id=promotion_id)


# -- selectors -------------------------------------------------------------------------------------

def promotion_list(*, state: str | None = None):
    rows = Promotion.objects.select_related("requested_by", "decided_by", "job", "activation_job")
    return rows.filter(state=state) if state else rows


def promotion_get(*, promotion_id: int) -> Promotion:
    promotion = promotion_list().filter(id=promotion_id).first()
    if promotion is None:
        raise _not_found(promotion_id)
    return promotion


def promotion_receipts(promotion: Promotion) -> list[Receipt]:
    """The promotion's request and decision rows (matched by promotion_id in their bodies)."""
    rows = Receipt.objects.filter(subject=promotion.candidate, kind__in=(ReceiptKind.PROMOTION, ReceiptKind.APPROVAL))
    return [r for r in rows.order_by("created_at", "id")
            if isinstance(r.body, dict) and r.body.get("promotion_id") == promotion.id]


def promotion_out(promotion: Promotion, *, detail: bool = False) -> dict:
    out = {"id": promotion.id, "candidate": promotion.candidate, "content_sha256": promotion.content_sha256,
           "incumbent": promotion.incumbent, "incumbent_sha256": promotion.incumbent_sha256 or None,
           "state": promotion.state, "alarms": list(promotion.alarms or []), "flagged": bool(promotion.alarms),
           "evidence_sha256": promotion.evidence_sha256,
           "requested_by": promotion.requested_by.username if promotion.requested_by_id else None,
           "requested_at": promotion.requested_at, "request_reason": promotion.request_reason,
           "decided_by": promotion.decided_by.username if promotion.decided_by_id else None,
           "decided_at": promotion.decided_at, "reason": promotion.reason,
           "job_id": str(promotion.job.uuid) if promotion.job_id else None,
           "activation_job_id": str(promotion.activation_job.uuid) if promotion.activation_job_id else None}
    if detail:
        out["evidence"] = promotion.evidence
        out["receipts"] = [{"kind": r.kind, "sha256": r.sha256, "created_at": r.created_at,
                            "decision": r.body.get("decision"), "actor": r.body.get("actor") or
                            r.body.get("requested_by"), "override": r.body.get("override")}
                           for r in promotion_receipts(promotion)]
    return out
