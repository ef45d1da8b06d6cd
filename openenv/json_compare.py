"""Exact comparison of JSON values, and where two differ. Pure (standard library only).

Exact means type-exact: `1` and `1.0`, `true` and `1`, and objects with their keys in another order
are different values (an artifact's bytes and hashes would differ too). Used by offline verification
and by the collector's check that a group's candidates started alike.
"""

from __future__ import annotations


def json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and type(a) is type(b) and a == b
    return type(a) is type(b) and a == b


def first_difference(found, expected, path: str) -> str:
    """The JSON path (from `path`) of the first place two values differ."""
    if isinstance(found, dict) and isinstance(expected, dict):
        # in the expected order: a key gone, or a value changed; then a key added (QA: with the key lists
        # differing the path stopped at the parent, and the report showed two identical prefixes)
        for key in expected:
            if key not in found:
                return f"{path}.{key}"
            if not json_equal(found[key], expected[key]):
                return first_difference(found[key], expected[key], f"{path}.{key}")
        for key in found:
            if key not in expected:
                return f"{path}.{key}"
    if isinstance(found, list) and isinstance(expected, list) and len(found) == len(expected):
        for index, (a, b) in enumerate(zip(found, expected, strict=True)):
            if not json_equal(a, b):
                return first_difference(a, b, f"{path}[{index}]")
    return path
