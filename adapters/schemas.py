"""API shapes of adapters: the registry row, one adapter's detail, and the request bodies."""

from __future__ import annotations

from ninja import Schema
from pydantic import StrictBool


class LoadRequest(Schema):
    name: str
    allow_quarantined: StrictBool = False  # ("yes" is refused, not read as true) load even though a serving canary quarantined it
    reason: str = ""


class UnloadRequest(Schema):
    name: str
    reason: str = ""


def canary_summary(canary: dict | None) -> dict | None:
    if not isinstance(canary, dict):
        return None
    return {"passed": canary.get("passed"), "at": canary.get("at"), "sha256": canary.get("sha256"),
            "reasons": list(canary.get("reasons") or [])}


def adapter_out(adapter, *, active_name: str | None = None, resident: set[str] | None = None) -> dict:
    """One registry row. `status` is writing | available | active | quarantined | failed; `active` says
    whether it is the adapter served by default now; `resident` whether a GPU worker holds it in memory
    (the `loaded` state of the issue; `loaded` itself stays the activation flag, as the guide names it)."""
    from adapters.selectors import adapter_status, adapter_train_row

    receipt = adapter_train_row(adapter=adapter)  # its own job's row, never an earlier namesake's
    job = adapter.training_job if adapter.training_job_id else None
    return {
        "name": adapter.name,
        "state": adapter.state,
        "status": adapter_status(adapter),
        "active": active_name is not None and adapter.name == active_name,
        "path": adapter.path or None,
        "content_sha256": adapter.content_sha256 or None,
        "base_model_sha256": adapter.base_model_sha256 or None,
        "base_adapter": adapter.base_adapter or None,
        "loaded": adapter.loaded,
        "quarantined": adapter.quarantined,
        "canary": canary_summary(adapter.canary),
        "resident": None if resident is None else adapter.name in resident,
        "training_job_id": str(job.uuid) if job else None,
        "training_job_state": job.state if job else None,
        "created_at": adapter.created_at,
        "published_at": adapter.published_at,
        "receipt_sha256": receipt.sha256 if receipt else None,  # the receipt row; the file hashes the same
    }


def adapter_detail_out(adapter, *, active_name: str | None = None, resident: set[str] | None = None) -> dict:
    from adapters import selectors

    return {
        **adapter_out(adapter, active_name=active_name, resident=resident),
        "canary_record": adapter.canary,
        "files": selectors.adapter_files_detail(adapter=adapter),
        "transitions": [selectors.transition_out(t) for t in selectors.adapter_transitions(name=adapter.name)],
        "training_job": selectors.job_summary(adapter.training_job if adapter.training_job_id else None),
        "evaluations": selectors.adapter_evaluations(adapter=adapter),
        "lineage": selectors.adapter_lineage(adapter=adapter),
        "receipts": selectors.adapter_receipts(name=adapter.name),
    }
