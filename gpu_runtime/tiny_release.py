"""The released demo model: the files the tiny-model recipe built once, shipped with Kiln. No Django, no torch.

A recipe's floating point differs between CPUs, and 500 warm-up steps amplify it, so a model
built on one machine is not the model built on another. Kiln therefore ships the model that the
recipe (`gpu_runtime/tiny_model.py`) built once, with a release manifest: every file's size and
sha256, the recipe summary, and `model_sha256`, the digest of the file list. `kiln model
create-tiny` copies the release and verifies every byte; the recipe stays the documented way to
rebuild it (`--rebuild`, or `python -m gpu_runtime.tiny_release --write DIR` to make a release).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from core.artifacts import publish_directory
from core.canonical import json_digest
from gpu_runtime.identity import file_manifest, file_sha256

RELEASE_DIR = Path(__file__).resolve().parent / "assets" / "kiln-tiny"
RELEASE_FILE = "kiln_tiny_release.json"
RELEASE_SCHEMA = "kiln.tiny-release.v1"
RECIPE_FILE = "kiln_tiny_model.json"  # the recipe summary (gpu_runtime.tiny_model writes it)


class TinyReleaseError(Exception):
    """The shipped or installed model does not match its release manifest."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def model_files(model_dir: Path) -> list[str]:
    """Every regular file of a model folder except the release manifest itself."""
    return sorted(p.name for p in Path(model_dir).iterdir() if p.is_file() and p.name != RELEASE_FILE)


def make_manifest(model_dir: Path) -> dict:
    """The release manifest of a folder the recipe built."""
    model_dir = Path(model_dir)
    files = file_manifest(model_dir, model_files(model_dir))
    recipe = json.loads((model_dir / RECIPE_FILE).read_text())
    return {"schema": RELEASE_SCHEMA, "model_sha256": json_digest(files), "files": files, "recipe": recipe}


def read_manifest(model_dir: Path = RELEASE_DIR) -> dict:
    try:
        manifest = json.loads((Path(model_dir) / RELEASE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise TinyReleaseError("tiny_model_release_missing", f"no readable {RELEASE_FILE} in {model_dir}: {exc}") from None
    if manifest.get("schema") != RELEASE_SCHEMA:
        raise TinyReleaseError("tiny_model_release_invalid", f"{RELEASE_FILE} in {model_dir} is not {RELEASE_SCHEMA}")
    return manifest


def verify(model_dir: Path = RELEASE_DIR) -> dict:
    """Check every file of `model_dir` against its release manifest; return the manifest.

    Raises TinyReleaseError naming the first file that is missing, extra, or differs.
    """
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    listed = {entry["file"]: entry for entry in manifest["files"]}
    if json_digest(manifest["files"]) != manifest["model_sha256"]:
        raise TinyReleaseError("tiny_model_corrupt", f"{RELEASE_FILE} in {model_dir}: its file list does not match model_sha256")
    for name in sorted(set(listed) | set(model_files(model_dir))):
        path = model_dir / name
        if name not in listed:
            raise TinyReleaseError("tiny_model_corrupt", f"{path} is not part of the release")
        if path.is_symlink() or not path.is_file():
            raise TinyReleaseError("tiny_model_corrupt", f"{path} is missing")
        if path.stat().st_size != listed[name]["size"] or file_sha256(path) != listed[name]["sha256"]:
            raise TinyReleaseError("tiny_model_corrupt", f"{path} differs from the release (sha256 mismatch)")
    return manifest


def install(out_dir: Path, *, replace: bool = False, source: Path = RELEASE_DIR) -> dict:
    """Copy the release into `out_dir` (verified before and after the copy), published atomically.

    Returns the recipe summary plus `path`, `model_sha256` and `source: "release"`.
    """
    manifest = verify(source)

    def fill(staging: Path) -> None:
        for entry in manifest["files"]:
            shutil.copyfile(source / entry["file"], staging / entry["file"])
            (staging / entry["file"]).chmod(0o644)
        shutil.copyfile(source / RELEASE_FILE, staging / RELEASE_FILE)
        (staging / RELEASE_FILE).chmod(0o644)
        verify(staging)  # the copy, byte for byte, before it becomes visible

    publish_directory(Path(out_dir), fill, replace=replace)
    return summary(manifest, out_dir)


def summary(manifest: dict, path: Path) -> dict:
    return dict(manifest["recipe"], path=str(path), model_sha256=manifest["model_sha256"], source="release")


def write_release(model_dir: Path) -> dict:
    """Add the release manifest to a folder the recipe just built (for shipping it)."""
    manifest = make_manifest(model_dir)
    (Path(model_dir) / RELEASE_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


if __name__ == "__main__":
    # `python -m gpu_runtime.tiny_release --write DIR`: turn a fresh recipe build into a release.
    if len(sys.argv) != 3 or sys.argv[1] != "--write":
        sys.exit("usage: python -m gpu_runtime.tiny_release --write MODEL_DIR")
    print(write_release(Path(sys.argv[2]))["model_sha256"])
