"""`kiln serve` refuses an unusable configuration before it starts anything, in one line with a
stable code: invalid_config (kiln.toml, a KILN_* variable, DATABASE_URL), invalid_host,
database_unavailable, redis_unavailable. Never `unexpected_error`, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_project.cli.client import CliError
from kiln_project.cli.main import unexpected_error
from kiln_project.cli.serve import check_port_free, check_redis_reachable

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(tmp_path: Path, *args: str, **env) -> tuple[int, str]:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("KILN_") and k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    environment.update({"KILN_HOME": str(tmp_path / "home"), "KILN_PORT": str(_closed_port()), **env})
    done = subprocess.run([sys.executable, "-m", "kiln_project.cli.main", "serve", "--no-workers", *args],
                          env=environment, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "serving on" not in done.stdout, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return done.returncode, lines[0]


def test_config_errors_are_one_invalid_config_line_naming_the_setting(tmp_path):
    code, line = _serve(tmp_path, KILN_PORT="99999")
    assert code == 1 and line.startswith(
        "error: invalid_config: KILN_PORT must be an integer from 1 to 65535, not 99999 (hint: fix the "
        "environment variable KILN_PORT")
    (tmp_path / "kiln.toml").write_text('[server]\nallow_anonymous_api = "false"\n')
    code, line = _serve(tmp_path)
    assert code == 1 and line.startswith("error: invalid_config: [server] allow_anonymous_api must be true or "
                                         "false, not 'false' (a string) (hint: fix ")
    assert str(tmp_path / "kiln.toml") in line
    (tmp_path / "kiln.toml").unlink()
    code, line = _serve(tmp_path, KILN_KERNELS="bogus")
    assert code == 1 and line.startswith("error: invalid_config: KILN_KERNELS must be one of auto, torch, triton")
    code, line = _serve(tmp_path, DATABASE_URL="bogus://x")
    assert code == 1 and line.startswith("error: invalid_config: ") and "bogus" in line
    code, line = _serve(tmp_path, "--port", "0")
    assert code == 1 and line.startswith("error: invalid_config: --port must be from 1 to 65535, not 0")


def test_an_unresolvable_host_is_invalid_host_not_port_in_use(tmp_path):
    code, line = _serve(tmp_path, KILN_HOST="not-a-host.invalid")
    assert code == 1 and line.startswith("error: invalid_host: cannot listen on not-a-host.invalid:"), line


def test_an_unreachable_redis_is_refused_at_start(tmp_path):
    code, line = _serve(tmp_path, KILN_REDIS_URL=f"redis://127.0.0.1:{_closed_port()}/0")
    assert code == 1 and line.startswith("error: redis_unavailable: the Redis at KILN_REDIS_URL "
                                         "(redis://127.0.0.1:"), line
    assert "KILN_REDIS_URL" in line.split("(hint: ", 1)[1]


def test_an_unreachable_database_is_database_unavailable(tmp_path):
    code, line = _serve(tmp_path, DATABASE_URL=f"postgres://kiln@127.0.0.1:{_closed_port()}/kiln")
    assert code == 1 and line.startswith("error: database_unavailable: cannot use the database: "), line
    assert "DATABASE_URL" in line


def test_a_postgres_database_that_does_not_exist_is_database_unavailable(tmp_path):
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
    except OSError:
        pytest.skip("no PostgreSQL on 127.0.0.1:5432")
    code, line = _serve(tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:5432/kiln_no_such_database_x")
    assert code == 1 and line.startswith("error: database_unavailable: "), line
    assert "kiln_no_such_database_x" in line


def test_unexpected_error_maps_django_configuration_and_database_errors():
    from django.core.exceptions import ImproperlyConfigured
    from django.db.utils import OperationalError

    mapped = unexpected_error(ImproperlyConfigured("production settings need KILN_SECRET_KEY\n(50 or more)"))
    assert (mapped.code, mapped.message) == ("invalid_config", "production settings need KILN_SECRET_KEY (50 or more)")
    mapped = unexpected_error(OperationalError('connection failed: FATAL:  database "x" does not exist\n'))
    assert mapped.code == "database_unavailable"
    assert mapped.message == 'cannot use the database: connection failed: FATAL: database "x" does not exist'


def test_check_port_free_tells_a_bad_host_from_a_busy_port():
    with pytest.raises(CliError) as refused:
        check_port_free("not-a-host.invalid", 8420)
    assert refused.value.code == "invalid_host" and "KILN_HOST" in refused.value.hint
    with pytest.raises(CliError) as refused:
        check_port_free("192.0.2.1", 8420)  # TEST-NET-1: an address of no machine here
    assert refused.value.code == "invalid_host"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with pytest.raises(CliError) as refused:
            check_port_free("127.0.0.1", listener.getsockname()[1])
        assert refused.value.code == "port_in_use"


def test_check_redis_reachable():
    with pytest.raises(CliError) as refused:
        check_redis_reachable(f"redis://:secret@127.0.0.1:{_closed_port()}/0", timeout=0.5)
    assert refused.value.code == "redis_unavailable" and "secret" not in refused.value.message
