"""Small presentation filters for dashboard templates: percentages, short ids, pretty JSON, numbers.

Presentation only: no database access and no domain decisions.
"""

from __future__ import annotations

import json

from django import template

register = template.Library()


@register.filter
def percent(fraction) -> int:
    """0.3333 -> 33: a job's progress fraction as a whole percentage, clamped to 0..100."""
    try:
        value = float(fraction)
    except (TypeError, ValueError):
        return 0
    return max(0, min(100, round(value * 100)))


@register.filter
def short_id(value) -> str:
    """The first eight characters of a uuid, enough to tell jobs apart on screen."""
    return str(value)[:8]


@register.filter
def pretty_json(value) -> str:
    """Indented, key-sorted JSON for <pre> blocks (escaped by the template as usual)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


@register.filter
def is_scalar(value) -> bool:
    """True for values shown inline (numbers, strings, booleans); dicts and lists go to <pre>."""
    return value is None or isinstance(value, str | int | float | bool)


@register.filter
def sig(value, digits: int = 4) -> str:
    """0.123456 -> 0.1235: a metric with a few significant digits; ints and text unchanged."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        return f"{value:.{int(digits)}g}"
    return str(value)


@register.filter
def unix_ms(value):
    """Unix milliseconds -> an aware UTC datetime (None stays None), for the `date` filter."""
    from datetime import UTC, datetime

    try:
        return datetime.fromtimestamp(int(value) / 1000, tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


@register.filter
def short_digest(value, length: int = 12) -> str:
    """sha256:0123456789abcdef… -> sha256:0123456789ab (enough to tell artifacts apart on screen)."""
    if not value:
        return ""
    algorithm, sep, hexdigest = str(value).partition(":")
    if not sep:
        return str(value)[:int(length)]
    return f"{algorithm}:{hexdigest[:int(length)]}"


@register.filter
def duration_ms(value) -> str:
    """1234 -> 1.23 s, 950 -> 950 ms, 75000 -> 1 min 15 s."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    if value < 1000:
        return f"{value:.0f} ms"
    seconds = value / 1000
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


@register.filter
def duration_s(value) -> str:
    """Elapsed seconds (float) -> 1 min 15 s."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return duration_ms(value * 1000)


@register.filter
def error_hint(job) -> str:
    """What to do about a failed job's error: the hint the API and CLI give with its code."""
    from core.jobs.error_hints import job_error

    error = job_error(job)
    return error["hint"] if error else ""
