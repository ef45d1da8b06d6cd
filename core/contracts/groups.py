"""GRPO groups (spec §2.1): parse, validate and canonicalise, from inline JSON or JSONL. Pure module.

The one checker of a group's shape: admission runs it before anything is queued, and the trainer
runs it again for callers that reach it directly. Errors name the field as a JSON path with
0-based indexes (`groups[0].completions[1].reward`, as every Kiln error does); a JSONL source
adds the line (`(line 3)`). Blank JSONL lines are skipped without consuming an index.

Also the kernel's two shared checks for what users hand in: `load_json` (JSON text refused cleanly,
never a RecursionError) and `reward_in_range` (the reward bound every scorer output must meet).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from core.canonical import sha256_digest

MAX_GROUPS = 100_000
MAX_COMPLETIONS_PER_GROUP = 1024
MAX_CORPUS_BYTES = 512 * 1024 * 1024
MAX_EXACT_INT = 2**53  # beyond this a JSON integer has no exact float (10**400 has none at all)
# The largest reward in size, float or integer: group statistics square rewards and sum a group of
# up to 1024 of them in float64, which overflows (OverflowError in the trainer) from about 1e154.
MAX_REWARD_MAGNITUDE = float(MAX_EXACT_INT)
REWARD_RANGE = "finite and at most 2**53 (about 9.0e15) in size"  # what reward_in_range accepts, in words
SEGMENT_KINDS = ("context", "action", "observation")
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
FINISH_REASONS = ("stop", "length")  # as in chat.completion choices


GROUP_INDEX = re.compile(r"^groups\[(\d+)\]")


class JsonTextError(ValueError):
    """Why some text is not one acceptable JSON value. The message is a phrase without a subject
    ("not valid JSON (...)", "nested too deeply") that callers prefix with their own place, and it
    never quotes the content."""


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def load_json(data: bytes | str, *, allow_nan: bool = False):
    """One JSON value, or JsonTextError: the one loader for JSON that users hand in (files, uploads,
    tasks). Python's json raises RecursionError past ~1000 levels of nesting and a bare ValueError
    for integers over 4300 digits; both become clean refusals here. NaN and Infinity are refused
    unless `allow_nan` (callers whose own field checks name the offending field)."""
    try:
        return json.loads(data) if allow_nan else json.loads(data, parse_constant=_reject_constant)
    except UnicodeDecodeError:  # its message would quote the byte
        raise JsonTextError("not valid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise JsonTextError("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError names a position, never the content; also the digit limit
        raise JsonTextError(f"not valid JSON ({exc})") from None


class GroupError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class AdmittedCorpus:
    groups: list[dict]
    jsonl: bytes  # canonical compact JSON lines: exactly the snapshot's bytes
    sha256: str  # spec §2.7 digest over those bytes
    rollouts: int
    with_provenance: int


def reward_in_range(reward: int | float) -> bool:
    """Whether training takes this reward; producers of rewards (scorers) check it too."""
    # abs() first: math.isfinite(10**400) raises, while its size compares fine
    return abs(reward) <= MAX_REWARD_MAGNITUDE and math.isfinite(reward)


def _text(value: str, field: str) -> str:
    """Refuse a string that is not valid Unicode text (a lone surrogate such as "\\ud800" cannot be
    encoded, tokenized or hashed)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise GroupError(field, "holds a lone surrogate; send valid Unicode text") from None
    return value


def _message(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise GroupError(where, "must be an object with role and content")
    role = value.get("role")
    if role not in MESSAGE_ROLES:
        raise GroupError(f"{where}.role", f"must be one of {', '.join(MESSAGE_ROLES)}")
    content = value.get("content")
    if isinstance(content, list):  # content parts are flattened to their text
        if not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            raise GroupError(f"{where}.content", "parts must each carry a text string")
        content = "".join(p["text"] for p in content)
    if content is not None and not isinstance(content, str):
        raise GroupError(f"{where}.content", "must be a string, null or a list of text parts")
    if content is not None:
        _text(content, f"{where}.content")
    message = {"role": role, "content": content}
    for optional in ("name", "tool_call_id", "tool_calls", "reasoning_content"):
        if optional in value:
            message[optional] = value[optional]
    return message


def _segment(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise GroupError(where, "must be an object")
    if value.get("kind") not in SEGMENT_KINDS:
        raise GroupError(f"{where}.kind", f"must be one of {', '.join(SEGMENT_KINDS)}")
    if not isinstance(value.get("content"), str):
        raise GroupError(f"{where}.content", "must be a string")
    _text(value["content"], f"{where}.content")
    if not isinstance(value.get("role"), str):
        raise GroupError(f"{where}.role", "must be a string")
    warning = value.get("warning_prefix_len")
    if warning is not None and (isinstance(warning, bool) or not isinstance(warning, int) or warning < 0):
        raise GroupError(f"{where}.warning_prefix_len", "must be a non-negative integer")
    return value


def _completion(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise GroupError(where, "must be an object with text and reward")
    if not isinstance(value.get("text"), str):
        raise GroupError(f"{where}.text", "is required and must be a string")
    _text(value["text"], f"{where}.text")
    reward = value.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise GroupError(f"{where}.reward", "is required and must be a number")
    if not reward_in_range(reward):
        raise GroupError(f"{where}.reward", f"must be {REWARD_RANGE}")
    completion = {"text": value["text"], "reward": reward}
    if "trajectory" in value:
        if not isinstance(value["trajectory"], list):
            raise GroupError(f"{where}.trajectory", "must be a list of segments")
        completion["trajectory"] = [_segment(s, f"{where}.trajectory[{i}]") for i, s in enumerate(value["trajectory"])]
    if "finish_reason" in value:  # "length": the sampler stopped it at max_tokens, so no end token is trained
        if value["finish_reason"] not in FINISH_REASONS:
            raise GroupError(f"{where}.finish_reason", f"must be one of {', '.join(FINISH_REASONS)}")
        completion["finish_reason"] = value["finish_reason"]
    for optional in ("provenance", "openenv"):
        if optional in value:
            if not isinstance(value[optional], dict):
                raise GroupError(f"{where}.{optional}", "must be an object")
            completion[optional] = value[optional]
    return completion


def parse_group(value, index: int) -> dict:
    where = f"groups[{index}]"
    if not isinstance(value, dict):
        raise GroupError(where, "must be an object with messages and completions")
    messages = value.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GroupError(f"{where}.messages", "must be a non-empty list of chat messages")
    has_completions, has_rollouts = "completions" in value, "rollouts" in value
    if has_completions == has_rollouts:
        raise GroupError(f"{where}.completions", "give exactly one of completions or rollouts")
    completions = value["completions" if has_completions else "rollouts"]
    if not isinstance(completions, list) or not completions:
        raise GroupError(f"{where}.completions", "must be a non-empty list")
    if len(completions) > MAX_COMPLETIONS_PER_GROUP:
        raise GroupError(f"{where}.completions", f"at most {MAX_COMPLETIONS_PER_GROUP} per group")
    parsed = [_completion(c, f"{where}.completions[{i}]") for i, c in enumerate(completions)]
    kinds = {"openenv" in c for c in parsed}
    if len(kinds) > 1:
        raise GroupError(f"{where}.completions", "mix OpenEnv and ordinary rollouts")
    return {"messages": [_message(m, f"{where}.messages[{i}]") for i, m in enumerate(messages)],
            "completions": parsed}


def admit_groups(groups: list) -> AdmittedCorpus:
    if not isinstance(groups, list) or not groups:
        raise GroupError("groups", "must be a non-empty list")
    if len(groups) > MAX_GROUPS:
        raise GroupError("groups", f"at most {MAX_GROUPS} groups per request")
    parsed = [parse_group(g, i) for i, g in enumerate(groups)]
    if len({any("openenv" in c for c in g["completions"]) for g in parsed}) > 1:
        raise GroupError("groups", "a corpus is all-OpenEnv or all-ordinary")
    lines = b"".join(json.dumps(g, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for g in parsed)
    rollouts = sum(len(g["completions"]) for g in parsed)
    with_provenance = sum(1 for g in parsed for c in g["completions"] if "provenance" in c)
    return AdmittedCorpus(parsed, lines, sha256_digest(lines), rollouts, with_provenance)


def check_corpus_size(size: int, field: str = "dataset_path") -> None:
    """The one bound on a corpus's bytes, checked before a file or an upload is read."""
    if size > MAX_CORPUS_BYTES:
        raise GroupError(field, f"the file is larger than {MAX_CORPUS_BYTES} bytes")


def parse_jsonl(data: bytes, field: str = "dataset_path", *, require_groups: bool = True) -> tuple[list, list[int]]:
    """The JSON value of every non-blank line, and each one's line number (bounded in size)."""
    check_corpus_size(len(data), field)
    groups, lines = [], []
    for line_number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:  # NaN passes here so that the reward check names the field
            groups.append(load_json(line, allow_nan=True))
        except JsonTextError as exc:
            raise GroupError(f"line {line_number}", f"is {exc}") from None
        lines.append(line_number)
    if not groups and require_groups:
        raise GroupError(field, "the file holds no groups")
    return groups, lines


def admit_jsonl(data: bytes) -> AdmittedCorpus:
    """Validate a whole JSONL corpus (bounded) before anything is queued."""
    groups, lines = parse_jsonl(data)
    try:
        return admit_groups(groups)
    except GroupError as exc:
        index = GROUP_INDEX.match(exc.field)
        if index is None:
            raise
        raise GroupError(f"{exc.field} (line {lines[int(index.group(1))]})", exc.message) from None
