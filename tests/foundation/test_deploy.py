"""The documented production settings pass `manage.py check --deploy`, refuse to start without a
secret key from the environment, and a new KILN_HOME keeps its database and secrets private."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _manage(home: Path, *args: str, **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KILN_") and k != "DATABASE_URL"}
    environment.update(KILN_HOME=str(home), DJANGO_SETTINGS_MODULE="kiln_project.settings", **env)
    return subprocess.run([sys.executable, str(REPO / "manage.py"), *args], env=environment, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_production_settings_pass_check_deploy(tmp_path):
    done = _manage(tmp_path / "home", "check", "--deploy", "--fail-level", "WARNING", KILN_PRODUCTION="1",
                   KILN_SECRET_KEY=secrets.token_urlsafe(64), KILN_ALLOWED_HOSTS="kiln.example.com")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_refuses_a_generated_secret_key(tmp_path):
    done = _manage(tmp_path / "home", "check", KILN_PRODUCTION="1", KILN_ALLOWED_HOSTS="kiln.example.com")
    assert done.returncode != 0 and "KILN_SECRET_KEY" in done.stderr


def test_a_new_kiln_home_is_private(tmp_path):
    home = tmp_path / "home"
    done = _manage(home, "migrate", "-v0")
    assert done.returncode == 0, done.stderr
    mode = lambda path: stat.S_IMODE(path.stat().st_mode)  # noqa: E731
    assert mode(home) == 0o700
    assert mode(home / "kiln.sqlite3") == 0o600 and mode(home / "secret_key") == 0o600
