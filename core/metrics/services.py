"""Counting: `counter_add` grows one series of a declared counter family (core.metrics.families).

Call it inside the transaction that makes the change it counts: the count commits with the change or
not at all, and a conditional state change counted there is counted exactly once. Called on its own
(an event that changes no row, such as an idempotent retry answered), it retries while another writer
holds SQLite's lock, as the services' own short writes do."""

from __future__ import annotations

import math
import time

from django.db import IntegrityError, OperationalError, transaction
from django.db.models import F

from core.metrics.families import MetricError, family, series_key
from core.metrics.models import MetricCounter

LOCKED_ATTEMPTS = 8


def counter_add(name: str, amount: float = 1, /, **labels: str) -> None:
    if family(name).kind != "counter":
        raise MetricError(f"{name} is not a counter")
    key = series_key(name, labels)
    if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount) or amount < 0:
        raise MetricError(f"{name}: a counter grows by a finite amount >= 0, not {amount!r}")
    if amount == 0:
        return
    if transaction.get_connection().in_atomic_block:
        _add(name, key, amount)  # the caller's transaction (and its retry) holds it
        return
    for attempt in range(LOCKED_ATTEMPTS):
        try:
            _add(name, key, amount)
            return
        except OperationalError as exc:
            if "locked" not in str(exc) or attempt == LOCKED_ATTEMPTS - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def _add(name: str, key: str, amount: float) -> None:
    with transaction.atomic():
        if MetricCounter.objects.filter(family=name, labels=key).update(value=F("value") + amount):
            return
        try:
            with transaction.atomic():  # a savepoint: a concurrent first count may have made the row
                MetricCounter.objects.create(family=name, labels=key, value=amount)
        except IntegrityError:
            MetricCounter.objects.filter(family=name, labels=key).update(value=F("value") + amount)
