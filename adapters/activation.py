"""Making an adapter the active one: the serving canary first, then one active adapter, with a receipt.

    adapter, canary = activate_with_canary(name="math-r001", actor=alice, reason="loaded by hand")
    job = activation_submit(name="math-r001", reason="auto_load", job=training_job)   # the same, queued

Every way an adapter starts serving by default goes through here: `POST /v1/adapters/load` (in the
request), a passed post-eval gate (in its control job), `auto_load` after training and an approved
promotion (an `adapter.activate` job on the control queue, so a crash anywhere ends the promotion
`failed` instead of leaving it half-done: the job's on_unsuccessful hook records why).

The canary (adapters.canary) runs before anything changes. When it fails on the adapter, the adapter
is quarantined (a transition row says why) and nothing else changes: the previous adapter stays
active. When the canary cannot run (no GPU worker), nothing changes at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from adapters.canary import CanaryUnavailable, canary_run, canary_timeout
from adapters.models import Adapter, AdapterState, AdapterStatus, AdapterTransition, Promotion, PromotionState
from core.db_locks import REGISTRY, serialize
from core.errors import KilnError

log = logging.getLogger(__name__)

KIND = "adapter.activate"
ACTIVATION_SCHEMA = "kiln.adapter-activation.v1"


@dataclass(frozen=True)
class ActivationPayload:
    """What an `adapter.activate` job activates, and on whose behalf."""

    adapter: str
    content_sha256: str
    reason: str
    promotion_id: int | None = None
    actor_id: int | None = None
    allow_quarantined: bool = False
    origin_job_id: str | None = None  # the training or post-eval job that asked for it

    @classmethod
    def from_dict(cls, data: dict) -> ActivationPayload:
        if not isinstance(data, dict) or not isinstance(data.get("adapter"), str):
            raise ValueError("an activation payload needs an adapter name")
        return cls(adapter=data["adapter"], content_sha256=str(data.get("content_sha256") or ""),
                   reason=str(data.get("reason") or ""), promotion_id=data.get("promotion_id"),
                   actor_id=data.get("actor_id"), allow_quarantined=bool(data.get("allow_quarantined")),
                   origin_job_id=data.get("origin_job_id"))

    def to_dict(self) -> dict:
        return {"adapter": self.adapter, "content_sha256": self.content_sha256, "reason": self.reason,
                "promotion_id": self.promotion_id, "actor_id": self.actor_id,
                "allow_quarantined": self.allow_quarantined, "origin_job_id": self.origin_job_id}


def _username(user) -> str | None:
    return user.username if user is not None and getattr(user, "pk", None) is not None else None


def _published(name: str) -> Adapter:
    adapter = Adapter.objects.filter(name=name).first()
    if adapter is None:
        raise KilnError("adapter_not_found", f"no adapter named {name!r}", status=404,
                        hint="list adapters with GET /v1/adapters (kiln adapters list)")
    if adapter.state != AdapterState.PUBLISHED:
        raise KilnError("adapter_busy", f"adapter {name!r} is being written; it cannot be activated yet", status=409,
                        hint="wait for its training job to finish")
    return adapter


def quarantine(*, name: str, canary: dict, actor=None, job=None) -> None:
    """The canary failed on the adapter: it is never activated again without allow_quarantined."""
    from adapters.services import transition_record

    with transaction.atomic():
        adapter = Adapter.objects.select_for_update().filter(name=name).first()
        if adapter is None:
            return
        from_state = AdapterStatus.QUARANTINED if adapter.quarantined else (
            AdapterStatus.ACTIVE if adapter.loaded else AdapterStatus.AVAILABLE)
        Adapter.objects.filter(id=adapter.id).update(quarantined=True, canary=canary)
        transition_record(name=name, from_state=from_state, to_state=AdapterStatus.QUARANTINED, actor=actor,
                          job=job, content_sha256=adapter.content_sha256,
                          reason="serving canary failed: " + "; ".join(canary.get("reasons") or ["no reason"]))


def run_canary(*, name: str, actor=None, job=None, allow_quarantined: bool = False,
               expected_sha256: str = "", wait_for_worker: float = 0.0) -> dict:
    """The canary on a published adapter; a failure quarantines it and raises adapter_load_failed.
    Raises adapter_quarantined for a quarantined adapter unless allowed, CanaryUnavailable when it can't run
    (after `wait_for_worker` seconds of asking again while no GPU worker serves)."""
    adapter = _published(name)
    if adapter.quarantined and not allow_quarantined:
        raise KilnError("adapter_quarantined", f"adapter {name!r} is quarantined: its serving canary failed", status=409,
                        hint=f"inspect its canary in GET /v1/adapters/{name}/detail; load it anyway with "
                             "allow_quarantined=true")
    if expected_sha256 and adapter.content_sha256 != expected_sha256:
        raise KilnError("adapter_changed", f"adapter {name!r} is now {adapter.content_sha256}, not "
                        f"{expected_sha256}", status=409, hint="request the activation again")
    record = canary_run(name=name, content_sha256=adapter.content_sha256, wait_for_worker=wait_for_worker)
    if not record["passed"]:
        quarantine(name=name, canary=record, actor=actor, job=job)
        raise KilnError("adapter_load_failed", f"adapter {name!r} failed its serving canary and is quarantined: "
                        + "; ".join(record["reasons"]), status=500,
                        hint=f"its record is in GET /v1/adapters/{name}/detail (canary); the previous adapter "
                             "stays active")
    return record


def make_active(*, name: str, actor=None, reason: str, job=None, canary: dict | None = None,
                receipt_extra: dict | None = None) -> Adapter:
    """Inside the caller's transaction: `name` becomes the one active adapter (every other loaded adapter
    is unloaded, with a transition row), and an activation receipt row binds its bytes and canary."""
    from adapters.services import transition_record
    from core.models import ReceiptKind
    from core.receipts import receipt_record

    serialize(REGISTRY)  # two activations at once must not both find nothing else loaded (PostgreSQL write skew)
    adapter = Adapter.objects.select_for_update().filter(name=name, state=AdapterState.PUBLISHED).first()
    if adapter is None:
        raise KilnError("adapter_not_found", f"no published adapter named {name!r}", status=404)
    for other in Adapter.objects.select_for_update().filter(loaded=True).exclude(id=adapter.id):
        Adapter.objects.filter(id=other.id).update(loaded=False)
        transition_record(name=other.name, from_state=AdapterStatus.ACTIVE, to_state=AdapterStatus.AVAILABLE,
                          actor=actor, job=job, content_sha256=other.content_sha256, reason=f"replaced by {name}")
    updates = {"canary": canary} if canary is not None else {}
    if canary is not None and canary.get("passed"):
        updates["quarantined"] = False
    if not adapter.loaded:
        updates["loaded"] = True
        transition_record(name=name, from_state=AdapterStatus.QUARANTINED if adapter.quarantined else
                          AdapterStatus.AVAILABLE, to_state=AdapterStatus.ACTIVE, actor=actor, job=job,
                          content_sha256=adapter.content_sha256, reason=reason or "activated")
    if updates:
        Adapter.objects.filter(id=adapter.id).update(**updates)
    body = {"schema": ACTIVATION_SCHEMA, "adapter": name, "reason": reason, "content_sha256": adapter.content_sha256,
            "actor": _username(actor), "activated_at": timezone.now().isoformat(),
            "canary": {"sha256": canary.get("sha256"), "passed": canary.get("passed")} if canary else None,
            **(receipt_extra or {})}
    receipt_record(kind=ReceiptKind.ACTIVATION, subject=name, job=job, body=body)
    # A request to make it active that is still pending is fulfilled: left pending, its approval only
    # answered promotion_stale and it blocked deleting the adapter (QA, after a direct load).
    Promotion.objects.filter(state=PromotionState.PENDING, candidate=name).update(
        state=PromotionState.SUPERSEDED, decided_at=timezone.now(),
        reason=f"{name} was made active otherwise by {_username(actor) or 'the system'}: {reason}"[:2000])
    supersede_stale_promotions(active=name, actor=actor)
    return Adapter.objects.get(id=adapter.id)


def supersede_stale_promotions(*, active: str | None, actor=None) -> None:
    """Inside the caller's transaction, once `active` (None: the base model) serves: a pending promotion
    requested against another incumbent can no longer be approved (promotion_stale: its evidence compared
    the candidate with what served then), so it is superseded, as when another promotion is applied;
    left pending it stayed in the queue for ever and blocked deleting its candidate (QA, after a direct
    load). One requested against `active` itself is current again and stays pending."""
    stale = Promotion.objects.filter(state=PromotionState.PENDING)
    stale = stale.exclude(incumbent=active) if active else stale.exclude(incumbent__isnull=True).exclude(incumbent="")
    stale.update(state=PromotionState.SUPERSEDED, decided_at=timezone.now(),
                 reason=(f"{active or 'the base model'} was made active by {_username(actor) or 'the system'}: "
                         "it no longer replaces what served when it was requested"))


def activate_with_canary(*, name: str, actor=None, reason: str, job=None, allow_quarantined: bool = False,
                         receipt_extra: dict | None = None) -> tuple[Adapter, dict]:
    """The canary, then (on a pass) `name` is the active adapter. Raises as run_canary does."""
    canary = run_canary(name=name, actor=actor, job=job, allow_quarantined=allow_quarantined)
    with transaction.atomic():
        adapter = make_active(name=name, actor=actor, reason=reason, job=job, canary=canary,
                              receipt_extra={"allow_quarantined": bool(allow_quarantined), **(receipt_extra or {})})
    return adapter, canary


# -- the adapter.activate job (control queue) --------------------------------------------------------------

def activation_submit(*, name: str, reason: str, promotion: Promotion | None = None, actor=None, job=None,
                      allow_quarantined: bool = False):
    """Queue the canary and activation of a published adapter (call inside the deciding transaction)."""
    from core.jobs.services import job_submit

    adapter = _published(name)
    payload = ActivationPayload(adapter=name, content_sha256=adapter.content_sha256, reason=reason,
                                promotion_id=promotion.id if promotion is not None else None,
                                actor_id=actor.pk if getattr(actor, "pk", None) is not None else None,
                                allow_quarantined=allow_quarantined,
                                origin_job_id=str(job.uuid) if job is not None else None)
    title = f"Activate · {name}" + (f" · promotion {promotion.id}" if promotion is not None else "")
    return job_submit(kind=KIND, payload=payload, title=title, follow_up=job is not None,  # a training's auto_load
                      user=actor if getattr(actor, "pk", None) is not None else (job.submitted_by if job else None))


def _actor(payload: ActivationPayload):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(pk=payload.actor_id).first() if payload.actor_id else None


def run_activation_job(ctx) -> dict:
    from adapters import promotions

    payload = ActivationPayload.from_dict(ctx.job.payload)
    actor = _actor(payload)
    ctx.report_progress(0.1, "serving canary")
    try:
        # A queued activation (auto_load, an approved promotion) outwaits a GPU worker that is restarting
        # (QA: a training's auto_load failed inference_unavailable at once after the worker was killed).
        canary = run_canary(name=payload.adapter, actor=actor, job=ctx.job,
                            allow_quarantined=payload.allow_quarantined, expected_sha256=payload.content_sha256,
                            wait_for_worker=canary_timeout())
    except CanaryUnavailable:
        raise  # the job fails; its hook fails the promotion; the adapter is not judged
    except KilnError as exc:
        if payload.promotion_id is not None:
            promotions.promotion_fail(promotion_id=payload.promotion_id, reason=f"{exc.code}: {exc.message}")
        ctx.log("not activated", {"code": exc.code, "message": exc.message})
        # The job fails with the refusal's code (a job that activated nothing is not `completed`),
        # and keeps the outcome in its result.
        exc.job_result = {"adapter": payload.adapter, "activated": False, "code": exc.code, "message": exc.message,
                          "quarantined": exc.code == "adapter_load_failed"}
        raise
    ctx.report_progress(0.8, "activating", metrics={"canary_sha256": canary["sha256"]})
    if payload.promotion_id is not None:
        promotion = promotions.promotion_apply(promotion_id=payload.promotion_id, canary=canary, job=ctx.job)
        result = {"adapter": payload.adapter, "activated": promotion.state == PromotionState.APPLIED,
                  "promotion_id": promotion.id, "promotion_state": promotion.state, "canary": canary}
        if not result["activated"]:
            # The promotion's reason is the decider's text with the failure after it ("ok (failed: ...)").
            reason = promotion.reason or ""
            cause = reason.rsplit(" (failed: ", 1)[1].removesuffix(")") if " (failed: " in reason else reason
            error = KilnError("promotion_failed", f"promotion {promotion.id} was not applied: {cause}",
                              status=409, hint="see the promotion's reason; the previous adapter stays active")
            error.job_result = {**result, "code": error.code, "message": error.message}
            raise error
        return result
    with transaction.atomic():
        serialize(REGISTRY)  # the check below sees every activation committed before this one applies
        later = _activated_since(ctx.job)
        if later is not None:  # a job that activated nothing is not `completed`; its result says why
            error = KilnError("activation_superseded", f"{later.adapter} was made active at "
                              f"{later.at.isoformat()}, after this activation of {payload.adapter} was requested: "
                              "the later decision holds", status=409,
                              hint=f"to serve {payload.adapter} after all, request it again (kiln adapters "
                                   f"activate {payload.adapter})")
            error.job_result = {"adapter": payload.adapter, "activated": False, "code": error.code,
                                "message": error.message, "canary": canary}
            raise error
        make_active(name=payload.adapter, actor=actor, reason=payload.reason, job=ctx.job, canary=canary,
                    receipt_extra={"origin_job_id": payload.origin_job_id})
    return {"adapter": payload.adapter, "activated": True, "canary": canary}


def _activated_since(job):
    """The newest activation of any adapter recorded after `job` was queued. Canaries run side by side and
    finish in any order: without this an older auto_load whose canary finished last replaced the adapter a
    later training (or a person) had made active. The newest request wins, as an approved promotion does
    (one requested against an incumbent that changed since is stale)."""
    return (AdapterTransition.objects.filter(to_state=AdapterStatus.ACTIVE, at__gt=job.created_at)
            .order_by("-at", "-id").first())


def activation_unsuccessful(job) -> None:
    """The job failed or was cancelled (the canary could not run, a worker died): its promotion fails
    with the reason, and nothing was activated (activation is one transaction at the very end)."""
    from adapters import promotions

    job.refresh_from_db()  # the hook runs after commit with the row as it was before the job ended
    try:
        payload = ActivationPayload.from_dict(job.payload)
    except ValueError:
        return
    if payload.promotion_id is not None:
        why = f"{job.error_code or job.state}: {job.error_message or 'the activation job ended ' + job.state}"
        promotions.promotion_fail(promotion_id=payload.promotion_id, reason=f"activation job {job.uuid} ended "
                                  f"{job.state} ({why}); the previous adapter stays active")
