"""File content digests shared by the GPU side and the web side. Pure: standard library and
`core.canonical` only (no Django, no torch).

An adapter's content digest (`Adapter.content_sha256`, the receipt's
`adapters.output.adapter_model_sha256`) is the RFC 8785 digest of the file manifest
`[{file, size, sha256}]` (sorted by name) of its behaviour-defining files: `adapter_config.json`
and its weights. `gpu_runtime.identity` re-exports these; the chain verifier
(`adapters.verify`) recomputes them without importing gpu_runtime.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from core.canonical import json_digest

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def file_manifest(root: Path, files: Iterable[str]) -> list[dict]:
    """[{file, size, sha256}] for the named files under `root`, sorted by name."""
    entries = []
    for name in sorted(set(files)):
        path = Path(root) / name
        entries.append({"file": name, "size": path.stat().st_size, "sha256": file_sha256(path)})
    return entries


def manifest_digest(manifest: list[dict]) -> str:
    return json_digest(manifest)


def adapter_files(adapter_dir: Path) -> list[str]:
    """The files that define an adapter's behaviour: its config and weights, nothing else.

    Receipts and manifests that registries keep next to the weights are left out on purpose:
    rewriting a receipt does not change what the adapter samples.
    """
    return [name for name in ADAPTER_FILES if (Path(adapter_dir) / name).is_file()]


def adapter_content_sha256(adapter_dir: Path) -> str:
    """The adapter's content digest: the manifest digest of `adapter_files(adapter_dir)`."""
    return manifest_digest(file_manifest(Path(adapter_dir), adapter_files(Path(adapter_dir))))
