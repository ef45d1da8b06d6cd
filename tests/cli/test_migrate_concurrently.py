"""Several Kiln commands that start together on one fresh PostgreSQL database (nodes of one deployment)
all migrate it without failing on each other's tables: the migration runs under an advisory lock.
Skipped when no PostgreSQL answers on 127.0.0.1:5432 (or KILN_TEST_DATABASE_URL's server)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

ADMIN_URL = os.environ.get("KILN_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def fresh_database():
    psycopg = pytest.importorskip("psycopg")
    name = f"kiln_migrate_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL to create a database on ({exc})")
    yield ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_four_user_creates_on_a_fresh_postgres_all_migrate_and_succeed(tmp_path, fresh_database):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KILN_") and k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(KILN_HOME=str(tmp_path / "home"), DATABASE_URL=fresh_database, KILN_PASSWORD="password123")
    procs = [subprocess.Popen([sys.executable, "-m", "kiln_project.cli.main", "user", "create", f"mig{i}"],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    results = [(*proc.communicate(timeout=300), proc.returncode) for proc in procs]
    assert [(code, out.strip(), err) for out, err, code in results] == [
        (0, f"created user mig{i}", "") for i in range(4)]
