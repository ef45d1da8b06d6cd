"""Named locks that serialize a check-then-write across processes, held until the transaction ends.

    with transaction.atomic():
        serialize("adapter.registry")       # e.g. "which adapter is active?" then "make this one active"
        ...

PostgreSQL runs transactions at READ COMMITTED: two transactions that each read "nothing else is
loaded" and then write can both commit (write skew), which row locks on the rows they read cannot
stop. A transaction-level advisory lock keyed by the name makes them take turns, and each statement
after it sees what the one before committed. SQLite needs nothing: Kiln opens its transactions
IMMEDIATE, so writers already take turns at BEGIN.
"""

from __future__ import annotations

import hashlib

from django.db import connection

REGISTRY = "adapter.registry"  # which adapter is active, promotions against it, deletes


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `name` (PostgreSQL's bigint)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def serialize(name: str) -> None:
    """Wait for every other transaction serialized on `name` to end; call inside transaction.atomic()."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key(name)])
