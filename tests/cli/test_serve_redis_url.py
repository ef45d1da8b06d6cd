"""`kiln serve` with a KILN_REDIS_URL that is not a usable Redis URL stops at once with one invalid_config
line naming the variable: not `unexpected_error: ValueError` (another scheme), and not a start on database
0 of a shared Redis (a database path redis-py cannot read)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve_line(tmp_path, redis_url: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KILN_") and k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(KILN_HOME=str(tmp_path / "home"), KILN_PORT=str(_closed_port()), KILN_REDIS_URL=redis_url)
    done = subprocess.run([sys.executable, "-m", "kiln_project.cli.main", "serve", "--no-workers"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "serving on" not in done.stdout, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return done.returncode, lines[0]


def test_serve_refuses_a_bad_redis_url_as_invalid_config(tmp_path):
    # a closed port: before the fix, the bad database path reached the reachability check instead
    code, line = _serve_line(tmp_path, f"redis://:pw-secret@127.0.0.1:{_closed_port()}/abc")
    assert code == 1 and line.startswith("error: invalid_config: KILN_REDIS_URL must name a database number"), line
    assert "pw-secret" not in line and "(hint: e.g. KILN_REDIS_URL=redis://" in line
    code, line = _serve_line(tmp_path, "http://127.0.0.1:6379/11")
    assert code == 1 and line.startswith("error: invalid_config: KILN_REDIS_URL must be a redis://, rediss:// "
                                         "or unix:// URL, not 'http://127.0.0.1:6379/11'"), line
