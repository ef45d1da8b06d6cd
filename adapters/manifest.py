"""`adapter_manifest.json`: what a published adapter folder holds, bound to its train receipt.

Written next to the weights when a training job publishes (training.runner) and exported as an
OpenEnv run's `adapter_manifest` artifact (openenv.training.follow). It names the adapter, its
content digest and files, its base model and warm-start adapter, the training job and the corpus
it was admitted with, and `receipt_hash`: the SHA-256 of the exact train_receipt.json bytes
(reference-spec §2.9), so the folder can be audited without the registry. `kiln adapters verify`
checks it (adapter_manifest.file). Pure: no Django.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.canonical import sha256_digest
from core.content_identity import adapter_files, file_manifest

MANIFEST_FILE = "adapter_manifest.json"
MANIFEST_SCHEMA = "kiln.adapter-manifest.v1"


def manifest_bytes(folder: Path, *, name: str, content_sha256: str, receipt_bytes: bytes,
                   base_model_sha256: str | None, base_adapter: str | None, training_job_id: str | None,
                   admitted_corpus_sha256: str | None) -> bytes:
    manifest = {"schema": MANIFEST_SCHEMA, "adapter_name": name, "content_sha256": content_sha256,
                "base_model_sha256": base_model_sha256 or None, "base_adapter": base_adapter or None,
                "files": file_manifest(Path(folder), adapter_files(Path(folder))),
                "receipt_hash": sha256_digest(receipt_bytes), "training_job_id": training_job_id,
                "admitted_corpus_sha256": admitted_corpus_sha256}
    return (json.dumps(manifest, indent=2) + "\n").encode()
