"""Read-only adapter queries: the registry, one adapter's status, files, history, evidence and lineage."""

from __future__ import annotations

import json
from pathlib import Path

from adapters.manifest import MANIFEST_FILE
from adapters.models import Adapter, AdapterState, AdapterStatus, AdapterTransition, Promotion
from core.canonical import json_digest, sha256_digest
from core.errors import KilnError
from core.jobs.error_hints import job_error
from core.jobs.models import Job, JobState
from core.models import Receipt, ReceiptKind

EVAL_KIND = "eval.run"
POST_EVAL_KIND = "training.post_eval"
MAX_LINEAGE = 64  # a base_adapter chain longer than this is reported as cut
MAX_EVAL_JOBS_SCANNED = 500
RECEIPT_FILE = "train_receipt.json"


def adapter_list():
    return Adapter.objects.all().select_related("training_job")


def adapter_get(*, name: str) -> Adapter | None:
    return Adapter.objects.filter(name=name).first()


def adapter_published_path(*, name: str) -> Path | None:
    """Directory of a published adapter, for the sampler and warm starts; None if not published."""
    adapter = Adapter.objects.filter(name=name, state=AdapterState.PUBLISHED).first()
    return Path(adapter.path) if adapter and adapter.path else None


def adapter_served_bytes(*, name: str) -> tuple[Path, str] | None:
    """For the sampler: a published adapter's folder and the content digest its files must still have."""
    adapter = Adapter.objects.filter(name=name, state=AdapterState.PUBLISHED).first()
    return (Path(adapter.path), adapter.content_sha256) if adapter and adapter.path else None


def adapter_origin(*, adapter: Adapter) -> dict:
    """How this adapter row was published: `uploaded` (trained elsewhere; its receipt, if any, carried in
    the archive) and `manifest_sha256` (the adapter_manifest.json it had then; None: it had none)."""
    return {"uploaded": adapter.uploaded, "manifest_sha256": adapter.manifest_sha256 or None}


def adapter_train_row(*, adapter: Adapter) -> Receipt | None:
    """The train receipt row of this adapter: its own training job's. Keyed to the job, not the name, so
    an adapter never shows the receipt of an earlier (deleted) adapter of the same name; an upload has none."""
    if not adapter.training_job_id:
        return None
    return (Receipt.objects.filter(kind=ReceiptKind.TRAIN, subject=adapter.name, job_id=adapter.training_job_id)
            .order_by("-created_at", "-id").first())


def adapter_receipt_rows(*, adapter: Adapter):
    """Receipt rows about this adapter row: by name, written since the row was created (rows an earlier
    adapter of the same name left behind are older)."""
    return Receipt.objects.filter(subject=adapter.name, created_at__gte=adapter.created_at)


def _receipt_refused(name: str, detail: str) -> KilnError:
    return KilnError("receipt_integrity_failed", f"adapter {name!r}: {detail}", status=409,
                     hint=f"run `kiln adapters verify {name}` to see which link broke; restore the file or "
                          "republish the adapter")


def _check_recorded_manifest(adapter: Adapter, receipt_bytes: bytes) -> None:
    """adapter_manifest.json still hashes to the sha256 recorded at publication, and its receipt_hash to
    `receipt_bytes` (train_receipt.json as it is now). Refused: 409 receipt_integrity_failed."""
    try:
        manifest_data = (Path(adapter.path) / MANIFEST_FILE).read_bytes()
    except OSError:
        raise _receipt_refused(adapter.name, f"{MANIFEST_FILE}, recorded at publication, is missing") from None
    if sha256_digest(manifest_data) != adapter.manifest_sha256:
        raise _receipt_refused(adapter.name, f"{MANIFEST_FILE} no longer hashes to {adapter.manifest_sha256}, "
                               "recorded at publication")
    try:
        receipt_hash = json.loads(manifest_data).get("receipt_hash")
    except (ValueError, AttributeError):
        raise _receipt_refused(adapter.name, f"{MANIFEST_FILE} is not a JSON object any more") from None
    if receipt_hash != sha256_digest(receipt_bytes):
        raise _receipt_refused(adapter.name, f"{RECEIPT_FILE} no longer hashes to the receipt_hash of {MANIFEST_FILE}")


def adapter_receipt_checked(*, adapter: Adapter) -> dict | None:
    """train_receipt.json as the API serves it, only while it hashes to what was recorded for it: its
    train receipt row's digest, or (an upload) the receipt_hash of the manifest it carried, itself the
    manifest recorded at upload. None: no receipt file. Refused: 409 receipt_integrity_failed."""
    if not adapter.path:
        return None
    try:
        data = (Path(adapter.path) / RECEIPT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        receipt = json.loads(data)
    except ValueError:
        raise _receipt_refused(adapter.name, f"{RECEIPT_FILE} is not JSON any more") from None
    row = adapter_train_row(adapter=adapter)
    if row is not None:
        if json_digest(receipt) != row.sha256:
            raise _receipt_refused(adapter.name, f"{RECEIPT_FILE} no longer hashes to its receipt row's {row.sha256}")
    elif adapter.manifest_sha256:  # no row here (an upload): the manifest recorded with it binds the receipt
        _check_recorded_manifest(adapter, data)
    return receipt  # else published before manifests, without a row: nothing recorded to check against


def adapter_evidence_checked(*, adapter: Adapter) -> None:
    """Before a download: the receipt still hashes to what was recorded for it (adapter_receipt_checked),
    and adapter_manifest.json to the sha256 recorded at publication, its receipt_hash to the receipt's
    bytes; a changed file is 409 receipt_integrity_failed, never sent inside the archive."""
    adapter_receipt_checked(adapter=adapter)
    if not adapter.path or not adapter.manifest_sha256:
        return
    try:
        receipt_bytes = (Path(adapter.path) / RECEIPT_FILE).read_bytes()
    except OSError:
        raise _receipt_refused(adapter.name, f"{RECEIPT_FILE}, which {MANIFEST_FILE} binds, cannot be read") from None
    _check_recorded_manifest(adapter, receipt_bytes)


def adapter_active(*, excluding: str | None = None) -> Adapter | None:
    """The adapter serving now: the most recently published one that is active (None: the base model)."""
    adapters = Adapter.objects.filter(state=AdapterState.PUBLISHED, loaded=True)
    if excluding:
        adapters = adapters.exclude(name=excluding)
    return adapters.order_by("-published_at", "-id").first()


def adapter_status(adapter: Adapter) -> str:
    """writing | available | active | quarantined | failed: `active` is the `loaded` flag; `quarantined`
    a failed serving canary; `failed` a reservation whose training job ended without publishing."""
    if adapter.state == AdapterState.WRITING:
        job = adapter.training_job
        if job is not None and job.state in (JobState.FAILED, JobState.CANCELLED):
            return AdapterStatus.FAILED
        return AdapterStatus.WRITING
    if adapter.loaded:
        return AdapterStatus.ACTIVE
    return AdapterStatus.QUARANTINED if adapter.quarantined else AdapterStatus.AVAILABLE


def adapter_promotion(*, adapter: Adapter | None, promotion_id: int | None = None) -> Promotion | None:
    """The promotion that decides this adapter revision: the recorded one, else the newest for its
    exact bytes (one requested later by hand, or the gate's pending approval)."""
    if promotion_id is not None:
        return Promotion.objects.filter(id=promotion_id).select_related("activation_job").first()
    if adapter is None or not adapter.content_sha256:
        return None
    return (Promotion.objects.filter(candidate=adapter.name, content_sha256=adapter.content_sha256)
            .select_related("activation_job").order_by("-requested_at", "-id").first())


def adapter_transitions(*, name: str) -> list[AdapterTransition]:
    """The append-only history of a name, oldest first (it outlives the adapter row)."""
    return list(AdapterTransition.objects.filter(adapter=name).select_related("actor", "job").order_by("at", "id"))


def transition_out(transition: AdapterTransition) -> dict:
    return {"from_state": transition.from_state or None, "to_state": transition.to_state,
            "actor": transition.actor.username if transition.actor_id else None, "reason": transition.reason,
            "job_id": str(transition.job.uuid) if transition.job_id else None,
            "content_sha256": transition.content_sha256 or None, "at": transition.at}


def adapter_files_detail(*, adapter: Adapter) -> list[dict]:
    """Every file in the adapter's folder with its size and sha256 (flat: an adapter has no sub-folders)."""
    from adapters.content import ADAPTER_FILES, file_sha256, folder_files

    if not adapter.path:
        return []
    root = Path(adapter.path)
    return [{"file": name, "size": (root / name).stat().st_size, "sha256": file_sha256(root / name),
             "defines_adapter": name in ADAPTER_FILES} for name in folder_files(root)]


def job_summary(job: Job | None) -> dict | None:
    if job is None:
        return None
    result = job.result or {}
    return {"job_id": str(job.uuid), "kind": job.kind, "state": job.state, "title": job.title,
            "created_at": job.created_at, "started_at": job.started_at, "finished_at": job.finished_at,
            "submitted_by": job.submitted_by.username if job.submitted_by_id else None,
            "final_step": result.get("final_step"), "total_steps": result.get("total_steps"),
            "effective_seed": result.get("effective_seed"),
            "error": job_error(job)}


def _post_eval_job(training_job: Job | None) -> Job | None:
    """The post-eval of the training job (training.post_eval_jobs queues it and names it in the result)."""
    if training_job is None:
        return None
    job_id = (training_job.result or {}).get("post_eval_job_id")
    if job_id:
        return Job.objects.filter(uuid=job_id).first()
    return None


def _eval_jobs_of(adapter: Adapter) -> list[dict]:
    """Eval jobs that sampled this adapter as one of their targets, newest first; not those of an
    earlier adapter of the same name (they were queued before this row existed)."""
    name = adapter.name
    rows = []
    jobs = Job.objects.filter(kind=EVAL_KIND, deleted_at__isnull=True, created_at__gte=adapter.created_at
                              ).order_by("-id")[:MAX_EVAL_JOBS_SCANNED]
    for job in jobs:
        targets = (job.payload or {}).get("targets") or []
        indexes = [i for i, t in enumerate(targets) if isinstance(t, dict) and t.get("adapter") == name]
        if not indexes:
            continue
        per_target = {t.get("index"): t for t in (job.result or {}).get("targets") or [] if isinstance(t, dict)}
        mine = per_target.get(indexes[0]) or {}
        rows.append({"job_id": str(job.uuid), "state": job.state, "mode": (job.payload or {}).get("mode"),
                     "suite": ((job.payload or {}).get("suite") or {}).get("name"),
                     "accuracy": mine.get("accuracy"), "total": mine.get("total"), "counts": mine.get("counts"),
                     "targets": [t.get("adapter") for t in targets if isinstance(t, dict)],
                     "finished_at": job.finished_at})
    return rows


def adapter_evaluations(*, adapter: Adapter) -> dict:
    """The post-eval gate (outcome, verdict, evidence) of the producing training job, the gate receipts
    recorded for this adapter, and every eval job that sampled it (an earlier adapter's of the same
    name are not this one's)."""
    post_eval = _post_eval_job(adapter.training_job)
    result = (post_eval.result or {}) if post_eval else {}
    gate = None if post_eval is None else {
        "job_id": str(post_eval.uuid), "state": post_eval.state, "gate_outcome": result.get("gate_outcome"),
        "post_eval_verdict": result.get("post_eval_verdict"),
        "evidence": result.get("post_eval_gate_evidence", []),
        "linked_eval_job_ids": result.get("linked_eval_job_ids", []),
        "evaluated_at": result.get("evaluated_at"), "activated_at": result.get("activated_at")}
    receipts = adapter_receipt_rows(adapter=adapter).filter(kind=ReceiptKind.POST_EVAL_GATE).order_by("created_at", "id")
    return {"post_eval": gate,
            "gate_receipts": [{"sha256": r.sha256, "created_at": r.created_at,
                               "outcome": ((r.body or {}).get("evidence") or {}).get("outcome")} for r in receipts],
            "eval_jobs": _eval_jobs_of(adapter)}


def adapter_lineage(*, adapter: Adapter) -> list[dict]:
    """The chain up `base_adapter`, nearest parent first; a parent no longer in the registry is named
    with `missing`, and the chain stops there (or at a cycle)."""
    chain, seen, current = [], {adapter.name}, adapter.base_adapter
    while current and len(chain) < MAX_LINEAGE:
        if current in seen:
            chain.append({"name": current, "cycle": True})
            break
        seen.add(current)
        parent = Adapter.objects.filter(name=current).first()
        if parent is None:
            chain.append({"name": current, "missing": True})
            break
        chain.append({"name": parent.name, "status": adapter_status(parent),
                      "content_sha256": parent.content_sha256 or None,
                      "training_job_id": str(parent.training_job.uuid) if parent.training_job_id else None})
        current = parent.base_adapter
    return chain


def adapter_receipts(*, name: str) -> list[dict]:
    """The receipt rows about the adapter now named `name` (all rows by that name when none is)."""
    adapter = adapter_get(name=name)
    rows = adapter_receipt_rows(adapter=adapter) if adapter is not None else Receipt.objects.filter(subject=name)
    return [{"kind": r.kind, "sha256": r.sha256, "schema": r.schema, "created_at": r.created_at,
             "job_id": str(r.job.uuid) if r.job_id else None}
            for r in rows.select_related("job").order_by("created_at", "id")]
