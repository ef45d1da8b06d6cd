"""Small presentation filters for dashboard templates: percentages, short ids, pretty JSON.

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
