"""The Prometheus text exposition (format 0.0.4) of every declared family.

Counters come from their rows, gauges from their readers. A family whose label values multiply to at
most `ZERO_SERIES_MAX` series lists every series, zeros included, so a dashboard sees a series before
its first event; a larger one (failures by stage and code) lists the series that have a value."""

from __future__ import annotations

import itertools

from core.metrics.families import Family, all_families, labels_of
from core.metrics.gauges import gauge_reader
from core.metrics.models import MetricCounter

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ZERO_SERIES_MAX = 256


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels_text(family: Family, values: tuple[str, ...]) -> str:
    return ",".join(f'{name}="{value}"' for name, value in zip(family.label_names, values, strict=True))


def _series(family: Family) -> dict[str, float]:
    """{labels text: value} of one family."""
    closed = [family.values_of(label) for label in family.label_names]
    if family.kind == "counter":
        series = dict(MetricCounter.objects.filter(family=family.name).values_list("labels", "value"))
    else:
        read = gauge_reader(family.name)
        series = {}
        for key, reading in (read() if read else {}).items():
            if all(value in allowed for value, allowed in zip(key, closed, strict=True)):  # closed labels only
                series[_labels_text(family, key)] = reading
    combinations = 1
    for values in closed:
        combinations *= len(values)
    if combinations <= ZERO_SERIES_MAX:
        for values in itertools.product(*closed):
            series.setdefault(_labels_text(family, tuple(values)), 0)
    return series


def exposition() -> str:
    lines = []
    for family in all_families():
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
        for labels, value in sorted(_series(family).items()):
            lines.append(f"{family.name}{{{labels}}} {_number(value)}" if labels else f"{family.name} {_number(value)}")
    return "\n".join(lines) + "\n"


def counter_series(name: str) -> list[tuple[dict[str, str], float]]:
    """[(labels, value)] of one counter family's rows."""
    return [(labels_of(key), value)
            for key, value in MetricCounter.objects.filter(family=name).values_list("labels", "value")]


def counter_by_label(name: str, label: str, **where: str) -> dict[str, float]:
    """{value of `label`: the family's total for it over the series matching `where`}."""
    totals: dict[str, float] = {}
    for labels, value in counter_series(name):
        if label in labels and all(labels.get(key) == wanted for key, wanted in where.items()):
            totals[labels[label]] = totals.get(labels[label], 0.0) + value
    return totals


def counter_total(name: str) -> float:
    return sum(value for _, value in counter_series(name))
