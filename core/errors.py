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
