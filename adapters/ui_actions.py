"""The adapter page's forms (/ui/adapters/<name>/activate/ and /delete/): POST-only views that move
the form's fields into the services the API uses and render what they answer.

- "Make active (request a promotion)": adapters.promotions.promotion_for_activation, the service behind
  POST /v1/adapters/{name}/activate (`kiln adapters activate`): a promotion, pending for a reviewer when
  approval is required, else approved and applied after its serving canary. Also a rollback to an
  earlier adapter. On success: the promotion's page.
- "Delete": adapters.services.adapter_delete, as DELETE /v1/adapters/{name} (force: even if other
  adapters were trained from it). On success: the adapter list.

Both need the submit_job permission, as on /v1/adapters; the services decide everything else, and a
KilnError they raise is shown on the adapter page with its code, message, hint and status: nothing was
changed. Web-facing: never imports torch, transformers, peft or gpu_runtime.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from adapters import promotions as promotion_services
from adapters import services as adapter_services
from adapters.models import PromotionState
from adapters.views import adapter_or_404, can_submit, render_detail
from core.errors import KilnError

PERMISSION_TEXT = ("You lack the submit_job permission, so you cannot {what}. "
                   "An administrator can grant it in /admin/ (Users → permissions).")


def _forbidden(request, what: str) -> str:
    return "" if can_submit(request) else PERMISSION_TEXT.format(what=what)


def _checked(post, name: str) -> bool:
    return post.get(name) in ("on", "true", "1")


@login_required
@require_POST
def adapter_activate_view(request, name):
    adapter = adapter_or_404(name)
    reason = request.POST.get("reason", "")
    if not can_submit(request):
        return render_detail(request, adapter, activate_reason=reason, status=403,
                             forbidden=_forbidden(request, "request promotions"))
    if not reason.strip():  # the form asks for one; the service would default to "activate NAME by hand"
        error = KilnError("reason_required", "reason: a promotion request needs a reason", status=400,
                          field="reason", hint="say why, e.g. 'roll back: r2 regressed on held-out'")
        return render_detail(request, adapter, activate_reason=reason, activate_error=error, status=400)
    try:
        promotion = promotion_services.promotion_for_activation(name=adapter.name, user=request.user, reason=reason)
    except KilnError as exc:
        return render_detail(request, adapter, activate_reason=reason, activate_error=exc, status=exc.status)
    if promotion.state == PromotionState.PENDING:
        messages.success(request, f"Requested promotion {promotion.id} of {promotion.candidate}: "
                         "it is pending until a reviewer approves it.")
    else:
        messages.success(request, f"Promotion {promotion.id} of {promotion.candidate} is {promotion.state}: "
                         "its serving canary runs, then it is applied.")
    return redirect("ui:promotion_detail", promotion_id=promotion.id)


@login_required
@require_POST
def adapter_delete_view(request, name):
    adapter = adapter_or_404(name)
    values = {"reason": request.POST.get("reason", ""), "force": _checked(request.POST, "force")}
    if not can_submit(request):
        return render_detail(request, adapter, delete_values=values, status=403,
                             forbidden=_forbidden(request, "delete adapters"))
    try:
        adapter_services.adapter_delete(name=adapter.name, actor=request.user, reason=values["reason"],
                                        force=values["force"])
    except KilnError as exc:  # active, a promotion open, in use, descendants, another user's: nothing was deleted
        return render_detail(request, adapter, delete_values=values, delete_error=exc, status=exc.status)
    messages.success(request, f"Deleted adapter {name} and its files (its receipts and history stay).")
    return redirect("ui:adapters")
