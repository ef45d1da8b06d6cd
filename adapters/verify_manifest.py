"""The `adapter_manifest.json` link of the chain verifier: the manifest the publisher wrote (or an upload
carried) still lists the folder's files with their sizes and sha256s, binds train_receipt.json by its
bytes, and names this adapter, its base model, corpus and job. Registered in adapters/verify_links.py,
in walking order."""

from __future__ import annotations

import json
from pathlib import Path

from adapters.verify import Chain, broken, ok, unchecked, uploaded_elsewhere
from core.canonical import sha256_digest
from core.content_identity import file_sha256


def _manifest_expectations(chain: Chain) -> dict:
    """What adapter_manifest.json's own fields must say: the registry row, the training job and its
    receipt row for a trained adapter; for an upload, the receipt it carried (nothing without one)."""
    if chain.uploaded:
        receipt = chain.carried_receipt
        return {"adapter_name": receipt.get("adapter_name"),
                "base_model_sha256": (receipt.get("model") or {}).get("base_model_sha256"),
                "admitted_corpus_sha256": (receipt.get("training_data") or {}).get("sha256")} if receipt else {}
    job = chain.training_job or chain.adapter.training_job
    return {"adapter_name": chain.name, "base_model_sha256": chain.adapter.base_model_sha256,
            "training_job_id": str(job.uuid) if job else None,
            "admitted_corpus_sha256": (chain.payload.get("training_data") or {}).get("admitted_corpus_sha256")}


def _manifest_files(chain: Chain, manifest: dict):
    """files[]: each listed file is in the folder with that size and sha256 (None: all match)."""
    from adapters.manifest import MANIFEST_FILE

    entries = manifest.get("files")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return broken("adapter_manifest.file", f"{MANIFEST_FILE} has no files list")
    for entry in entries:
        name = entry.get("file")
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            return broken("adapter_manifest.file", f"{MANIFEST_FILE} lists {name!r}, not a file of an adapter folder")
        path = chain.folder / name
        if not path.is_file():
            return broken("adapter_manifest.file", f"{MANIFEST_FILE} lists {name}, which is missing", entry, None)
        actual = {"file": name, "size": path.stat().st_size, "sha256": file_sha256(path)}
        if actual != {"file": name, "size": entry.get("size"), "sha256": entry.get("sha256")}:
            return broken("adapter_manifest.file", f"{name} has {actual['size']} bytes hashing to {actual['sha256']}; "
                          f"{MANIFEST_FILE} lists {entry.get('size')} bytes, {entry.get('sha256')}", entry, actual)
    return None


def manifest_file_link(chain: Chain):
    from adapters.manifest import MANIFEST_FILE, MANIFEST_SCHEMA

    link = "adapter_manifest.file"
    path = chain.folder / MANIFEST_FILE
    recorded = chain.origin["manifest_sha256"]  # the manifest's sha256 recorded when the adapter was published
    if not path.exists() and not path.is_symlink():
        if recorded:
            return broken(link, f"{path} is missing; the adapter was published with one ({recorded})", recorded, None)
        if chain.uploaded:
            return unchecked(link, uploaded_elsewhere(chain, f"no {MANIFEST_FILE}: only its bytes are checked"))
        return ok(link, f"no {MANIFEST_FILE} (published before manifests); the receipt row and file carry the chain")
    try:
        data = path.read_bytes()
        manifest = json.loads(data)
    except (OSError, ValueError) as exc:
        return broken(link, f"{path} cannot be read: {exc}")
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        return broken(link, f"{path} is not a {MANIFEST_SCHEMA}")
    files_broken = _manifest_files(chain, manifest)
    if files_broken is not None:
        return files_broken
    if manifest.get("content_sha256") != chain.content_sha256:
        return broken(link, f"{MANIFEST_FILE} names content {manifest.get('content_sha256')}, the folder's files hash "
                      f"to {chain.content_sha256}", manifest.get("content_sha256"), chain.content_sha256)
    receipt_path = chain.folder / "train_receipt.json"
    try:
        receipt_hash = sha256_digest(receipt_path.read_bytes())
    except OSError as exc:
        return broken(link, f"{receipt_path.name}, whose bytes {MANIFEST_FILE}'s receipt_hash binds, cannot be read: "
                      f"{exc.strerror or exc}", manifest.get("receipt_hash"), None)
    if manifest.get("receipt_hash") != receipt_hash:
        return broken(link, f"{MANIFEST_FILE}'s receipt_hash is {manifest.get('receipt_hash')}, "
                      f"train_receipt.json hashes to {receipt_hash}", manifest.get("receipt_hash"), receipt_hash)
    for key, expected in _manifest_expectations(chain).items():
        if (manifest.get(key) or None) != (expected or None):
            return broken(link, f"{MANIFEST_FILE}'s {key} is {manifest.get(key)!r}, expected {expected!r}",
                          expected or None, manifest.get(key))
    if recorded and sha256_digest(data) != recorded:
        return broken(link, f"{MANIFEST_FILE} hashes to {sha256_digest(data)}, not the one recorded at publication",
                      recorded, sha256_digest(data))
    origin = f" (carried from {manifest.get('adapter_name')!r})" if chain.uploaded else ""
    return ok(link, f"{MANIFEST_FILE}{origin} binds these files to train_receipt.json ({receipt_hash})",
              receipt_hash, receipt_hash)
