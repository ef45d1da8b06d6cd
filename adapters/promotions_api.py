"""/v1/promotions: request a promotion by hand, list and read them, approve or reject one with a
reason (issue 13). Stable codes: promotion_not_found 404, promotion_not_pending 409, promotion_stale
409, promotion_self_approval 403, approval_permission_required 403, reason_required 400.
Web-facing: no torch, no gpu_runtime."""

from __future__ import annotations

from ninja import Router, Schema
from pydantic import ConfigDict

from adapters import promotions
from adapters.models import PromotionState
from core.accounts.auth import require_permission
from core.errors import KilnError

router = Router(tags=["promotions"])


class PromotionRequest(Schema):
    # an unknown key is refused, not dropped: a typo such as "reasn" lost the reason (QA)
    model_config = ConfigDict(extra="forbid")

    candidate: str
    reason: str = ""


class DecisionRequest(Schema):
    model_config = ConfigDict(extra="forbid")

    reason: str = ""


@router.post("", summary="Request a promotion: make a published adapter the active one once approved")
def request_promotion(request, body: PromotionRequest):
    require_permission(request, "submit_job")
    promotion = promotions.promotion_request(candidate=body.candidate, user=request.user, reason=body.reason)
    return promotions.promotion_out(promotion, detail=True)


@router.get("", summary="List promotions, newest first (?state=pending|approved|rejected|applied|superseded|failed)")
def list_promotions(request, state: str | None = None):
    if state and state not in PromotionState.values:
        raise KilnError("invalid_state", f"state must be one of {', '.join(PromotionState.values)}", status=400,
                        field="state")
    return [promotions.promotion_out(p) for p in promotions.promotion_list(state=state)]


@router.get("/{int:promotion_id}", summary="One promotion with its evidence and its receipts")
def get_promotion(request, promotion_id: int):
    return promotions.promotion_out(promotions.promotion_get(promotion_id=promotion_id), detail=True)


@router.post("/{int:promotion_id}/approve", summary="Approve a pending promotion (applies it: the candidate "
             "becomes active)")
def approve_promotion(request, promotion_id: int, body: DecisionRequest):
    promotion = promotions.promotion_approve(promotion_id=promotion_id, user=request.user, reason=body.reason)
    return promotions.promotion_out(promotion, detail=True)


@router.post("/{int:promotion_id}/reject", summary="Reject a pending promotion (a reason is required)")
def reject_promotion(request, promotion_id: int, body: DecisionRequest):
    promotion = promotions.promotion_reject(promotion_id=promotion_id, user=request.user, reason=body.reason)
    return promotions.promotion_out(promotion, detail=True)
