"""The scorer output contract: stdout is one finite number, or one JSON object with `reward`, `score` or
`value` (a finite number), at most 2**53 in size as training requires. Anything else raises
ScorerError with a stable code.

Pure: the standard library and the kernel's reward bound (`core.contracts.groups`).
"""

from __future__ import annotations

import json
import math
import re

from core.contracts.groups import REWARD_RANGE, reward_in_range

from .types import (
    SCORER_OUTPUT_AMBIGUOUS,
    SCORER_OUTPUT_EMPTY,
    SCORER_OUTPUT_INVALID,
    SCORER_OUTPUT_NOT_FINITE,
    ScorerError,
)

REWARD_KEYS = ("reward", "score", "value")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_HINT = "a scorer prints one finite number or a JSON object with \"reward\", \"score\" or \"value\" " \
        "(print diagnostics to stderr)"


def _preview(text: str, limit: int = 120) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: float, shown: str) -> float:
    try:
        reward = float(value)
    except OverflowError:              # an integer too large for a float
        reward = math.inf
    if not math.isfinite(reward):
        raise ScorerError(SCORER_OUTPUT_NOT_FINITE, f"scorer printed a non-finite reward {shown}; {_HINT}")
    if not reward_in_range(reward):  # training would refuse the published corpus
        raise ScorerError(SCORER_OUTPUT_INVALID, f"scorer printed the reward {shown}, out of range: a reward "
                          f"must be {REWARD_RANGE} (training refuses larger ones)")
    return reward


def _from_object(obj: dict) -> float:
    present = [key for key in REWARD_KEYS if key in obj]
    if not present:
        raise ScorerError(SCORER_OUTPUT_INVALID,
                          f"scorer printed a JSON object without \"reward\", \"score\" or \"value\" "
                          f"(keys: {sorted(obj)[:10]}); {_HINT}")
    if len(present) > 1:
        raise ScorerError(SCORER_OUTPUT_AMBIGUOUS,
                          f"scorer printed a JSON object with several reward keys {present}; use exactly one")
    key = present[0]
    value = obj[key]
    if not _is_number(value):
        raise ScorerError(SCORER_OUTPUT_INVALID,
                          f"scorer's \"{key}\" is {type(value).__name__} {_preview(json.dumps(value))}, "
                          f"not a number; {_HINT}")
    return _finite(value, f"\"{key}\": {value!r}")


def _json_values(text: str) -> list[object] | None:
    """Whitespace-separated JSON values, or None when the text is not such a sequence."""
    decoder = json.JSONDecoder()
    values, index = [], 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index == len(text):
            return values
        try:
            value, index = decoder.raw_decode(text, index)
        except (ValueError, RecursionError):  # RecursionError: nested thousands of levels deep
            return None
        values.append(value)


def parse_reward(stdout: bytes) -> float:
    """The reward in a scorer's stdout, or ScorerError (empty, invalid, ambiguous, not finite)."""
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise ScorerError(SCORER_OUTPUT_INVALID, f"scorer output is not UTF-8 text; {_HINT}") from None
    text = text.strip()
    if not text:
        raise ScorerError(SCORER_OUTPUT_EMPTY, f"scorer printed nothing on stdout; {_HINT}")
    tokens = text.split()
    if len(tokens) == 1 and (_NUMBER.fullmatch(text) or _NON_FINITE.fullmatch(text)):
        return _finite(float(text), repr(text))        # 1, -0.5, 1e-3, 1., +1, nan, inf, Infinity
    values = _json_values(text)
    if values is None:
        if len(tokens) > 1 and all(_NUMBER.fullmatch(t) or _NON_FINITE.fullmatch(t) for t in tokens):
            raise ScorerError(SCORER_OUTPUT_AMBIGUOUS,
                              f"scorer printed {len(tokens)} numbers {_preview(text)}; print exactly one")
        raise ScorerError(SCORER_OUTPUT_INVALID, f"scorer output {_preview(text)} is not a reward; {_HINT}")
    if len(values) > 1:
        if all(_is_number(v) or isinstance(v, dict) for v in values):
            raise ScorerError(SCORER_OUTPUT_AMBIGUOUS,
                              f"scorer printed {len(values)} values {_preview(text)}; print exactly one")
        raise ScorerError(SCORER_OUTPUT_INVALID, f"scorer output {_preview(text)} is not a reward; {_HINT}")
    value = values[0]
    if isinstance(value, dict):
        return _from_object(value)
    if _is_number(value):
        return _finite(value, _preview(text))
    raise ScorerError(SCORER_OUTPUT_INVALID,
                      f"scorer printed a JSON {type(value).__name__} {_preview(text)}, not a reward; {_HINT}")
