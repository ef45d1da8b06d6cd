"""Gauges: values read from the rows that are the truth, at scrape time (nothing to keep in step).

An app declares a gauge family and the selector that reads it (`register_gauge`); the selector answers
{label values in the family's label order: value}. Series it leaves out read 0."""

from __future__ import annotations

from collections.abc import Callable

from core.metrics.families import LABEL_VALUE, Values, register

Reading = Callable[[], dict[tuple[str, ...], float]]
_READERS: dict[str, Reading] = {}


def register_gauge(name: str, help: str, read: Reading, /, **labels: Values) -> None:
    register(name, "gauge", help, **labels)
    _READERS[name] = read


def gauge_reader(name: str) -> Reading | None:
    return _READERS.get(name)


OTHER_KIND = "other"  # a job row of a kind no module registers now (a removed extra module)


def _job_kinds() -> tuple[str, ...]:
    """The registered kinds whose names are plain words (an extra module's odd name reads as `other`)."""
    from core.jobs.kinds import registered_kinds

    return tuple(kind.name for kind in registered_kinds() if LABEL_VALUE.match(kind.name)) + (OTHER_KIND,)


def _jobs_by_kind_and_state() -> dict[tuple[str, ...], float]:
    from django.db.models import Count

    from core.jobs.models import Job

    known = set(_job_kinds())
    counts: dict[tuple[str, ...], float] = {}
    for row in Job.objects.filter(deleted_at__isnull=True).values("kind", "state").annotate(n=Count("id")):
        key = (row["kind"] if row["kind"] in known else OTHER_KIND, row["state"])
        counts[key] = counts.get(key, 0) + row["n"]
    return counts


def register_kernel_gauges() -> None:
    from core.jobs.models import JobState

    register_gauge("kiln_jobs", "Jobs by kind and state (deleted ones left out).", _jobs_by_kind_and_state,
                   kind=_job_kinds, state=tuple(JobState.values))
