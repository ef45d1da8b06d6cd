"""Dashboard pages of the adapter registry (/ui/adapters/): the list with each adapter's state,
revision, lineage parent and producing job, and one adapter's page with its training receipt, receipt
rows, evaluations, lineage up the base_adapter chain, files, promotions and the append-only history of
transitions. The promotion pages are adapters/promotion_views.py.

Reads through adapters.selectors and adapters.promotions' selectors only; decides nothing.
Web-facing: never imports torch, transformers, peft or gpu_runtime.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from adapters import promotions as promotion_selectors
from adapters import selectors as adapter_selectors
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


@login_required
def adapter_detail(request, name):
    adapter = adapter_selectors.adapter_get(name=name)
    if adapter is None:
        raise Http404("no such adapter")
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
    context = {
        "adapter": adapter,
        "row": adapter_row(adapter, active_name=_active_name()),
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
    }
    return render(request, "ui/adapters_detail.html", context)
