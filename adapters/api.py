"""/v1/adapters: the adapter registry and each adapter's training receipt."""

from __future__ import annotations

from ninja import Router

from adapters import selectors
from adapters.schemas import adapter_out
from core.errors import KilnError

router = Router(tags=["adapters"])


def _get_or_404(name: str):
    adapter = selectors.adapter_get(name=name)
    if adapter is None:
        raise KilnError("adapter_not_found", f"no adapter named {name!r}", status=404,
                        hint="list adapters with GET /v1/adapters")
    return adapter


@router.get("", summary="List adapters, newest first")
def list_adapters(request):
    return [adapter_out(a) for a in selectors.adapter_list()]


@router.get("/{name}", summary="One adapter")
def get_adapter(request, name: str):
    return adapter_out(_get_or_404(name))


@router.get("/{name}/receipt", summary="The adapter's train_receipt.json")
def get_receipt(request, name: str):
    receipt = selectors.adapter_receipt(adapter=_get_or_404(name))
    if receipt is None:
        raise KilnError("receipt_not_found", f"adapter {name!r} has no training receipt yet", status=404,
                        hint="a receipt is written once its training run enters the loop")
    return receipt
