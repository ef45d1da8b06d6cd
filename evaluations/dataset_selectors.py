"""Dataset reads: the registry rows, and the published files of one dataset (manifest, split,
rows, one partition). Files are read from the folder the services publish whole; a partition read
is checked against the digest its manifest recorded, so a reader never mixes two splits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from core.canonical import sha256_digest
from core.errors import KilnError
from evaluations.datasets.formats import read_rows
from evaluations.models import EvalDataset

MAX_PAGE = 500
READ_ATTEMPTS = 3


def dataset_list():
    return EvalDataset.objects.all().order_by("name")


def dataset_get(*, name: str) -> EvalDataset | None:
    if not isinstance(name, str) or not name:
        return None
    return EvalDataset.objects.filter(name=name).first()


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise KilnError("dataset_invalid", f"{path.name} of the dataset cannot be read: {exc}", status=500,
                        hint="delete the dataset and upload it again") from None


def dataset_manifest(*, dataset: EvalDataset) -> dict:
    manifest = _read_json(Path(dataset.path) / "manifest.json")
    manifest.pop("schema", None)
    return manifest


def dataset_split_manifest(*, dataset: EvalDataset) -> dict:
    return _read_json(Path(dataset.path) / "split.json")


@dataclass(frozen=True)
class Partition:
    dataset: str
    partition: str
    data: bytes  # the partition file's bytes (compact JSON lines)
    path: Path
    corpus_sha256: str
    split_manifest_sha256: str
    format: str


def dataset_partition(*, dataset: EvalDataset, partition: str) -> Partition:
    """One partition's bytes with the digests of the split they belong to (consistent: re-read when a
    new split was published between the two reads)."""
    folder = Path(dataset.path)
    for _attempt in range(READ_ATTEMPTS):
        manifest = _read_json(folder / "manifest.json")
        try:
            data = (folder / f"{partition}.jsonl").read_bytes()
        except OSError:
            continue
        if sha256_digest(data) == manifest.get("partition_sha256", {}).get(partition):
            return Partition(dataset.name, partition, data, folder / f"{partition}.jsonl", manifest["corpus_sha256"],
                             manifest["split_manifest_sha256"], manifest["format"])
    raise KilnError("dataset_invalid", f"partition {partition} of dataset {dataset.name!r} does not match its "
                    "manifest", status=500, hint="retry; if it persists, re-split or upload the dataset again")


@dataclass(frozen=True)
class PartitionEntries:
    rows: list[dict]
    entries: list[dict]  # the split manifest's entries of those rows
    corpus_sha256: str
    split_manifest_sha256: str


def _split_and_rows(dataset: EvalDataset) -> tuple[dict, str, list[dict]]:
    """split.json (one file, read whole), its digest, and the rows. data.jsonl never changes after
    the upload (a new split republishes the same bytes), so any split read matches it."""
    folder = Path(dataset.path)
    try:
        split_bytes = (folder / "split.json").read_bytes()
        split = json.loads(split_bytes)
        rows = read_rows((folder / "data.jsonl").read_bytes())
    except (OSError, ValueError) as exc:
        raise KilnError("dataset_invalid", f"dataset {dataset.name!r} cannot be read: {exc}", status=500,
                        hint="delete the dataset and upload it again") from None
    return split, sha256_digest(split_bytes), rows


def dataset_partition_entries(*, dataset: EvalDataset, partition: str) -> PartitionEntries:
    split, split_sha256, rows = _split_and_rows(dataset)
    entries = [e for e in split["rows"] if e["partition"] == partition]
    return PartitionEntries([rows[e["row"] - 1] for e in entries], entries, split["corpus_sha256"], split_sha256)


def dataset_rows(*, dataset: EvalDataset, offset: int = 0, limit: int = 100, partition: str | None = None) -> dict:
    """A page of rows: {dataset, partition, offset, limit, total, rows: [{row, partition, data}]}."""
    split, _digest, rows = _split_and_rows(dataset)
    entries = [e for e in split["rows"] if partition is None or e["partition"] == partition]
    limit = max(1, min(int(limit), MAX_PAGE))
    offset = max(0, int(offset))
    page = entries[offset:offset + limit]
    return {"dataset": dataset.name, "partition": partition, "offset": offset, "limit": limit,
            "total": len(entries),
            "rows": [{"row": e["row"], "partition": e["partition"], "data": rows[e["row"] - 1]} for e in page]}

