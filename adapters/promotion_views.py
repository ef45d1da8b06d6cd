"""Dashboard pages of promotions (/ui/promotions/): the queue (pending first, filter by state) and one
promotion with its evidence on screen (gate counts and bounds, the reward curve and trend, reward
statistics, candidate and incumbent samples side by side, alarms), its receipts, and approve / reject
forms with a required reason.

The views move the form's reason into adapters.promotions.promotion_approve / promotion_reject and
render what the selectors read; the services decide (permission, self-approval, stale, not pending)
and a KilnError they raise is shown on the page with its stable code, status and hint. Live updates
poll fragments: the queue's rows (`?fragment=rows`) and a promotion's state, decision and receipts
(`?fragment=live`), so a decision made by another reviewer shows without a reload.
Approval may be asynchronous (`approved` while an activation job runs its serving canary, then
`applied` or `failed`): every PromotionState is rendered and polling continues while it is `approved`.
Web-facing: never imports torch, transformers, peft or gpu_runtime.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from adapters import promotions as promotion_services
from adapters import selectors as adapter_selectors
from adapters.models import PromotionState
from core.errors import KilnError
from core.sparkline import sparkline

DETAIL = "ui/promotions/detail.html"
QUEUE = "ui/promotions.html"
LIVE_STATES = frozenset({PromotionState.PENDING, PromotionState.APPROVED})  # the page keeps polling
SAMPLES_SHOWN = 50
# Evidence keys with their own block on the page; any other key is listed under "More evidence".
SHOWN_EVIDENCE = frozenset({"schema", "candidate", "candidate_content_sha256", "training_job_id",
                            "post_eval_job_id", "gate", "train_receipt_sha256", "reward_statistics",
                            "reward_trend", "reward_history", "reward_histogram", "samples", "kl_to_reference",
                            "lengths", "policy_audit", "alarm_bounds", "gate_status"})
PERMISSION_TEXT = ("You lack the approve_promotion permission, so you cannot approve or reject promotions. "
                   "An administrator can grant it in /admin/ (Users → permissions) or with "
                   "`kiln user create NAME --approver`.")
SELF_APPROVAL_TEXT = ("You requested this promotion; another reviewer must approve it "
                      "([promotion] allow_self_approval is off). You may still reject it.")


# ---- the queue ---------------------------------------------------------------------------------

def _queue_rows(state: str | None) -> list:
    """Pending first, then newest first (the selector's order) within each group."""
    rows = list(promotion_services.promotion_list(state=state))
    return sorted(rows, key=lambda p: p.state != PromotionState.PENDING)


@login_required
def promotions(request):
    """The promotion queue. `?state=` filters; `?fragment=rows` answers the table body the page polls."""
    state = request.GET.get("state") or None
    state_error = ""
    if state is not None and state not in PromotionState.values:
        state_error = f"there is no promotion state {state!r}; showing every state"
        state = None
    rows = _queue_rows(state)
    active = adapter_selectors.adapter_active()
    context = {"rows": rows, "state": state, "active_name": active.name if active else None, "state_error": state_error, "states": PromotionState.values,
               "any_promotion": bool(rows) or state is not None,
               "can_approve": request.user.has_perm(promotion_services.APPROVE_PERMISSION)}
    if request.GET.get("fragment") == "rows":
        return render(request, f"{QUEUE}#promotion_rows", context)
    return render(request, QUEUE, context)


# ---- one promotion -----------------------------------------------------------------------------

def _history_points(history) -> list[dict]:
    """A reward history as sparkline points: floats become {"step": i, "reward_mean": v}."""
    points = []
    for index, point in enumerate(history if isinstance(history, list) else []):
        points.append(point if isinstance(point, dict) else {"step": index + 1, "reward_mean": point})
    return points


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _bars(rows: list[dict]) -> list[dict]:
    """Rows with a `count`, each given its bar width as a percentage of the largest count."""
    top = max((row.get("count") or 0 for row in rows), default=0) or 1
    return [{**row, "pct": 100 * (row.get("count") or 0) / top} for row in rows]


def _reward_histogram(found: dict) -> dict | None:
    """The evidence's `reward_histogram` (counts over equal bins between `edges`) as labelled bars."""
    counts, edges = found.get("counts"), found.get("edges")
    if not isinstance(counts, list) or not isinstance(edges, list) or len(edges) < len(counts) + 1:
        return None
    rows = [{"low": edges[i], "high": edges[i + 1], "count": count} for i, count in enumerate(counts)]
    return {"rows": _bars(rows), "of": found.get("of"), "source": found.get("source"), "count": found.get("count")}


def _reward(evidence: dict, candidate) -> dict:
    """The reward curve (the evidence's history, else the producing job's), trend, statistics, histograms."""
    history, source = evidence.get("reward_history"), "evidence"
    if not history and candidate is not None and candidate.training_job is not None:
        history, source = (candidate.training_job.metrics or {}).get("reward_history"), "training job metrics"
    statistics = _dict(evidence.get("reward_statistics"))
    variance = [row for row in statistics.get("group_variance_histogram") or [] if isinstance(row, dict)]
    return {"line": sparkline(_history_points(history), "reward_mean"), "source": source if history else None,
            "trend": evidence.get("reward_trend") if isinstance(evidence.get("reward_trend"), dict) else None,
            "statistics": {k: v for k, v in statistics.items() if k != "group_variance_histogram"},
            "histogram": _bars(variance),
            "reward_histogram": _reward_histogram(_dict(evidence.get("reward_histogram")))}


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _drift(evidence: dict) -> dict:
    """KL to the reference and completion lengths against the alarm bounds recorded with the evidence."""
    bounds = _dict(evidence.get("alarm_bounds"))
    kl = _dict(evidence.get("kl_to_reference"))
    kl_value, kl_bound = _number(kl.get("value")), _number(bounds.get("max_kl_to_reference"))
    lengths = _dict(evidence.get("lengths"))
    ratio = _number(lengths.get("ratio"))
    low, high = _number(bounds.get("min_length_ratio")), _number(bounds.get("max_length_ratio"))
    return {"bounds": bounds, "kl": kl or None,
            "kl_over": kl_value is not None and kl_bound is not None and kl_value > kl_bound,
            "lengths": lengths or None,
            "lengths_out": ratio is not None and ((low is not None and ratio < low) or (high is not None and ratio > high)),
            "policy_audit": _dict(evidence.get("policy_audit")) or None}


def _samples(evidence: dict) -> tuple[list[dict], int]:
    samples = [s for s in evidence.get("samples") or [] if isinstance(s, dict)]
    return samples[:SAMPLES_SHOWN], len(samples)


def _receipt_rows(promotion) -> list[dict]:
    rows = []
    for receipt in promotion_services.promotion_receipts(promotion):
        body = receipt.body if isinstance(receipt.body, dict) else {}
        rows.append({"kind": receipt.kind, "label": receipt.get_kind_display(), "sha256": receipt.sha256,
                     "created_at": receipt.created_at, "decision": body.get("decision") or "requested",
                     "actor": body.get("actor") or body.get("requested_by"), "reason": body.get("reason"),
                     "override": body.get("override"), "alarms": body.get("alarms") or []})
    return rows


def _live_context(promotion) -> dict:
    active = adapter_selectors.adapter_active()
    active_name = active.name if active else None
    return {"promotion": promotion, "live": promotion.state in LIVE_STATES, "receipts": _receipt_rows(promotion),
            "active_name": active_name,
            "stale": promotion.state == PromotionState.PENDING and active_name != promotion.incumbent}


def _decide_context(request, promotion) -> dict:
    """Whether this user's buttons are enabled, and the reason shown when they are not. Presentation
    only: the services check the same rules again and their refusal is what counts."""
    user = request.user
    if not user.has_perm(promotion_services.APPROVE_PERMISSION):
        return {"can_decide": False, "approve_blocked": PERMISSION_TEXT, "reject_blocked": PERMISSION_TEXT}
    own = promotion.requested_by_id is not None and promotion.requested_by_id == user.pk
    blocked = SELF_APPROVAL_TEXT if own and not promotion_services.self_approval_allowed(user) else ""
    return {"can_decide": True, "approve_blocked": blocked, "reject_blocked": ""}


def _detail_context(request, promotion, *, error: KilnError | None = None, decision: str = "",
                    reason: str = "") -> dict:
    evidence = promotion.evidence if isinstance(promotion.evidence, dict) else {}
    candidate = adapter_selectors.adapter_get(name=promotion.candidate)
    samples, samples_total = _samples(evidence)
    return {
        **_live_context(promotion),
        **_decide_context(request, promotion),
        "evidence": evidence,
        "gate": evidence.get("gate") if isinstance(evidence.get("gate"), dict) else None,
        "gate_status": evidence.get("gate_status") if isinstance(evidence.get("gate_status"), dict) else {},
        "reward": _reward(evidence, candidate),
        "drift": _drift(evidence),
        "samples": samples,
        "samples_total": samples_total,
        "more_evidence": sorted((k, v) for k, v in evidence.items() if k not in SHOWN_EVIDENCE),
        "candidate": candidate,
        "incumbent": adapter_selectors.adapter_get(name=promotion.incumbent) if promotion.incumbent else None,
        "error": error,
        "decision": decision,
        "reason": reason,
        "max_reason_chars": promotion_services.MAX_REASON_CHARS,  # the textarea stops where the service would refuse
    }


def _promotion_or_404(promotion_id: int):
    try:
        return promotion_services.promotion_get(promotion_id=promotion_id)
    except KilnError as exc:
        raise Http404(exc.message) from None


@login_required
def promotion_detail(request, promotion_id: int):
    """One promotion. `?fragment=live` answers its state, decision and receipts (polled while pending
    or activating), and once decided the decide block too (out of band)."""
    promotion = _promotion_or_404(promotion_id)
    if request.GET.get("fragment") == "live":
        context = {**_live_context(promotion), **_decide_context(request, promotion), "oob": True}
        return render(request, f"{DETAIL}#promotion_fragment", context)
    return render(request, DETAIL, _detail_context(request, promotion))


def _decide(request, promotion_id: int, decision: str):
    promotion = _promotion_or_404(promotion_id)
    reason = request.POST.get("reason", "")
    service = promotion_services.promotion_approve if decision == "approve" else promotion_services.promotion_reject
    try:
        decided = service(promotion_id=promotion.id, user=request.user, reason=reason)
    except KilnError as exc:
        current = _promotion_or_404(promotion_id)  # a failed approval is recorded: show its new state
        context = _detail_context(request, current, error=exc, decision=decision, reason=reason)
        return render(request, DETAIL, context, status=exc.status)
    state = "approved — activating" if decided.state == PromotionState.APPROVED else decided.state
    messages.success(request, f"Promotion {decided.id} {'approved' if decision == 'approve' else 'rejected'}: "
                     f"it is {state} now.")
    return redirect("ui:promotion_detail", promotion_id=decided.id)


@login_required
@require_POST
def promotion_approve(request, promotion_id: int):
    return _decide(request, promotion_id, "approve")


@login_required
@require_POST
def promotion_reject(request, promotion_id: int):
    return _decide(request, promotion_id, "reject")
