"""Dashboard pages of the adapter registry (/ui/adapters/): the list with each adapter's state,
revision, lineage parent and producing job, and one adapter's page with its training receipt, receipt
rows, evaluations, lineage up the base_adapter chain, files, promotions and the append-only history of
transitions. The promotion pages are adapters/promotion_views.py.

The adapter page's two forms (adapters/ui_actions.py) move their fields into the services the API uses:
"Make active" into adapters.promotions.promotion_for_activation (POST /v1/adapters/{name}/activate) and
"Delete" into adapters.services.adapter_delete (DELETE /v1/adapters/{name}); both need the submit_job
permission, as on /v1/adapters. This module reads through adapters.selectors and adapters.promotions'
selectors only; decides nothing. Web-facing: never imports torch, transformers, peft or gpu_runtime.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from adapters import promotions as promotion_selectors
from adapters import selectors as adapter_selectors
from adapters import services as adapter_services
from adapters.models import AdapterState
from adapters.receipt_view import receipt_view
from core.errors import KilnError


def adapter_row(adapter, *, active_name: str | None = None) -> dict:
    """What a page shows of one adapter besides its fields: the registry status (writing | available |
    active | failed, later quarantined), a quarantine flag and a revision where the model has them."""
    status = adapter_selectors.adapter_status(adapter)
    return {
        "adapter": adapter,
        "status": status,
        "quarantined": bool(getattr(adapter, "quarantined", False)) or status == "quarantined",
        "revision": getattr(adapter, "revision", None),
        "serving": active_name is not None and adapter.name == active_name,
    }


def _active_name() -> str | None:
    active = adapter_selectors.adapter_active()
    return active.name if active else None


@login_required
def adapters(request):
    active = _active_name()
    rows = [adapter_row(a, active_name=active) for a in adapter_selectors.adapter_list()]
    return render(request, "ui/adapters.html", {"adapters": [r["adapter"] for r in rows], "rows": rows,
                                                "active_name": active})


def _files(adapter) -> tuple[list[dict], str]:
    try:
        return adapter_selectors.adapter_files_detail(adapter=adapter), ""
    except OSError as exc:  # the folder went away under us (a delete, a demotion)
        return [], f"the files could not be listed ({type(exc).__name__}: {exc})"


SUBMIT_PERMISSION = "jobs.submit_job"


def can_submit(request) -> bool:
    return request.user.has_perm(SUBMIT_PERMISSION)


def adapter_or_404(name: str):
    adapter = adapter_selectors.adapter_get(name=name)
    if adapter is None:
        raise Http404("no such adapter")
    return adapter


def _delete_refusal(request, adapter) -> KilnError | None:
    """Why the service would refuse this user's delete (another user's adapter, without
    jobs.delete_others_jobs), so the page disables its button and says so; None: allowed."""
    try:
        adapter_services.adapter_check_delete(adapter=adapter, user=request.user)
    except KilnError as exc:
        return exc
    return None


def _actions_context(request, adapter, row: dict) -> dict:
    """Whether the forms show (presentation only: the services check their rules again)."""
    permitted = can_submit(request)
    return {
        "can_submit": permitted,
        # a quarantined adapter's promotion could only fail its canary (the alarm card says how to load one)
        "can_activate": permitted and adapter.state == AdapterState.PUBLISHED and row["status"] != "active"
        and not row["quarantined"],
        "approval_required": promotion_selectors.approval_required(),
        "delete_refusal": _delete_refusal(request, adapter) if permitted else None,
    }


def render_detail(request, adapter, *, forbidden: str = "", activate_error: KilnError | None = None,
                  activate_reason: str = "", delete_error: KilnError | None = None, delete_values: dict | None = None,
                  status: int = 200):
    """The adapter page; the form views render it again with their error (and its status)."""
    try:  # shown only while it hashes to what was recorded for it, as GET /v1/adapters/{name}/receipt serves it
        receipt, receipt_error = adapter_selectors.adapter_receipt_checked(adapter=adapter), ""
    except KilnError as exc:
        receipt, receipt_error = None, f"{exc.code}: {exc.message} ({exc.hint})"
    except OSError as exc:
        receipt, receipt_error = None, f"the receipt could not be read ({type(exc).__name__}: {exc})"
    files, files_error = _files(adapter)
    evaluations = adapter_selectors.adapter_evaluations(adapter=adapter)
    post_eval = evaluations.get("post_eval") or {}
    gate = next((e for e in post_eval.get("evidence") or [] if isinstance(e, dict)), None)
    active_name = _active_name()
    row = adapter_row(adapter, active_name=active_name)
    context = {
        "adapter": adapter,
        "row": row,
        "active_name": active_name,
        "receipt": receipt_view(receipt),
        "receipt_error": receipt_error,
        "receipts": adapter_selectors.adapter_receipts(name=adapter.name),
        "evaluations": evaluations,
        "gate": gate,
        "lineage": adapter_selectors.adapter_lineage(adapter=adapter),
        "files": files,
        "files_error": files_error,
        "transitions": adapter_selectors.adapter_transitions(name=adapter.name),
        "promotions": list(promotion_selectors.promotion_list().filter(candidate=adapter.name)),
        **_actions_context(request, adapter, row),
        "forbidden": forbidden,
        "activate_error": activate_error,
        "activate_reason": activate_reason,
        "delete_error": delete_error,
        "delete_values": delete_values or {"reason": "", "force": False},
    }
    return render(request, "ui/adapters_detail.html", context, status=status)


@login_required
def adapter_detail(request, name):
    return render_detail(request, adapter_or_404(name))
