"""An adapter folder's files and content digest in the web process (no torch, no gpu_runtime).

The digest is `core.content_identity`'s (the one the trainer records through gpu_runtime.identity):
RFC 8785 canonical JSON of `[{file, size, sha256}]` over the files that define the adapter.
"""

from __future__ import annotations

from pathlib import Path

from core.content_identity import ADAPTER_FILES, adapter_content_sha256, adapter_files, file_sha256

__all__ = ["ADAPTER_FILES", "adapter_files", "content_digest", "file_sha256", "folder_files"]


def content_digest(adapter_dir: Path) -> str:
    return adapter_content_sha256(Path(adapter_dir))


def folder_files(adapter_dir: Path) -> list[str]:
    """Every regular file directly in an adapter folder (an adapter folder is flat), sorted; links
    and sub-folders are left out."""
    root = Path(adapter_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_file() and not p.is_symlink())
