"""Reading GET /metrics in tests the way Prometheus does (prometheus_client's own text parser)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of its labels): value}; counters' samples are named with `_total`."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sample(text: str, name: str, **labels: str) -> float | None:
    """One series' value, or None when the exposition has no such series."""
    return samples(text).get((name, frozenset(labels.items())))


def label_values(text: str) -> set[str]:
    """Every label value the exposition carries."""
    return {value for _, labels in samples(text) for _, value in labels}
