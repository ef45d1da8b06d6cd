"""Bring the database up to date, once, however many Kiln commands start together.

`kiln serve` and the local account commands (`kiln user create`, `kiln token ...`) migrate before they
touch anything. Several nodes started together on one PostgreSQL would run the same migrations at the
same time and fail on each other's tables (`relation ... already exists`, a duplicate `pg_type` row):
on PostgreSQL the migration runs under a session advisory lock, so the others wait and then find
nothing left to do. SQLite needs no lock: it lives on one machine and its writers already serialize.
Wiring only (Django's migrate command and the default connection); imported after django.setup().
"""

from __future__ import annotations

# The advisory lock's key: any fixed bigint that no other lock on the database uses ("kilnmigr").
MIGRATE_LOCK_KEY = int.from_bytes(b"kilnmigr", "big") >> 1


def migrate_database() -> None:
    """`migrate`, serialized across processes on PostgreSQL. An unusable database raises Django's
    OperationalError here, which the CLI reports as database_unavailable."""
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        call_command("migrate", interactive=False, verbosity=0)
        return
    # A session lock (not a transaction one): migrate commits per migration. The server drops it if
    # this process dies, so a killed node never blocks the next start.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
    try:
        call_command("migrate", interactive=False, verbosity=0)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK_KEY])


def pending_upgrade() -> list[str]:
    """The migrations a database that is already in use (some migrations applied) still needs: an
    upgrade of Kiln's code. [] for an up-to-date database and for a fresh one (nothing applied)."""
    from django.db import DEFAULT_DB_ALIAS, connections
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    if not executor.loader.applied_migrations:
        return []
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]
