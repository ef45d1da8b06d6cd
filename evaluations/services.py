"""Scorer registry writes: register a scorer program under KILN_HOME/scorers/<name>/<filename>.

The file is published atomically (hidden sibling, fsync, chmod 0755, rename) inside the
transaction that creates its row, so a failed registration leaves neither a row nor a file that
looks registered. Registered scorers never change: a new version is a new name. Jobs run them
only through the sandbox (`evaluations.sandbox.run_scorer`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from core.artifacts import ensure_dir, write_file
from core.canonical import sha256_digest
from core.contracts.names import is_valid_name
from core.errors import KilnError
from evaluations.models import Scorer

FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")  # the sandbox keeps names of [A-Za-z0-9._+-] only
MAX_SCORER_BYTES = 1 << 20
MAX_DESCRIPTION_CHARS = 2000


def scorers_root() -> Path:
    return ensure_dir(settings.KILN.layout.scorers)


def _invalid(message: str, field: str, hint: str = "", code: str = "scorer_invalid") -> KilnError:
    return KilnError(code, f"{field}: {message}", hint=hint, status=400, field=field)


def validate_scorer_name(name) -> str:
    if not is_valid_name(name):
        raise _invalid(f"{name!r} is not a valid scorer name", "name",
                       "use letters, digits, '.', '_' and '-' (at most 64), e.g. math-exact")
    return name


def safe_filename(filename: str) -> str:
    """The uploaded file's base name with anything but [A-Za-z0-9._+-] replaced; never hidden or empty."""
    base = os.path.basename(str(filename or "").replace("\\", "/"))
    cleaned = FILENAME_UNSAFE.sub("_", base).lstrip(".")[:100]
    return cleaned if cleaned and cleaned not in (".", "..") else "scorer"


def _check_content(content: bytes) -> None:
    if not isinstance(content, bytes | bytearray) or not content:
        raise _invalid("the file is empty", "file")
    if len(content) > MAX_SCORER_BYTES:
        raise _invalid(f"the file is {len(content)} bytes; a scorer script may hold at most {MAX_SCORER_BYTES}",
                       "file")
    if not content.startswith(b"#!"):
        raise _invalid("a scorer must be an executable script that starts with a #! line", "file",
                       "begin the file with #!/usr/bin/env python3 (the sandbox's python3 is /usr/bin/python3)")


def scorer_register(*, name: str, filename: str, content: bytes, description: str = "", user=None) -> Scorer:
    """Store a new scorer program under a new name. A name in use answers scorer_name_taken (409)."""
    validate_scorer_name(name)
    _check_content(content)
    description = (description or "").strip()
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise _invalid(f"at most {MAX_DESCRIPTION_CHARS} characters", "description")
    if Scorer.objects.filter(name=name).exists():
        raise KilnError("scorer_name_taken", f"name: a scorer named {name!r} is already registered", status=409,
                        field="name", hint="registered scorers never change: register the new version under a "
                                           "new name, e.g. math-exact-v2")
    target = scorers_root() / name / safe_filename(filename)
    try:
        with transaction.atomic():
            scorer = Scorer.objects.create(
                name=name, filename=target.name, path=str(target), sha256=sha256_digest(bytes(content)),
                size_bytes=len(content), description=description,
                created_by=user if getattr(user, "is_authenticated", False) else None,
            )
            target.parent.mkdir(parents=True, exist_ok=True)
            write_file(target, bytes(content), mode=0o755)
    except IntegrityError:
        raise KilnError("scorer_name_taken", f"name: a scorer named {name!r} is already registered", status=409,
                        field="name") from None
    except OSError as exc:
        raise KilnError("scorer_store_failed", f"could not store the scorer under {target.parent}: {exc}",
                        status=500) from None
    return scorer
