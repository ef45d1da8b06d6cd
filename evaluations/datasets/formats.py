"""Dataset rows from an uploaded JSONL file, per format. Pure module: no Django, no torch.

Formats:
- `grpo_groups`: one AgenticGroup per line, checked by the GRPO corpus contract
  (`core.contracts.groups`, the checker training admission uses); extra fields (`group_id`,
  `metadata`, a `reference` answer, ...) are kept in the stored row;
- `sft_chat`: `{"messages": [{role, content}, ...]}` with at least one assistant message;
- `raw`: any JSON object per line.
Blank lines are skipped; every error names the file's 1-based line. Rows are stored as compact
JSON lines (`row_bytes`), so row N of a dataset is line N of its data.jsonl.
"""

from __future__ import annotations

import json

import rfc8785

from core.canonical import canonical_json
from core.contracts.groups import (
    MAX_GROUPS,
    MESSAGE_ROLES,
    GroupError,
    JsonTextError,
    admit_groups,
    load_json,
)

FORMATS = ("grpo_groups", "sft_chat", "raw")
MAX_ROWS = MAX_GROUPS


class FormatError(ValueError):
    def __init__(self, line: int | None, message: str):
        where = f"file line {line}" if line is not None else "file"
        super().__init__(f"{where}: {message}")
        self.line = line
        self.message = f"{where}: {message}"


def _loads(line: bytes, number: int):
    try:
        return load_json(line)
    except JsonTextError as exc:
        raise FormatError(number, f"is {exc}") from None


def _check_canonical(value, number: int) -> None:
    try:
        canonical_json(value)
    except rfc8785.CanonicalizationError as exc:
        raise FormatError(number, f"cannot be canonicalized ({exc})") from None
    except RecursionError:
        raise FormatError(number, "is nested too deeply") from None
    except UnicodeEncodeError:
        raise FormatError(number, "holds a lone surrogate; send valid Unicode text") from None


def _check_sft(row: dict, number: int) -> None:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FormatError(number, "messages: must be a non-empty list of chat messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise FormatError(number, f"messages[{i}]: must be an object with role and content")
        if message.get("role") not in MESSAGE_ROLES:
            raise FormatError(number, f"messages[{i}].role: must be one of {', '.join(MESSAGE_ROLES)}")
        if not isinstance(message.get("content"), str):
            raise FormatError(number, f"messages[{i}].content: must be a string")
    if not any(m["role"] == "assistant" for m in messages):
        raise FormatError(number, "messages: an sft_chat row needs at least one assistant message")


def parse_rows(data: bytes, fmt: str) -> tuple[list[dict], list[int]]:
    """The rows of an uploaded JSONL file and each one's line number in that file."""
    if fmt not in FORMATS:
        raise FormatError(None, f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    rows, lines = [], []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        value = _loads(line, number)
        if not isinstance(value, dict):
            raise FormatError(number, "must be a JSON object")
        _check_canonical(value, number)
        if fmt == "sft_chat":
            _check_sft(value, number)
        rows.append(value)
        lines.append(number)
        if len(rows) > MAX_ROWS:
            raise FormatError(number, f"a dataset holds at most {MAX_ROWS} rows")
    if not rows:
        raise FormatError(None, "holds no rows")
    if fmt == "grpo_groups":
        check_groups(rows, lines)
    return rows, lines


def check_groups(rows: list[dict], lines: list[int]) -> None:
    """Every row is an AgenticGroup the trainer accepts (the training admission's checker)."""
    try:
        admit_groups(rows)
    except GroupError as exc:
        if exc.field.startswith("groups["):
            index = int(exc.field[len("groups["):].split("]", 1)[0])
            rest = exc.field.split("]", 1)[1].lstrip(".")
            raise FormatError(lines[index], f"{rest or 'group'}: {exc.message}") from None
        raise FormatError(None, exc.message) from None


def row_bytes(rows: list[dict]) -> bytes:
    """Rows as compact JSON lines (the bytes of data.jsonl and of each partition file)."""
    return b"".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for r in rows)


def read_rows(data: bytes) -> list[dict]:
    """Rows back from a stored data.jsonl or partition file (already checked when stored)."""
    return [json.loads(line) for line in data.splitlines() if line.strip()]
