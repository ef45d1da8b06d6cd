"""The metric families Kiln publishes, each with its closed label values. Pure: no Django.

A family is declared once, by the module that counts it (`register`); a series is addressed by its
family and one value of each declared label (`series_key`), and any other label or value is a
programming error, refused at once. That keeps the cardinality fixed and keeps caller-chosen strings
(URLs, adapter names, run ids, tokens) out of the exposition by construction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

NAME = re.compile(r"^kiln_[a-z0-9_]+$")
LABEL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Label values are plain words: nothing Prometheus would have to escape.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
KINDS = ("counter", "gauge")

# A label's closed values: a tuple, or a callable answering one (job kinds are registered by the apps
# as they start, after this module is imported).
Values = tuple[str, ...] | Callable[[], tuple[str, ...]]


class MetricError(ValueError):
    """A family or series that is not declared: a programming error, never a caller's."""


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    help: str
    labels: tuple[tuple[str, Values], ...]  # (name, closed values), sorted by name

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.labels)

    def values_of(self, label: str) -> tuple[str, ...]:
        values = dict(self.labels)[label]
        values = values() if callable(values) else values
        for value in values:
            _check_value(self.name, label, value)
        return tuple(values)


_FAMILIES: dict[str, Family] = {}


def _check_value(family: str, label: str, value) -> None:
    if not isinstance(value, str) or not LABEL_VALUE.match(value):
        raise MetricError(f"{family}: label {label} value {value!r} is not a plain word")


def register(name: str, kind: str, help: str, /, **labels: Values) -> Family:
    """Declare a family (again with the same declaration: the same family)."""
    if not NAME.match(name):
        raise MetricError(f"metric name {name!r} must match {NAME.pattern}")
    if kind not in KINDS:
        raise MetricError(f"{name}: kind must be one of {KINDS}, not {kind!r}")
    if kind == "counter" and not name.endswith("_total"):
        raise MetricError(f"{name}: a counter's name ends in _total")
    if not help or "\n" in help:
        raise MetricError(f"{name}: a one-line help text is required")
    for label, values in labels.items():
        if not LABEL_NAME.match(label):
            raise MetricError(f"{name}: label name {label!r} must match {LABEL_NAME.pattern}")
        if not callable(values):
            if not values:
                raise MetricError(f"{name}: label {label} needs at least one value")
            for value in values:
                _check_value(name, label, value)
    family = Family(name, kind, help, tuple(sorted((label, values if callable(values) else tuple(values))
                                                   for label, values in labels.items())))
    existing = _FAMILIES.get(name)
    if existing is not None and existing != family:
        raise MetricError(f"{name} is already declared differently")
    _FAMILIES[name] = family
    return family


def family(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise MetricError(f"no metric family {name!r} is declared") from None


def all_families() -> list[Family]:
    return sorted(_FAMILIES.values(), key=lambda f: f.name)


def series_key(name: str, labels: dict[str, str], /) -> str:
    """The series' labels as the exposition writes them (`a="x",b="y"`), after checking that they are
    exactly the family's labels, each with one of its closed values."""
    declared = family(name)
    if set(labels) != set(declared.label_names):
        raise MetricError(f"{name} takes labels {sorted(declared.label_names)}, not {sorted(labels)}")
    parts = []
    for label in declared.label_names:
        value = labels[label]
        if value not in declared.values_of(label):
            raise MetricError(f"{name}: {value!r} is not a value of label {label}")
        parts.append(f'{label}="{value}"')
    return ",".join(parts)


def labels_of(key: str, /) -> dict[str, str]:
    """The labels a `series_key` wrote (closed values are plain words: no comma or quote inside one)."""
    pairs = (part.split("=", 1) for part in key.split(",") if "=" in part)
    return {label: quoted.strip('"') for label, quoted in pairs}
