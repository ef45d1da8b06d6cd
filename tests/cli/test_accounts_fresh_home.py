"""`kiln user create` and `kiln token create` are the README's first steps: on a fresh KILN_HOME (no
database yet, no `kiln serve` before) they migrate it first, as `kiln serve` does."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest


def _kiln(home, *args, password="long-enough-pw"):
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "KILN_DATABASE_URL", "KILN_DEBUG")}
    env.update(KILN_HOME=str(home), KILN_PASSWORD=password)
    return subprocess.run([sys.executable, "-m", "kiln_project.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.timeout(600)
def test_user_and_token_commands_work_on_a_fresh_home(tmp_path):
    home = tmp_path / "fresh"
    created = _kiln(home, "user", "create", "alice")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "created user alice"
    assert "no such table" not in created.stderr

    token = _kiln(home, "token", "create", "alice")
    assert token.returncode == 0, token.stderr
    secret = token.stdout.strip()
    assert secret.startswith("kiln_") and len(secret.splitlines()) == 1

    databases = list(home.rglob("*.sqlite3"))
    assert len(databases) == 1
    with sqlite3.connect(databases[0]) as db:
        assert db.execute("select username from auth_user").fetchall() == [("alice",)]

    again = _kiln(home, "user", "create", "alice")  # a second run migrates nothing and refuses the name
    assert again.returncode != 0 and "no such table" not in again.stderr
    assert again.stderr.startswith("error: ") and len(again.stderr.strip().splitlines()) == 1


def test_a_short_password_on_a_fresh_home_is_a_coded_one_line_error(tmp_path):
    refused = _kiln(tmp_path / "fresh", "user", "create", "alice", password="p")
    assert refused.returncode != 0
    assert refused.stderr.strip() == "error: weak_password: the password must be at least 8 characters"


def _kiln_stdin(home, stdin: str, *args):
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "KILN_DATABASE_URL", "KILN_DEBUG", "KILN_PASSWORD")}
    env.update(KILN_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "kiln_project.cli.main", *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_without_a_terminal_the_password_is_one_piped_line_and_a_closed_stdin_one_error_line(tmp_path):
    home = tmp_path / "fresh"
    piped = _kiln_stdin(home, "long-enough-pw\n", "user", "create", "carol")
    assert piped.returncode == 0 and piped.stdout.strip() == "created user carol"
    assert piped.stderr == ""  # no GetPassWarning, no "password input may be echoed"
    closed = _kiln_stdin(home, "", "user", "create", "dave")
    assert closed.returncode != 0 and len(closed.stderr.strip().splitlines()) == 1
    assert closed.stderr.startswith("error: input_closed: ")


def test_a_viewer_is_created_without_the_submit_permission(tmp_path):
    home = tmp_path / "fresh"
    assert _kiln(home, "user", "create", "reader", "--viewer").returncode == 0
    assert _kiln(home, "user", "create", "writer").returncode == 0
    [database] = list(home.rglob("*.sqlite3"))
    with sqlite3.connect(database) as db:
        rows = db.execute("select u.username, p.codename from auth_user u "
                          "left join auth_user_user_permissions up on up.user_id = u.id "
                          "left join auth_permission p on p.id = up.permission_id order by u.username").fetchall()
    assert rows == [("reader", None), ("writer", "submit_job")]
    clash = _kiln(home, "user", "create", "both", "--viewer", "--superuser")
    assert clash.returncode == 2 and "not allowed with argument" in clash.stderr


def test_a_home_another_command_makes_first_is_not_an_error(tmp_path):
    """Several commands started together on a fresh KILN_HOME: each sees no home, one makes it, and the
    others' mkdir meets it (CI caught `os_error: File exists` from one of four `user create`s). The
    interleaving is forced here: the home exists, but any existence check is told it does not, so a
    check-then-mkdir would meet it as those commands did."""
    home = tmp_path / "made-by-another"
    home.mkdir(mode=0o700)
    program = (
        "import pathlib, sys\n"
        "home = pathlib.Path(sys.argv[1])\n"
        "real_exists = pathlib.Path.exists\n"
        "pathlib.Path.exists = lambda self, *a, **k: False if self == home else real_exists(self, *a, **k)\n"
        "import kiln_project.settings as settings\n"
        "pathlib.Path.exists = real_exists\n"
        "print(settings.KILN.home == home)\n"
    )
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "KILN_DATABASE_URL", "KILN_DEBUG")}
    env.update(KILN_HOME=str(home))
    done = subprocess.run([sys.executable, "-c", program, str(home)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


@pytest.mark.timeout(600)
def test_an_upgrade_under_a_running_server_is_not_migrated_by_an_account_command(tmp_path):
    """QA: `kiln user create` run with newer code applied a migration (a NOT NULL column) to the database
    of a `kiln serve` still running the old code, and every job that server then created failed. With
    migrations pending and the server's lock held, the command refuses; with no server, it migrates."""
    from core.process_locks import ProcessLock

    home = tmp_path / "home"
    assert _kiln(home, "user", "create", "alice").returncode == 0
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "KILN_DATABASE_URL", "KILN_DEBUG")}
    env.update(KILN_HOME=str(home), DJANGO_SETTINGS_MODULE="kiln_project.settings")
    manage = os.path.join(os.path.dirname(__file__), "..", "..", "manage.py")
    older = subprocess.run([sys.executable, manage, "migrate", "jobs", "0003", "--verbosity", "0"], env=env,
                           capture_output=True, text=True, timeout=300)  # the database of the older code
    assert older.returncode == 0, older.stderr
    [database] = list(home.rglob("*.sqlite3"))

    def job_columns():
        with sqlite3.connect(database) as db:
            return {row[1] for row in db.execute("pragma table_info(jobs_job)")}

    assert "publishing" not in job_columns()
    serving = ProcessLock(home / "locks" / "serve.lock")
    assert serving.try_acquire()  # kiln serve holds it while it runs
    try:
        refused = _kiln(home, "user", "create", "bob")
    finally:
        serving.release()
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: kiln_serve_needs_restart: kiln serve (pid ") \
        and "jobs.0004_job_publishing" in refused.stderr and "restart it" in refused.stderr, refused.stderr
    assert "publishing" not in job_columns()  # its tables were left as the running server knows them
    assert not (home / "locks" / "serve.lock").read_text() or \
        json.loads((home / "locks" / "serve.lock").read_text())["pid"] == os.getpid()  # the probe wrote nothing

    migrated = _kiln(home, "user", "create", "bob")  # no server: the command brings it up to date
    assert migrated.returncode == 0, migrated.stderr
    assert "publishing" in job_columns()
