"""Dashboard pages of the adapter registry: the list and one adapter with its receipt.

Reads through adapters.selectors; web-facing: never imports torch or gpu_runtime.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from adapters import selectors as adapter_selectors
from adapters.receipt_view import receipt_view


@login_required
def promotions(request):
    """The promotions queue (the workflow lands with the promotions issue)."""
    return render(request, "ui/promotions.html")


@login_required
def adapters(request):
    return render(request, "ui/adapters.html", {"adapters": list(adapter_selectors.adapter_list())})


@login_required
def adapter_detail(request, name):
    adapter = adapter_selectors.adapter_get(name=name)
    if adapter is None:
        raise Http404("no such adapter")
    try:
        receipt, receipt_error = adapter_selectors.adapter_receipt(adapter=adapter), ""
    except (ValueError, OSError) as exc:  # receipt writes are not atomic (spec §2.9)
        receipt, receipt_error = None, f"the receipt could not be read ({type(exc).__name__}: {exc})"
    context = {
        "adapter": adapter,
        "receipt": receipt_view(receipt),
        "receipt_error": receipt_error,
    }
    return render(request, "ui/adapters_detail.html", context)
