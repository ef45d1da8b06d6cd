"""Kiln's error type: a stable code, a message and a hint, with the HTTP status the API answers.

Pure module. Services raise KilnError; the API turns it into {"error": {"code", "message", "hint"}}
and the CLI prints it on one line.
"""

from __future__ import annotations

# A message quotes what the client sent (a name, a value): bounded, as a client may send megabytes
# and the answer would repeat them all. Long enough for every message Kiln writes itself.
MAX_MESSAGE_CHARS = 2000


def clip(text: str, limit: int = 80) -> str:
    """A client's text (a name, a key) as a message quotes it: the request may carry megabytes there."""
    return text if len(text) <= limit else text[:limit] + "…"


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


class KilnError(Exception):
    def __init__(
        self,
        code: str,
        message: str,
        *,
        hint: str = "",
        status: int = 400,
        headers: dict[str, str] | None = None,
        field: str | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint
        self.status = status
        self.headers = headers or {}
        self.field = field

    def envelope(self) -> dict:
        return error_envelope(self.code, self.message, self.hint)


def error_envelope(code: str, message: str, hint: str = "") -> dict:
    return {"error": {"code": code, "message": bounded(message), "hint": bounded(hint)}}


DISK_FULL_CODE = "adapter_disk_quota_exceeded"  # 507: the spec's code for a write the disk has no room for
DISK_FULL_HINT = ("free space on the server's disk under KILN_HOME (delete old adapters and their checkpoints: "
                  "kiln adapters delete NAME), then retry")


def caused_by(exc: BaseException | None, matches) -> bool:
    """Whether `exc` or any exception in its cause/context chain satisfies `matches(e)`: libraries
    wrap the OSError or the Redis error that says what really happened in their own types."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if matches(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# What a full disk says when the errno is gone: the OS's own text (kept by safetensors), SQLite's
# SQLITE_FULL, and torch.save's short writes (its zip writer reports only the position it reached).
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "database or disk is full")
TORCH_SHORT_WRITE_TEXTS = ("unexpected pos", "PytorchStreamWriter failed writing file", "file write failed")
# A write that failed while its filesystem has less than this free is taken as the disk being full.
LOW_SPACE_BYTES = 64 * 2**20


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or what caused it, is the disk or quota being full (ENOSPC, EDQUOT). Libraries
    that write files (safetensors, torch.save, SQLite) may keep only a text, so those count too."""
    import errno

    def full(e: BaseException) -> bool:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if isinstance(e, RuntimeError) and any(marker in text for marker in TORCH_SHORT_WRITE_TEXTS):
            return True
        return any(marker in text for marker in DISK_FULL_TEXTS)

    return caused_by(exc, full)


def low_on_space(path, min_free_bytes: int = LOW_SPACE_BYTES) -> bool:
    """Whether the filesystem holding `path` (or its nearest existing parent) has under
    `min_free_bytes` free for this user; False when that cannot be told."""
    import shutil
    from pathlib import Path

    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free < min_free_bytes
    except OSError:
        return False


def space_exhausted_error(exc: BaseException, path) -> OSError | None:
    """For `exc`, an OSError or RuntimeError raised while writing under `path`: the ENOSPC OSError to
    raise instead when the filesystem is nearly full now, for writers that report a short write
    without errno or text (torch's zip writer: "unexpected pos ..."). None when `exc` already says
    the disk is full (is_disk_full), or the disk has room. Call it before removing what the write
    left, which frees the space it took."""
    import errno

    if not isinstance(exc, OSError | RuntimeError) or is_disk_full(exc) or not low_on_space(path):
        return None
    return OSError(errno.ENOSPC, f"No space left on device under {path} ({type(exc).__name__}: {exc})")
