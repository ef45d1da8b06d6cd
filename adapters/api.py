"""/v1/adapters: the adapter registry (list, one, detail, receipt, download), upload, load, unload and
delete (reference-spec §1.2). Web-facing: no torch, no gpu_runtime (the PEFT layout is read from JSON
and safetensors headers by adapters.peft_layout)."""

from __future__ import annotations

from pathlib import Path

from django.http import StreamingHttpResponse
from ninja import Body, File, Form, Router, Schema, UploadedFile

from adapters import selectors, services
from adapters.schemas import LoadRequest, UnloadRequest, adapter_detail_out, adapter_out
from core.accounts.auth import require_permission
from core.errors import KilnError

router = Router(tags=["adapters"])


def _get_or_404(name: str):
    services.validate_adapter_name(name, field="name")  # a malformed name is 400, not "not found"
    adapter = selectors.adapter_get(name=name)
    if adapter is None:
        raise KilnError("adapter_not_found", f"no adapter named {name!r}", status=404,
                        hint="list adapters with GET /v1/adapters")
    return adapter


def _streamed(request, chunks):
    """The chunks as the server can stream them: a plain iterator under WSGI (and the test client); an
    async iterator under ASGI (daphne), where Django would otherwise read a sync iterator whole into
    memory before sending it. Each chunk is produced in a worker thread."""
    if not hasattr(request, "scope"):
        return chunks

    async def in_threads():
        from asgiref.sync import sync_to_async

        iterator, done = iter(chunks), object()
        step = sync_to_async(next, thread_sensitive=False)
        try:
            while (part := await step(iterator, done)) is not done:
                yield part
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                await sync_to_async(close, thread_sensitive=False)()

    return in_threads()


def _active_name() -> str | None:
    active = selectors.adapter_active()
    return active.name if active else None


@router.get("", summary="List adapters, newest first (status, active, lineage parent, producing job)")
def list_adapters(request):
    from adapters.serving.selectors import resident_adapters

    active, resident = _active_name(), resident_adapters()
    return [adapter_out(a, active_name=active, resident=resident) for a in selectors.adapter_list()]


@router.post("/upload", summary="Upload a PEFT LoRA adapter (multipart name + archive, a tar.gz)")
def upload_adapter(request, name: str | None = Form(None), archive: UploadedFile | None = File(None)):  # noqa: B008
    require_permission(request, "submit_job")
    if not name:
        raise KilnError("adapter_upload_invalid", "name: an adapter name is required (multipart field name)",
                        status=400, field="name", hint="e.g. -F name=math-r001 -F archive=@adapter.tar.gz")
    if archive is None:
        raise KilnError("adapter_upload_invalid", "archive: a tar.gz is required (multipart field archive)",
                        status=400, field="archive", hint="e.g. -F name=math-r001 -F archive=@adapter.tar.gz")
    archive.seek(0)
    adapter, checked = services.adapter_upload(name=name, archive=archive, size=archive.size, actor=request.user,
                                               filename=archive.name or "")
    return {**adapter_out(adapter, active_name=_active_name()), "checked": checked}


@router.post("/load", summary="Activate a published adapter for serving")
def load_adapter(request, body: LoadRequest):
    require_permission(request, "submit_job")
    _get_or_404(body.name)
    adapter = services.adapter_load(name=body.name, actor=request.user, allow_quarantined=body.allow_quarantined,
                                    reason=body.reason)
    return adapter_out(adapter, active_name=_active_name())


class ActivateRequest(Schema):
    reason: str = ""


@router.post("/{name}/activate", response={202: dict},
             summary="Make an adapter (e.g. an earlier one: a rollback) the active one, as a promotion")
def activate_adapter(request, name: str, body: ActivateRequest):
    """A promotion like any other (same record, same approval rule): pending for a reviewer when
    [promotion] require_approval is on or an alarm fired; otherwise approved at once, and its
    activation job runs the serving canary and applies it (poll GET /v1/promotions/{id})."""
    from adapters.promotions import promotion_for_activation, promotion_out

    require_permission(request, "submit_job")
    _get_or_404(name)
    promotion = promotion_for_activation(name=name, user=request.user, reason=body.reason)
    return 202, promotion_out(promotion, detail=True)


@router.post("/unload", summary="Stop serving an adapter (it stays published)")
def unload_adapter(request, body: UnloadRequest):
    require_permission(request, "submit_job")
    _get_or_404(body.name)
    adapter = services.adapter_unload(name=body.name, actor=request.user, reason=body.reason)
    return adapter_out(adapter, active_name=_active_name())


@router.post("/merge", summary="Merge adapters (not implemented: 501)")
def merge_adapters(request, body: dict = Body(default_factory=dict)):  # noqa: B008
    """Declared so that a merge request gets a clear answer instead of matching /{name} (405)."""
    raise KilnError("not_implemented", "merging adapters is not implemented by this Kiln", status=501,
                    hint="serve one adapter at a time (POST /v1/adapters/load), or train a new round from an "
                         "accepted adapter with config.base_adapter")


@router.get("/{name}", summary="One adapter")
def get_adapter(request, name: str):
    from adapters.serving.selectors import resident_adapters

    return adapter_out(_get_or_404(name), active_name=_active_name(), resident=resident_adapters())


@router.delete("/{name}", summary="Delete an adapter: its folder and checkpoints (receipts and history stay)")
def delete_adapter(request, name: str, reason: str = "", force: bool = False):
    """`force=true` deletes an adapter other adapters were trained from (else 409 adapter_has_descendants)."""
    require_permission(request, "submit_job")
    _get_or_404(name)
    return services.adapter_delete(name=name, actor=request.user, reason=reason, force=force)


@router.get("/{name}/detail", summary="Files, history, training job, evaluations, lineage and receipts")
def adapter_detail(request, name: str):
    from adapters.serving.selectors import resident_adapters

    return adapter_detail_out(_get_or_404(name), active_name=_active_name(), resident=resident_adapters())


@router.get("/{name}/receipt", summary="The adapter's train_receipt.json")
def get_receipt(request, name: str):
    receipt = selectors.adapter_receipt_checked(adapter=_get_or_404(name))  # 409 when it no longer hashes
    if receipt is None:
        raise KilnError("receipt_not_found", f"adapter {name!r} has no training receipt yet", status=404,
                        hint="a receipt is written once its training run enters the loop")
    return receipt


@router.get("/{name}/download", summary="The adapter folder as a gzip tar (streamed)")
def download_adapter(request, name: str):
    from adapters.archive import tar_gz_stream
    from adapters.content import content_digest, folder_files

    adapter = _get_or_404(name)
    if selectors.adapter_status(adapter) in ("writing", "failed") or not adapter.path:
        raise KilnError("adapter_busy", f"adapter {name!r} is not published", status=409,
                        hint="wait for its training job to finish")
    files = folder_files(Path(adapter.path))
    if not files:
        raise KilnError("adapter_not_found", f"adapter {name!r} has no files on disk", status=404,
                        hint="its folder was removed; delete the adapter (kiln adapters delete)")
    actual = content_digest(Path(adapter.path))
    if actual != adapter.content_sha256:  # never send changed bytes under the registry's digest
        raise KilnError("adapter_content_mismatch", f"adapter {name!r} now hashes to {actual}, but the registry "
                        f"published {adapter.content_sha256}: its files changed after publication", status=409,
                        hint=f"run `kiln adapters verify {name}` to see which file changed; restore it or "
                             "republish the adapter under a new name")
    selectors.adapter_evidence_checked(adapter=adapter)  # the receipt and manifest travel in the archive too
    response = StreamingHttpResponse(_streamed(request, tar_gz_stream(Path(adapter.path), files, folder=name)),
                                     content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="{name}.tar.gz"'
    response["X-Kiln-Content-Sha256"] = adapter.content_sha256 or ""
    return response


@router.get("/{name}/verify", summary="Verify the chain from the adapter's bytes to why it is serving")
def verify_chain(request, name: str):
    from adapters.verify import verify_adapter

    return verify_adapter(_get_or_404(name).name).to_dict()
