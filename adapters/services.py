"""Adapter state changes: reserve a name for a training job, publish it, release it on failure, load
it (through adapters.activation: the serving canary) and unload it, demote it, upload one, delete one.
Every change appends an AdapterTransition (who, why, which job) in the transaction that makes it."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from adapters.delete_guards import (
    descendants,
    refuse_descendants,
    refuse_while_a_training_builds_on,
    refuse_while_promotion_open,
)
from adapters.manifest import MANIFEST_FILE, MANIFEST_SCHEMA
from adapters.models import Adapter, AdapterState, AdapterStatus, AdapterTransition
from core.accounts.permissions import check_owner_or_permitted
from core.artifacts import CHECKPOINT_SUFFIX, StagedDirectory, ensure_dir, hidden_sibling, retire_directory
from core.canonical import sha256_digest
from core.content_identity import file_sha256
from core.contracts.names import is_valid_name
from core.db_locks import REGISTRY, serialize
from core.errors import KilnError

log = logging.getLogger(__name__)

RECEIPT_FILE = "train_receipt.json"
ACTIVATION_SCHEMA = "kiln.adapter-activation.v1"  # the same receipt the post-eval gate writes


def adapters_root() -> Path:
    return ensure_dir(settings.KILN.layout.adapters)


def validate_adapter_name(name: str, *, field: str = "output_name") -> str:
    if not is_valid_name(name, reserved=("base",)):
        raise KilnError("invalid_adapter_name", f"{field}: {name!r} is not a valid adapter name", status=400, field=field,
                        hint="use letters, digits, '.', '_' and '-' (at most 64), e.g. math-r001")
    return name


def status_of(adapter: Adapter | None) -> str:
    """writing | available | active | failed (a reservation whose job ended without publishing)."""
    from adapters.selectors import adapter_status

    return adapter_status(adapter) if adapter is not None else ""


def _actor(user):
    """The user to record: a real, saved user; None for the system or anonymous loopback access."""
    return user if user is not None and getattr(user, "pk", None) is not None else None


def transition_record(*, name: str, from_state: str, to_state: str, actor=None, reason: str = "", job=None,
                      content_sha256: str = "") -> AdapterTransition:
    return AdapterTransition.objects.create(adapter=name, from_state=from_state or "", to_state=to_state,
                                            actor=_actor(actor), reason=reason, job=job,
                                            content_sha256=content_sha256 or "")


def _not_found(name: str) -> KilnError:
    return KilnError("adapter_not_found", f"no adapter named {name!r}", status=404,
                     hint="list adapters with GET /v1/adapters (kiln adapters list)")


def _name_in_use(existing: Adapter, *, field: str = "") -> KilnError:
    doing = "being written" if existing.state == AdapterState.WRITING else "published"
    return KilnError("adapter_revision_conflict", f"adapter {existing.name!r} is already {doing}", status=409,
                     field=field, hint="use a new versioned output name for every round, e.g. math-r002")


def check_output_name_free(name: str, *, field: str = "") -> None:
    """A training's output name must be new (409 adapter_revision_conflict): no registered adapter, and
    no folder the registry does not list (a demoted `<name>.failed`, a copy put there by hand), which
    publication would otherwise meet only after the whole training (adapter_already_exists). Checked at
    admission; adapter_reserve then claims the name in the registry."""
    existing = Adapter.objects.filter(name=name).first()
    if existing is not None:
        raise _name_in_use(existing, field=field)
    if (settings.KILN.layout.adapters / name).exists():
        raise KilnError("adapter_revision_conflict", f"adapter {name!r}: the adapters folder already holds "
                        f"{name}, which is no registered adapter (e.g. a demoted one)", status=409, field=field,
                        hint="use a new versioned output name for every round, e.g. math-r002")


def adapter_reserve(*, name: str, job=None, base_adapter: str = "", actor=None) -> Adapter:
    """Claim a new versioned name for a job. A name in use answers adapter_revision_conflict."""
    validate_adapter_name(name)
    existing = Adapter.objects.filter(name=name).first()
    if existing is not None:
        raise _name_in_use(existing)
    try:
        with transaction.atomic():
            adapter = Adapter.objects.create(name=name, state=AdapterState.WRITING, training_job=job,
                                             base_adapter=base_adapter)
            transition_record(name=name, from_state="", to_state=AdapterStatus.WRITING,
                              actor=actor or (job.submitted_by if job is not None else None), job=job,
                              reason=f"reserved for training job {job.uuid}" if job is not None else "reserved")
            return adapter
    except IntegrityError:
        raise KilnError("adapter_revision_conflict", f"adapter {name!r} was reserved concurrently", status=409,
                        hint="use a new versioned output name") from None


def manifest_sha256(folder: Path) -> str:
    """The sha256 of the folder's adapter_manifest.json ("" without one), recorded on the adapter row at
    publication (Adapter.manifest_sha256)."""
    path = Path(folder) / MANIFEST_FILE
    return file_sha256(path) if path.is_file() else ""


def adapter_publish(*, name: str, path: Path, content_sha256: str, base_model_sha256: str, loaded: bool,
                    actor=None, reason: str = "") -> Adapter:
    with transaction.atomic():
        updated = Adapter.objects.filter(name=name, state=AdapterState.WRITING).update(
            state=AdapterState.PUBLISHED, path=str(path), content_sha256=content_sha256,
            base_model_sha256=base_model_sha256, loaded=loaded, published_at=timezone.now(),
            manifest_sha256=manifest_sha256(path))
        if not updated:
            raise KilnError("adapter_revision_conflict", f"adapter {name!r} is no longer reserved", status=409)
        adapter = Adapter.objects.select_related("training_job").get(name=name)
        job = adapter.training_job
        transition_record(name=name, from_state=AdapterStatus.WRITING,
                          to_state=AdapterStatus.ACTIVE if loaded else AdapterStatus.AVAILABLE,
                          actor=actor or (job.submitted_by if job is not None else None), job=job,
                          content_sha256=content_sha256,
                          reason=reason or ("published and activated (auto_load)" if loaded else "published"))
    return adapter


def adapter_release(*, name: str, reason: str = "") -> None:
    """Forget a reservation whose job failed or was cancelled, so the name can be used again.

    The trainer writes the adapter folder atomically (hidden sibling, then rename) before the
    registry publishes it, so a job stopped between the two (killed, cancelled, or its publication
    refused) leaves a complete folder no registry row lists, which would hold the name for good
    (check_output_name_free) and block the resume its error offers. The reservation owned that name,
    so its folder goes with it (the checkpoints, a resume point, stay)."""
    with transaction.atomic():
        adapter = Adapter.objects.select_related("training_job").filter(name=name, state=AdapterState.WRITING).first()
        if adapter is None:
            return
        job = adapter.training_job
        adapter.delete()
        transition_record(name=name, from_state=AdapterStatus.WRITING, to_state=AdapterStatus.FAILED, job=job,
                          actor=job.submitted_by if job is not None else None,
                          reason=reason or (f"training job {job.uuid} ended {job.state} without publishing"
                                            if job is not None else "released without publishing"))
        retired = retire_directory(settings.KILN.layout.adapters / name)
        if retired is not None:  # removed once the release is committed; a rollback leaves it for start-up clean-up
            transaction.on_commit(lambda: shutil.rmtree(retired, ignore_errors=True))


def adapter_demote(*, name: str, actor=None, reason: str = "", job=None) -> Path | None:
    """A gate found the adapter below the floor with confidence: it leaves the registry and its folder
    is renamed `<name>.failed` (kept for audit, never served). Returns the new folder."""
    adapter = Adapter.objects.filter(name=name).first()
    if adapter is None:
        return None
    from_state = status_of(adapter)
    moved = None
    if adapter.path and Path(adapter.path).is_dir():
        target = Path(adapter.path).with_name(f"{name}.failed")
        suffix = 1
        while target.exists():
            suffix += 1
            target = Path(adapter.path).with_name(f"{name}.failed.{suffix}")
        Path(adapter.path).rename(target)
        moved = target
    with transaction.atomic():
        adapter.delete()
        transition_record(name=name, from_state=from_state, to_state=AdapterStatus.FAILED, actor=actor, job=job,
                          content_sha256=adapter.content_sha256,
                          reason=reason or f"demoted by a post-eval gate; its folder is now {moved or 'gone'}")
    return moved


# -- changes asked for through /v1/adapters (a user is the actor) --------------------------------------

def check_activation_right(user, *, field: str = "name") -> None:
    """Activating or unloading by hand changes what serves: while promotions need approval ([promotion]
    require_approval; unset, on whenever more than one user exists) that is an approver's call
    (jobs.approve_promotion); otherwise anyone who may submit work may."""
    from adapters.promotions import approval_required

    if user is None or user.has_perm("jobs.approve_promotion"):
        return
    if approval_required():
        raise KilnError("activation_needs_approval", "changing the active adapter by hand needs the "
                        "approve_promotion permission while promotions need approval", status=403, field=field,
                        hint="request it as a promotion instead (kiln adapters activate NAME, POST "
                             "/v1/adapters/{name}/activate), or ask a user with jobs.approve_promotion")


def _locked(name: str) -> Adapter:
    adapter = Adapter.objects.select_for_update(of=("self",)).select_related("training_job").filter(name=name).first()
    if adapter is None:
        raise _not_found(name)
    return adapter


def _busy(adapter: Adapter, verb: str) -> KilnError:
    job = adapter.training_job
    return KilnError("adapter_busy", f"adapter {adapter.name!r} is being written"
                     + (f" by training job {job.uuid} ({job.state})" if job is not None else "")
                     + f"; it cannot be {verb} yet", status=409,
                     hint="wait for the training job to finish, or cancel it (kiln jobs cancel ID)")


def _check_review_respected(name: str, actor) -> None:
    """While promotions need approval, an approver's direct load must not undo the review: not a
    candidate whose latest promotion was rejected, nor one the loader requested and no one else
    approved yet (unless [promotion] allow_self_approval)."""
    from adapters.models import Promotion, PromotionState
    from adapters.promotions import approval_required, self_approval_allowed

    if actor is None or not approval_required():
        return
    latest = Promotion.objects.filter(candidate=name).order_by("-id").first()
    if latest is None:
        return
    if latest.state == PromotionState.REJECTED:
        raise KilnError("adapter_promotion_rejected", f"promotion {latest.id} of {name!r} was rejected; loading it "
                        "by hand would override that decision", status=409,
                        hint=f"request a new promotion (kiln adapters activate {name}) for a reviewer to decide")
    if latest.state == PromotionState.PENDING and latest.requested_by_id == getattr(actor, "id", None) \
            and not self_approval_allowed(actor):
        raise KilnError("promotion_self_approval", f"you requested promotion {latest.id} of {name!r}; loading it "
                        "by hand would approve your own request", status=409,
                        hint="another reviewer approves it (kiln promotions approve "
                             f"{latest.id}), or set [promotion] allow_self_approval")


def adapter_load(*, name: str, actor=None, allow_quarantined: bool = False, reason: str = "") -> Adapter:
    """Make a published adapter the active one, by hand (POST /v1/adapters/load): the serving canary
    runs first (adapters.activation); a failure quarantines it (500 adapter_load_failed), a quarantined
    adapter needs allow_quarantined (409 adapter_quarantined), no GPU worker answers 503."""
    from adapters.activation import activate_with_canary

    check_activation_right(actor)
    adapter = Adapter.objects.select_related("training_job").filter(name=name).first()
    if adapter is None:
        raise _not_found(name)
    if adapter.state == AdapterState.WRITING:
        raise _busy(adapter, "loaded")
    if adapter.loaded:
        return adapter
    _check_review_respected(name, actor)
    adapter, _ = activate_with_canary(name=name, actor=_actor(actor), reason=reason or "loaded by hand",
                                      allow_quarantined=allow_quarantined)
    return adapter


def adapter_unload(*, name: str, actor=None, reason: str = "") -> Adapter:
    """Stop serving an adapter by default (it stays published and can be loaded again)."""
    check_activation_right(actor)
    with transaction.atomic():
        serialize(REGISTRY)
        adapter = _locked(name)
        if adapter.state == AdapterState.WRITING:
            raise _busy(adapter, "unloaded")
        if adapter.loaded:
            from adapters.activation import supersede_stale_promotions

            Adapter.objects.filter(id=adapter.id).update(loaded=False)
            transition_record(name=name, from_state=AdapterStatus.ACTIVE, to_state=AdapterStatus.AVAILABLE,
                              actor=actor, content_sha256=adapter.content_sha256,
                              reason=reason or "unloaded by hand")
            supersede_stale_promotions(active=None, actor=actor)
    return Adapter.objects.get(name=name)


CHECKPOINT_NAME = r"-checkpoint-step-\d{8}" + re.escape(CHECKPOINT_SUFFIX)


def adapter_checkpoints(name: str) -> list[Path]:
    """The `<name>-checkpoint-step-<8 digits>.kiln-checkpoint` folders of an adapter (spec §2.10)."""
    root = settings.KILN.layout.adapters
    if not root.is_dir():
        return []
    pattern = re.compile(re.escape(name) + CHECKPOINT_NAME + "$")
    return sorted(p for p in root.iterdir() if pattern.match(p.name) and p.is_dir() and not p.is_symlink())


def _inside_registry(path: Path) -> bool:
    root = settings.KILN.layout.adapters.resolve()
    try:
        return Path(path).resolve().parent == root and not Path(path).is_symlink()
    except OSError:
        return False


def adapter_owner_id(adapter: Adapter) -> int | None:
    """Who made the adapter: its training job's submitter, else the actor of the transition that created
    this row (the uploader, or a reservation's actor; the latest one, as a name can be reused). None:
    made anonymously or by Kiln itself."""
    if adapter.training_job_id is not None:
        return adapter.training_job.submitted_by_id
    return (AdapterTransition.objects.filter(adapter=adapter.name, from_state="").order_by("-id")
            .values_list("actor_id", flat=True).first())


def adapter_check_delete(*, adapter: Adapter, user) -> None:
    """The rule for others' work (core.accounts.permissions): only the adapter's owner or a holder of
    jobs.delete_others_jobs deletes it (403 adapter_delete_forbidden)."""
    check_owner_or_permitted(owner_id=adapter_owner_id(adapter), user=user, what=f"adapter {adapter.name!r}",
                             code="adapter_delete_forbidden")


def adapter_delete(*, name: str, actor=None, reason: str = "", force: bool = False) -> dict:
    """Remove an adapter that is neither active nor being written: its row, its folder and its
    checkpoints. Its receipts and transitions stay as rows. Folders leave by a rename to a hidden
    sibling first, so no reader ever sees half an adapter. `actor` must own it or hold
    jobs.delete_others_jobs (adapter_check_delete). An adapter other published adapters were trained
    from is kept unless `force` (409 adapter_has_descendants): their lineage would break."""
    with transaction.atomic():
        serialize(REGISTRY)  # a promotion being requested for it now is either seen below or sees it gone
        adapter = _locked(name)
        adapter_check_delete(adapter=adapter, user=actor)  # first: a refused caller learns nothing of its state
        status = status_of(adapter)
        if status == AdapterStatus.WRITING:
            raise _busy(adapter, "deleted")
        if adapter.loaded:
            raise KilnError("adapter_active", f"adapter {name!r} is active; unload it before deleting it",
                            status=409, hint=f"kiln adapters unload {name} (POST /v1/adapters/unload)")
        refuse_while_promotion_open(name)
        refuse_while_a_training_builds_on(name)
        children = descendants(name)
        if children and not force:
            refuse_descendants(name, children)
        if children:  # forced: the history says whose lineage it broke
            reason = f"{reason or 'deleted by hand'} (forced: the base adapter of {', '.join(children[:5])})"
        folders = [p for p in [Path(adapter.path)] if adapter.path and p.is_dir() and _inside_registry(p)]
        folders += adapter_checkpoints(name)
        adapter.delete()
        transition_record(name=name, from_state=status, to_state=AdapterStatus.DELETED, actor=actor,
                          content_sha256=adapter.content_sha256, reason=reason or "deleted by hand")
        retired = []
        try:
            for folder in folders:
                target = hidden_sibling(folder, "deleted")
                folder.rename(target)
                retired.append((folder, target))
        except OSError as exc:
            for folder, target in reversed(retired):
                target.rename(folder)
            raise KilnError("adapter_delete_failed", f"adapter {name!r} could not be removed: {exc}",
                            status=500, hint="check the permissions of the adapter registry folder") from None
    for _, target in retired:
        shutil.rmtree(target, ignore_errors=True)
    return {"name": name, "status": AdapterStatus.DELETED, "removed": [str(f) for f, _ in retired]}


def _served_base_model_sha256() -> str:
    from adapters.serving.selectors import served_model_identity

    try:
        identity = served_model_identity() or {}
    except Exception:  # noqa: BLE001 - no Redis or no worker: the identity is simply unknown
        return ""
    return str(identity.get("base_model_sha256") or "")


def _integrity_failed(file_name: str, detail: str) -> KilnError:
    return KilnError("adapter_archive_integrity_failed", f"archive: {file_name} {detail}", status=400, field="archive",
                     hint="the archive is not the adapter its adapter_manifest.json describes: download it again "
                          "(kiln adapters download NAME), or upload only adapter_config.json and the weights")


def _carried_evidence(files: dict[str, Path]) -> dict | None:
    """The archive's adapter_manifest.json (a Kiln download carries it), once every file it lists that the
    archive holds matches its size and sha256 and train_receipt.json (if present) its receipt_hash; None
    without a manifest. The digests are the publisher's (adapters.manifest.manifest_bytes)."""
    if MANIFEST_FILE not in files:
        return None
    try:
        manifest = json.loads(files[MANIFEST_FILE].read_bytes())
        listed = {entry["file"]: entry for entry in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise _integrity_failed(MANIFEST_FILE, f"is not a readable {MANIFEST_SCHEMA} ({exc})") from None
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise _integrity_failed(MANIFEST_FILE, f"is not a {MANIFEST_SCHEMA}")
    from adapters.peft_layout import CONFIG_FILE, WEIGHTS_FILE

    unlisted = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if name not in listed]
    if unlisted:
        raise _integrity_failed(MANIFEST_FILE, f"does not list {', '.join(unlisted)}: it binds no weights")
    served = _served_base_model_sha256()
    if manifest.get("base_model_sha256") and served and manifest["base_model_sha256"] != served:
        raise _integrity_failed(MANIFEST_FILE, f"names base model {manifest['base_model_sha256']}; this server "
                                f"serves {served}")
    if manifest.get("receipt_hash") and RECEIPT_FILE not in files:
        raise _integrity_failed(MANIFEST_FILE, f"binds a {RECEIPT_FILE} (receipt_hash {manifest['receipt_hash']}) "
                                "that the archive does not hold")
    for file_name, entry in sorted(listed.items()):
        if file_name in files:
            part = files[file_name]
            actual = {"size": part.stat().st_size, "sha256": file_sha256(part)}
            if actual != {"size": entry.get("size"), "sha256": entry.get("sha256")}:
                raise _integrity_failed(file_name, f"has {actual['size']} bytes hashing to {actual['sha256']}; "
                                        f"{MANIFEST_FILE} lists {entry.get('size')} bytes, {entry.get('sha256')}")
    if RECEIPT_FILE in files:
        actual = sha256_digest(files[RECEIPT_FILE].read_bytes())
        if actual != manifest.get("receipt_hash"):
            raise _integrity_failed(RECEIPT_FILE, f"hashes to {actual}; {MANIFEST_FILE}'s receipt_hash is "
                                    f"{manifest.get('receipt_hash')}")
    return manifest


def adapter_upload(*, name: str, archive, size: int | None, actor=None, filename: str = "") -> tuple[Adapter, dict]:
    """Publish an uploaded tar.gz as a new adapter, after checking every member and the PEFT layout
    against the served base model, and the evidence it carries (adapter_manifest.json, train_receipt.json)
    against its bytes. Anything refused leaves nothing in the registry.
    Returns (adapter, {checked layout summary, ignored files, carried files})."""
    from adapters.archive import too_large, unpack_upload
    from adapters.content import content_digest
    from adapters.peft_layout import CONFIG_FILE, WEIGHTS_FILE, LayoutError, check_peft_adapter

    validate_adapter_name(name, field="name")
    limit = settings.KILN.max_adapter_upload_bytes
    if size is not None and size > limit:
        raise too_large(limit, f"the archive ({size} bytes)")
    exists = KilnError("adapter_already_exists", f"an adapter named {name!r} already exists", status=409, field="name",
                       hint="upload under a new versioned name, or delete the old one first")
    root = adapters_root()
    registered = Adapter.objects.filter(name=name).exists()
    if not registered and (root / name).exists():
        # a folder the registry does not list (a gate's demoted `<name>.failed`, a copy put there by hand):
        # no delete reaches it, so the usual hint would send the user in circles (QA)
        raise KilnError("adapter_already_exists", f"the adapters folder already holds {name!r}, which is no "
                        "registered adapter (a demoted one is kept as <name>.failed for audit)", status=409,
                        field="name", hint=f"upload under a new versioned name, or remove {root / name} by hand")
    if registered or adapter_checkpoints(name):
        raise exists
    if settings.KILN.model_path is None:
        raise KilnError("mock_mode", "no base model is configured, so an uploaded adapter cannot be checked",
                        status=400, hint="set model.path in kiln.toml or KILN_MODEL_PATH and restart")
    try:
        staged = StagedDirectory(root / name)
    except FileExistsError:
        raise exists from None
    with staged:
        files = unpack_upload(archive, staged.staging, max_bytes=limit)
        manifest = _carried_evidence(files)
        # Verified evidence is kept (it travels with the weights: /receipt serves it, verify reads it), as a
        # pair: a receipt that no manifest binds to these weights, or a manifest without its receipt, is not.
        carried = [MANIFEST_FILE, RECEIPT_FILE] if manifest is not None and RECEIPT_FILE in files else []
        kept = (CONFIG_FILE, WEIGHTS_FILE, *carried)
        for file_name, part in files.items():
            if file_name in kept:
                part.rename(staged.staging / file_name)
            else:
                part.unlink()
        try:
            summary = check_peft_adapter(staged.staging, settings.KILN.model_path)
        except LayoutError as exc:
            raise KilnError("adapter_upload_invalid", f"archive: {exc}", status=400, field="archive",
                            hint="upload a LoRA adapter trained for the served base model "
                                 "(GET /v1/models names it)") from None
        digest = content_digest(staged.staging)
        if manifest is not None and manifest.get("content_sha256") != digest:
            raise _integrity_failed(MANIFEST_FILE, f"names content {manifest.get('content_sha256')}; the archive's "
                                    f"config and weights hash to {digest}")
        ignored = sorted(set(files) - set(kept))
        try:
            with transaction.atomic():
                adapter = Adapter.objects.create(
                    name=name, state=AdapterState.PUBLISHED, path=str(root / name), content_sha256=digest,
                    base_model_sha256=_served_base_model_sha256(), published_at=timezone.now(),
                    uploaded=True, manifest_sha256=manifest_sha256(staged.staging))
                transition_record(name=name, from_state="", to_state=AdapterStatus.AVAILABLE, actor=actor,
                                  content_sha256=digest,
                                  reason=f"uploaded ({filename})" if filename else "uploaded")
                staged.publish()  # the folder appears with the row, or neither does
        except IntegrityError:
            raise exists from None
        except FileExistsError:
            raise exists from None
    return adapter, {**summary, "ignored_files": ignored, "carried_files": carried}
