"""Server-side paths a request names, confined to configured roots. Pure module (os only).

The server runs with more rights than the person who sends a request, so a path in a request
(`dataset_path`) is read only when it resolves, links followed, to a regular file inside one of
the roots (by default KILN_HOME's data folders, `rollouts/` and `datasets/`, and the folder
`kiln serve` was started in; more through `[training] dataset_roots` or KILN_DATASET_ROOTS). The
rest of KILN_HOME (the database, the secret key, tokens) is private: refused even when another
root contains it. Every refusal is the same message, which says nothing about the file (whether
it exists, is a folder, is unreadable or lies elsewhere), only which roots are allowed and the
setting that adds one.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_PATH_CHARS = 4096
ROOTS_SETTING = "[training] dataset_roots in kiln.toml (or KILN_DATASET_ROOTS, separated by ':')"


class PathRefused(ValueError):
    def __init__(self, field: str, roots: tuple[Path, ...]):
        self.field = field
        self.message = (f"{field}: not a readable file under the allowed roots "
                        f"({', '.join(str(r) for r in roots) or 'none configured'}): it is missing, not a "
                        "regular readable file, or outside them")
        self.hint = ("check that the path names an existing, readable file (realpath FILE); if it lies outside "
                     f"the roots, put it under one of them, or add its folder to {ROOTS_SETTING} and restart")
        super().__init__(self.message)


def confined_file(value, roots: tuple[Path, ...], *, private: Path | None = None,
                  field: str = "dataset_path") -> Path:
    """The resolved path of `value` if it is a regular, readable file inside a root (and, inside
    `private`, only inside a root that lies in it); else PathRefused."""
    if (not isinstance(value, str) or not value or len(value) > MAX_PATH_CHARS or "\x00" in value
            or not os.path.isabs(value)):
        raise PathRefused(field, roots)
    try:
        resolved = Path(os.path.realpath(value))
        real_roots = [Path(os.path.realpath(root)) for root in roots]
        holders = [root for root in real_roots if _within(resolved, root)]
        if private is not None and _within(resolved, Path(os.path.realpath(private))):
            # Only a root strictly inside it (rollouts/, datasets/): a root that is KILN_HOME itself (serve
            # started in KILN_HOME, or KILN_DATASET_ROOTS naming it) must not open the secret key or database.
            real_private = Path(os.path.realpath(private))
            holders = [root for root in holders if _within(root, real_private) and root != real_private]
        inside = bool(holders)
        if not inside or not resolved.is_file() or not os.access(resolved, os.R_OK):
            raise PathRefused(field, roots)
    except OSError:  # a name too long, a loop of links, a component that is no folder
        raise PathRefused(field, roots) from None
    return resolved


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents
