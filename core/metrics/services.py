"""Counting: `counter_add` grows one series of a declared counter family (core.metrics.families).

Call it inside the transaction that makes the change it counts: the count commits with the change or
not at all, and a conditional state change counted there is counted exactly once. Called on its own
(an event that changes no row, such as an idempotent retry answered), it retries while another writer
holds SQLite's lock, as the services' own short writes do.

`CounterBuffer` is for a hot path that changes no row (an inference request answered): it counts in
memory and writes the sums every few seconds from its own thread, so a request costs no database
write; a kill -9 loses at most the last interval's counts, and a failed write keeps them for the next."""

from __future__ import annotations

import logging
import math
import threading
import time

from django.db import IntegrityError, OperationalError, transaction
from django.db.models import F

from core.metrics.families import MetricError, family, series_key
from core.metrics.models import MetricCounter

log = logging.getLogger(__name__)

LOCKED_ATTEMPTS = 8
FLUSH_INTERVAL_SECONDS = 5.0


def _checked(name: str, amount, labels: dict) -> str:
    """The series key of a valid count (a declared counter, its closed labels, a finite amount >= 0)."""
    if family(name).kind != "counter":
        raise MetricError(f"{name} is not a counter")
    key = series_key(name, labels)
    if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount) or amount < 0:
        raise MetricError(f"{name}: a counter grows by a finite amount >= 0, not {amount!r}")
    return key


def counter_add(name: str, amount: float = 1, /, **labels: str) -> None:
    key = _checked(name, amount, labels)
    if amount == 0:
        return
    if transaction.get_connection().in_atomic_block:
        _add(name, key, amount)  # the caller's transaction (and its retry) holds it
        return
    _add_retrying(name, key, amount)


def _add_retrying(name: str, key: str, amount: float) -> None:
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


class CounterBuffer:
    """Counts added in memory (checked at once, like `counter_add`) and written by `flush()`: every
    `interval` seconds from a daemon thread once `start()` ran (the worker process that serves the hot
    path starts it), and at its clean stop. A failed write keeps the counts for the next flush."""

    def __init__(self, interval: float = FLUSH_INTERVAL_SECONDS):
        self.interval = interval
        self._pending: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def add(self, name: str, amount: float = 1, /, **labels: str) -> None:
        key = _checked(name, amount, labels)
        with self._lock:
            self._pending[(name, key)] = self._pending.get((name, key), 0.0) + amount

    def pending(self) -> dict[tuple[str, str], float]:
        with self._lock:
            return dict(self._pending)

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(target=self._run, name="kiln-metrics-flush", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then write what is left (the worker's clean stop)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.interval + 5)
        self.flush()

    def flush(self) -> bool:
        """Write what is pending; on a failure keep it for the next flush. Whether everything was written."""
        from django.db import connection

        with self._lock:
            taken, self._pending = self._pending, {}
        written = True
        for (name, key), amount in taken.items():
            if amount == 0:
                continue
            try:
                _add_retrying(name, key, amount)
            except Exception as exc:  # noqa: BLE001 - counts are kept; the work they count is not disturbed
                log.warning("metrics: %s{%s} +%s not written yet: %s", name, key, amount, exc)
                with self._lock:
                    self._pending[(name, key)] = self._pending.get((name, key), 0.0) + amount
                written = False
        if threading.current_thread() is self._thread:
            connection.close()  # this thread's own connection: not held open between flushes
        return written

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            self.flush()
