"""The held-out `post_eval` admission check (spec §1.4): does an eval suite overlap the training data?
Pure module: standard library and `core.canonical` only (no Django, no torch, no ninja).

    overlaps = find_overlaps(training_rows, suite_examples, limit=20)   # [] when held out
    exact, normalized = row_identities(row)                            # a row's two identities

Training rows are the rows as they were read (AgenticGroup dicts with their extra fields: the row
identity is over the whole stored row, and `group_id`/`session_id`/`metadata` are not kept by the
GRPO corpus checker, so pass the raw rows, not `AdmittedCorpus.groups`). Suite examples are
`{id, messages, target?, metadata?}`; `metadata.kiln_dataset_provenance` may name the source row
(`exact_identity`, `normalized_identity`, `group_id`, `session_id`; also read: `group_ids` and
`session_ids` lists, `content_sha256`/`normalized_sha256`, and all of these inside a nested `row`).

A training row and a suite example overlap, with the first kind that applies (OVERLAP_KINDS order):
- `exact_prompt` / `normalized_prompt`: a prompt of the row equals a prompt of the example, exactly or
  after `normalize_value`. A side's prompts are its messages, and the same with the system
  message(s) removed, with trailing tool-result messages removed, and with both; a training row
  whose messages end with assistant turns (an SFT-style row) also has those turns removed. A message
  is compared by role, text content (text parts joined) and its tool calls' names and arguments
  (ids, names and tool_call_id are not content). Empty prompts never match.
- `exact_source_row` / `normalized_source_row`: the row's identity (`row_identities`) equals the
  identity the example's provenance names.
- `exact_target` / `normalized_target`: a target of the row (a string `target` or `reference` at its
  root or in `metadata`/`extra`, or the content of trailing assistant messages) equals the example's
  target, when that target has at least `min_target_chars` characters after normalization (16 by
  default): short answers such as "4", "B" or "yes" are shared by unrelated questions, so a match on
  them alone says nothing; such examples are still caught by their prompt. Completion texts of a
  GRPO group are samples (right and wrong), not targets, and are not compared.
- `group_id` / `session_id`: a non-empty id declared by the row (its root or its `metadata`,
  `provenance` or `extra` object, `declared_ids`) equals one in the example's provenance.

Identities (the dataset split's definitions, spec §1.4): exact = `sha256:` over RFC 8785 canonical
JSON (keys sorted recursively); normalized = the same after every string value is lower-cased and
its whitespace runs collapsed to one space, ends trimmed (keys unchanged).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.canonical import json_digest
from evaluations.datasets.split import (
    declared_ids,
    exact_identity,
    id_value,
    normalize_value,
    normalized_identity,
)

PROVENANCE_KEY = "kiln_dataset_provenance"
TARGET_KEYS = ("target", "reference")
TARGET_CONTAINERS = ("metadata", "extra")
MIN_TARGET_CHARS = 16
OVERLAP_KINDS = ("exact_prompt", "normalized_prompt", "exact_source_row", "normalized_source_row",
                 "exact_target", "normalized_target", "group_id", "session_id")
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Overlap:
    row_index: int  # 0-based index into the training rows
    example_id: str
    kind: str  # one of OVERLAP_KINDS
    detail: str  # for a person

    @property
    def field(self) -> str:
        """The row as a corpus path, like the corpus checker's errors (`groups[3]`)."""
        return f"groups[{self.row_index}]"

    def to_dict(self) -> dict:
        return {"row_index": self.row_index, "field": self.field, "example_id": self.example_id,
                "kind": self.kind, "detail": self.detail}


# -- identities ---------------------------------------------------------------------------------

def normalize_text(text: str) -> str:
    return _WHITESPACE.sub(" ", text.lower()).strip()


def row_identities(row) -> tuple[str, str]:
    """(exact, normalized) identity of one stored row: the dataset split's definition."""
    return exact_identity(row), normalized_identity(row)


# -- prompts and targets ------------------------------------------------------------------------

def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tool_calls(calls) -> list:
    out = []
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else call
            out.append({"name": function.get("name"), "arguments": function.get("arguments")})
    return out


def _message_key(message) -> dict:
    if not isinstance(message, dict):
        return {"role": None, "content": _text(message)}
    key = {"role": message.get("role"), "content": _text(message.get("content"))}
    calls = _tool_calls(message.get("tool_calls"))
    if calls:
        key["tool_calls"] = calls
    return key


def _strip_trailing(messages: list[dict], role: str) -> list[dict]:
    end = len(messages)
    while end and messages[end - 1]["role"] == role:
        end -= 1
    return messages[:end]


def prompt_variants(messages, *, drop_trailing_assistant: bool = False) -> list[tuple[str, list[dict]]]:
    """(label, messages) for the prompt as given and its conservative variants; distinct, non-empty."""
    keys = [_message_key(m) for m in messages] if isinstance(messages, list) else []
    bases = [([], keys)]
    if drop_trailing_assistant and keys and keys[-1]["role"] == "assistant":
        bases.append((["without the final assistant turns"], _strip_trailing(keys, "assistant")))
    variants: list[tuple[str, list[dict]]] = []
    for removed, base in bases:
        no_system = [m for m in base if m["role"] != "system"]
        for more, value in (([], base), (["without the system message"], no_system),
                            (["without trailing tool results"], _strip_trailing(base, "tool")),
                            (["without the system message", "without trailing tool results"],
                             _strip_trailing(no_system, "tool"))):
            if value and all(value != v for _, v in variants):
                variants.append((", ".join(removed + more) or "as given", value))
    return variants


def row_targets(row) -> list[str]:
    """A training row's targets: string `target`/`reference` fields and trailing assistant contents."""
    targets: list[str] = []
    if not isinstance(row, dict):
        return targets
    for holder in (row, *(row.get(c) for c in TARGET_CONTAINERS)):
        if isinstance(holder, dict):
            for key in TARGET_KEYS:
                if isinstance(holder.get(key), str):
                    targets.append(holder[key])
    messages = row.get("messages") if isinstance(row.get("messages"), list) else []
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            break
        targets.append(_text(message.get("content")))
    return [t for t in dict.fromkeys(targets) if t.strip()]


def _provenance(example: dict) -> dict:
    metadata = example.get("metadata")
    value = metadata.get(PROVENANCE_KEY) if isinstance(metadata, dict) else None
    return value if isinstance(value, dict) else {}


def _provenance_values(provenance: dict, keys: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for holder in (provenance, provenance.get("row")):
        if not isinstance(holder, dict):
            continue
        for key in keys:
            value = holder.get(key)
            for item in value if isinstance(value, list) else [value]:
                item = id_value(item)
                if item is not None and item not in found:
                    found.append(item)
    return found


# -- the check ----------------------------------------------------------------------------------

class _Index:
    """Every suite example's keys, by kind: key -> [(example id, how)]."""

    def __init__(self, suite_examples, min_target_chars: int):
        self.by_kind: dict[str, dict[str, list[tuple[str, str]]]] = {kind: {} for kind in OVERLAP_KINDS}
        for position, example in enumerate(suite_examples):
            if not isinstance(example, dict):
                raise TypeError(f"suite example {position} is not an object")
            example_id = str(example.get("id", f"#{position}"))
            for label, prompt in prompt_variants(example.get("messages")):
                self._add("exact_prompt", json_digest(prompt), example_id, label)
                self._add("normalized_prompt", json_digest(normalize_value(prompt)), example_id, label)
            target = example.get("target")
            if isinstance(target, str) and len(normalize_text(target)) >= min_target_chars:
                self._add("exact_target", target.strip(), example_id, "")
                self._add("normalized_target", normalize_text(target), example_id, "")
            provenance = _provenance(example)
            for kind, names in (("exact_source_row", ("exact_identity", "content_sha256")),
                                ("normalized_source_row", ("normalized_identity", "normalized_sha256"))):
                for value in _provenance_values(provenance, names):
                    self._add(kind, value, example_id, "")
            for kind in ("group_id", "session_id"):
                for value in _provenance_values(provenance, (kind, kind + "s")):
                    self._add(kind, value, example_id, value)

    def _add(self, kind: str, key: str, example_id: str, how: str) -> None:
        self.by_kind[kind].setdefault(key, []).append((example_id, how))


def _row_keys(row) -> dict[str, list[tuple[str, str]]]:
    """kind -> [(key, how)] for one training row."""
    keys: dict[str, list[tuple[str, str]]] = {kind: [] for kind in OVERLAP_KINDS}
    for label, prompt in prompt_variants(row.get("messages"), drop_trailing_assistant=True):
        keys["exact_prompt"].append((json_digest(prompt), label))
        keys["normalized_prompt"].append((json_digest(normalize_value(prompt)), label))
    exact, normalized = row_identities(row)
    keys["exact_source_row"].append((exact, ""))
    keys["normalized_source_row"].append((normalized, ""))
    for target in row_targets(row):
        keys["exact_target"].append((target.strip(), ""))
        keys["normalized_target"].append((normalize_text(target), ""))
    for kind in ("group_id", "session_id"):
        keys[kind] = [(value, value) for value in declared_ids(row, kind)]
    return keys


def _detail(kind: str, row_how: str, example_how: str) -> str:
    if kind.endswith("_prompt"):
        exactness = "exactly" if kind == "exact_prompt" else "after case/whitespace normalization"
        return f"the training prompt ({row_how}) equals the example prompt ({example_how}) {exactness}"
    if kind.endswith("_source_row"):
        which = "exact" if kind == "exact_source_row" else "normalized"
        return f"the example was made from this training row (same {which} row identity)"
    if kind.endswith("_target"):
        which = "exactly" if kind == "exact_target" else "after case/whitespace normalization"
        return f"the training target equals the example target {which}"
    return f"both declare {kind} {row_how!r}"


def find_overlaps(training_rows, suite_examples, limit: int | None = 20, *,
                  min_target_chars: int = MIN_TARGET_CHARS) -> list[Overlap]:
    """Every (training row, suite example) pair that overlaps, once each with its first kind, in row
    order; at most `limit` of them (None: all). An empty list means the suite is held out."""
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1 (or None)")
    index = _Index(suite_examples, min_target_chars)
    overlaps: list[Overlap] = []
    for row_index, row in enumerate(training_rows):
        if not isinstance(row, dict):
            raise TypeError(f"training row {row_index} is not an object")
        seen: set[str] = set()
        keys = _row_keys(row)
        for kind in OVERLAP_KINDS:
            for key, row_how in keys[kind]:
                for example_id, example_how in index.by_kind[kind].get(key, ()):
                    if example_id in seen:
                        continue
                    seen.add(example_id)
                    overlaps.append(Overlap(row_index, example_id, kind, _detail(kind, row_how, example_how)))
                    if limit is not None and len(overlaps) >= limit:
                        return overlaps
    return overlaps
