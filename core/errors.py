"""Kiln's error type: a stable code, a message and a hint, with the HTTP status the API answers.

Pure module. Services raise KilnError; the API turns it into {"error": {"code", "message", "hint"}}
and the CLI prints it on one line.
"""

from __future__ import annotations


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
        return {"error": {"code": self.code, "message": self.message, "hint": self.hint}}


def error_envelope(code: str, message: str, hint: str = "") -> dict:
    return {"error": {"code": code, "message": message, "hint": hint}}


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


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or what caused it, is the disk or quota being full (ENOSPC, EDQUOT). Libraries
    that write files (safetensors, torch.save) may keep only the OSError's text, so that counts too."""
    import errno

    def full(e: BaseException) -> bool:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        return "No space left on device" in str(e) or "Disk quota exceeded" in str(e)

    return caused_by(exc, full)
