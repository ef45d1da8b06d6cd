"""Dataset writes: upload, re-split, delete, and synthesize a suite from a partition (spec §1.4).

A dataset's folder (`HomeLayout.eval_dataset(name)`: data.jsonl, manifest.json, identity.json,
split.json, train.jsonl, validation.jsonl, holdout.jsonl) is always published whole: an upload
fills a hidden staging folder and renames it into place inside the transaction that creates the
row; a new split stages a complete new folder and exchanges it with the old one. A failure leaves
the previous state (or nothing) and no row. The rules themselves are the pure modules
`evaluations.datasets.formats` and `evaluations.datasets.split`.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from core.accounts.permissions import check_owner_or_permitted
from core.artifacts import StagedDirectory, hidden_sibling, json_bytes
from core.canonical import sha256_digest
from core.errors import KilnError
from core.process_locks import ProcessLock
from evaluations.datasets import split as splitting
from evaluations.datasets.formats import FORMATS, FormatError, parse_rows, read_rows, row_bytes
from evaluations.datasets.synthesize import SynthesisError, check_strategy, synthesize_examples
from evaluations.models import EvalDataset
from evaluations.suites import MAX_DESCRIPTION_CHARS, SuiteError, check_name, check_scorer_spec

DATA, MANIFEST, IDENTITY, SPLIT = "data.jsonl", "manifest.json", "identity.json", "split.json"


def invalid(message: str, field: str = "", hint: str = "") -> KilnError:
    return KilnError("eval_invalid_request", f"{field}: {message}" if field else message, hint=hint, status=400,
                     field=field or None)


def dataset_exists_error(name: str) -> KilnError:
    return KilnError("dataset_exists", f"name: a dataset named {name!r} already exists", status=409, field="name",
                     hint=f"choose another name, or delete it first (its Delete button, kiln eval datasets delete "
                          f"{name}, or DELETE /v1/eval/datasets/{name})")


def validate_dataset_name(name) -> str:
    if name is None or (isinstance(name, str) and not name.strip()):
        raise invalid("a dataset name is required", "name", "e.g. -F name=math-train-v1")
    try:
        return check_name(name)
    except SuiteError as exc:
        raise invalid(exc.message, "name", "e.g. math-train-v1") from None


LOCK_TIMEOUT_S = 60.0


@contextmanager
def _name_lock(name: str):
    """One writer per dataset name at a time (upload, re-split, delete), across threads and processes
    on this host; the row's unique name and the folder's exclusive publication guard the rest."""
    lock = ProcessLock(settings.KILN.layout.locks / f"eval-dataset-{name}.lock")
    if not lock.acquire(timeout=LOCK_TIMEOUT_S, poll=0.05):
        raise KilnError("dataset_registry_unavailable", f"dataset {name!r} is being changed by another request",
                        status=503, hint="retry in a moment", headers={"Retry-After": "5"})
    try:
        yield
    finally:
        lock.release()


def _split_config(value) -> splitting.SplitConfig:
    try:
        return splitting.parse_split_config(value)
    except splitting.SplitError as exc:
        raise invalid(exc.message, exc.field, "train_percent > 0, train_percent + validation_percent < 100, "
                                              "seed a decimal u64 string") from None


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _files(*, name: str, fmt: str, description: str, rows: list[dict], config: splitting.SplitConfig,
           source_sha256: str, created_at: str) -> tuple[dict[str, bytes], dict]:
    """Every file of the dataset's folder, and its manifest."""
    identities = splitting.row_identities(rows)
    split = splitting.compute_split(identities, config)
    split_doc = splitting.split_manifest(dataset=name, identities=identities, split=split)
    split_data = splitting.split_manifest_bytes(split_doc)
    partitions = {p: row_bytes([rows[i] for i in split.rows_of(p)]) for p in splitting.PARTITIONS}
    manifest = splitting.dataset_manifest(name=name, fmt=fmt, description=description, identities=identities,
                                          split=split, split_sha256=sha256_digest(split_data),
                                          created_at=created_at, source_sha256=source_sha256)
    manifest["partition_sha256"] = {p: sha256_digest(data) for p, data in partitions.items()}
    identity = splitting.identity_document(name=name, fmt=fmt, identities=identities, source_sha256=source_sha256)
    files = {DATA: row_bytes(rows), IDENTITY: json_bytes(identity), SPLIT: split_data, MANIFEST: json_bytes(manifest),
             **{f"{p}.jsonl": data for p, data in partitions.items()}}
    return files, manifest


def _stage(final: Path, files: dict[str, bytes], *, replace: bool) -> StagedDirectory:
    staged = StagedDirectory(final, replace=replace)
    try:
        for filename, data in files.items():
            (staged.staging / filename).write_bytes(data)
            os.chmod(staged.staging / filename, 0o644)
    except BaseException:
        staged.discard()
        raise
    return staged


def _row_fields(manifest: dict) -> dict:
    return {"rows": manifest["rows"], "corpus_sha256": manifest["corpus_sha256"],
            "normalized_corpus_sha256": manifest["normalized_corpus_sha256"],
            "split_manifest_sha256": manifest["split_manifest_sha256"], "split_config": manifest["split_config"],
            "split_counts": manifest["split_counts"], "num_groups": manifest["num_groups"],
            "num_sessions": manifest["num_sessions"]}


def dataset_upload(*, name, fmt, description="", content: bytes, user=None) -> EvalDataset:
    """Register a dataset from an uploaded JSONL file, split with the default config."""
    name = validate_dataset_name(name)
    if fmt not in FORMATS:
        raise invalid(f"must be one of {', '.join(FORMATS)}, not {fmt!r}", "format")
    description = (description or "").strip()
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise invalid(f"at most {MAX_DESCRIPTION_CHARS} characters", "description")
    limit = settings.KILN.max_request_bytes
    if len(content) > limit:
        raise KilnError("request_too_large", f"file: the file is {len(content)} bytes; an upload may hold at most "
                        f"{limit}", status=413, hint="raise KILN_MAX_REQUEST_BYTES, or split the file")
    try:
        rows, _lines = parse_rows(content, fmt)
    except FormatError as exc:  # the request was well formed, its file is not a dataset of that format
        raise KilnError("dataset_invalid", exc.message, status=400, field="file",
                        hint=f"each line must be one {fmt} row as JSON") from None
    with _name_lock(name):
        if EvalDataset.objects.filter(name=name).exists():
            raise dataset_exists_error(name)
        files, manifest = _files(name=name, fmt=fmt, description=description, rows=rows,
                                 config=splitting.parse_split_config(None), source_sha256=sha256_digest(content),
                                 created_at=_now())
        final = settings.KILN.layout.eval_dataset(name)
        try:
            staged = _stage(final, files, replace=False)
        except FileExistsError:
            raise dataset_exists_error(name) from None
        try:
            with transaction.atomic():
                dataset = EvalDataset.objects.create(
                    name=name, format=fmt, description=description, path=str(final), **_row_fields(manifest),
                    created_by=user if getattr(user, "is_authenticated", False) else None)
                staged.publish()
        except IntegrityError:
            staged.discard()
            raise dataset_exists_error(name) from None
        except FileExistsError:  # another upload published the folder first
            raise dataset_exists_error(name) from None
        except BaseException:
            staged.discard()
            raise
    return dataset


def _stored_rows(dataset: EvalDataset) -> list[dict]:
    return read_rows((Path(dataset.path) / DATA).read_bytes())


def dataset_split_preview(*, dataset: EvalDataset, config) -> dict:
    """The counts a split config would give, without writing anything."""
    parsed = _split_config(config)
    identities = splitting.row_identities(_stored_rows(dataset))
    split = splitting.compute_split(identities, parsed)
    return {"dataset": dataset.name, "split_config": parsed.to_dict(), "split_counts": dict(split.counts),
            "component_counts": dict(split.component_counts), "num_components": split.num_components}


def dataset_split_update(*, dataset: EvalDataset, config, user=None) -> EvalDataset:
    """Re-split with a new config and republish the whole folder (data unchanged) atomically. Another
    user's dataset only with jobs.delete_others_jobs (dataset_split_forbidden): its partitions are
    what their suites and held-out gates were drawn from."""
    parsed = _split_config(config)
    with _name_lock(dataset.name), transaction.atomic():
        dataset = EvalDataset.objects.select_for_update().filter(pk=dataset.pk).first()
        if dataset is None:
            raise KilnError("dataset_not_found", "the dataset was deleted meanwhile", status=404)
        dataset_check_split(dataset=dataset, user=user)
        folder = Path(dataset.path)
        try:
            old = json.loads((folder / MANIFEST).read_bytes())
            data = (folder / DATA).read_bytes()
            identity = (folder / IDENTITY).read_bytes()
        except (OSError, ValueError) as exc:
            raise KilnError("dataset_invalid", f"dataset {dataset.name!r} cannot be read: {exc}", status=500,
                            hint="delete the dataset and upload it again") from None
        files, manifest = _files(name=dataset.name, fmt=dataset.format, description=dataset.description,
                                 rows=read_rows(data), config=parsed, source_sha256=old["source_sha256"],
                                 created_at=old["created_at"])
        manifest["split_updated_at"] = _now()
        files[MANIFEST] = json_bytes(manifest)
        files[IDENTITY] = identity
        for field, value in _row_fields(manifest).items():
            setattr(dataset, field, value)
        dataset.save()
        _stage(folder, files, replace=True).publish()
    return dataset


def dataset_check_split(*, dataset: EvalDataset, user) -> None:
    """Re-splitting another user's dataset needs jobs.delete_others_jobs (403 dataset_split_forbidden)."""
    check_owner_or_permitted(owner_id=dataset.created_by_id, user=user, what=f"dataset {dataset.name!r}",
                             code="dataset_split_forbidden")


def dataset_check_delete(*, dataset: EvalDataset, user) -> None:
    """The rule for others' work (core.accounts.permissions): only the dataset's uploader
    (created_by) or a holder of jobs.delete_others_jobs deletes it (403 dataset_delete_forbidden)."""
    check_owner_or_permitted(owner_id=dataset.created_by_id, user=user, what=f"dataset {dataset.name!r}",
                             code="dataset_delete_forbidden")


def dataset_delete(*, dataset: EvalDataset, user=None) -> None:
    """Remove the row and the folder (renamed aside first, so no half-removed folder is visible).
    `user` must own it or hold jobs.delete_others_jobs (dataset_check_delete); refused, nothing changes."""
    folder = Path(dataset.path)
    aside = hidden_sibling(folder, "deleted")
    with _name_lock(dataset.name), transaction.atomic():
        current = EvalDataset.objects.select_for_update().filter(pk=dataset.pk).first()
        dataset_check_delete(dataset=current or dataset, user=user)  # the row as it is now, under the lock
        EvalDataset.objects.filter(pk=dataset.pk).delete()
        if folder.exists():
            os.rename(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def dataset_synthesize(*, dataset: EvalDataset, body, user=None):
    """Create (or with force replace) an eval suite from one partition's rows."""
    from evaluations.dataset_selectors import dataset_partition_entries
    from evaluations.suite_services import suite_store

    if not isinstance(body, dict):
        raise invalid("must be a JSON object with suite_name", "request")
    suite_name = body.get("suite_name")
    partition = body.get("source_split", "holdout")
    if partition not in splitting.PARTITIONS:
        raise invalid(f"must be one of {', '.join(splitting.PARTITIONS)}", "source_split")
    head_n = body.get("head_n")
    if head_n is not None and (isinstance(head_n, bool) or not isinstance(head_n, int) or head_n < 1):
        raise invalid("must be a positive integer", "head_n")
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise invalid("must be true or false", "force")
    try:
        check_name(suite_name, "suite_name")
        strategy = check_strategy(dataset.format, body.get("strategy"))
        scorer = check_scorer_spec(body.get("scorer", {"type": "exact"}))
    except (SuiteError, SynthesisError) as exc:
        raise invalid(exc.message, exc.field) from None
    selected = dataset_partition_entries(dataset=dataset, partition=partition)
    if not selected.entries:
        raise invalid(f"partition {partition} of dataset {dataset.name!r} is empty", "source_split",
                      "choose another partition, or re-split (PUT /v1/eval/datasets/{name}/split)")
    rows, entries = selected.rows, selected.entries
    if head_n is not None:
        rows, entries = rows[:head_n], entries[:head_n]
    try:
        examples = synthesize_examples(dataset=dataset.name, fmt=dataset.format, strategy=strategy,
                                       partition=partition, rows=rows, entries=entries,
                                       corpus_sha256=selected.corpus_sha256,
                                       split_manifest_sha256=selected.split_manifest_sha256)
    except SynthesisError as exc:
        raise invalid(exc.message, exc.field) from None
    source = {"kind": "dataset", "dataset": dataset.name, "partition": partition, "strategy": strategy,
              "head_n": head_n, "corpus_sha256": selected.corpus_sha256,
              "split_manifest_sha256": selected.split_manifest_sha256}
    return suite_store(body={"name": suite_name, "description": f"from dataset {dataset.name} ({partition})",
                             "scorer": scorer, "examples": examples}, force=force, source=source, user=user)
