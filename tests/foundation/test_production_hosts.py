"""Production settings serve the configured host names and, always, loopback (README: allowed hosts
"none (loopback always)"): a production Kiln with no KILN_ALLOWED_HOSTS answers on loopback only,
and a health check on 127.0.0.1 is not a 400."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json
from django.conf import settings
from django.test import Client
client = Client()
codes = {host: client.get("/v1/health", HTTP_HOST=host).status_code
         for host in ("127.0.0.1", "localhost", "[::1]", "127.0.0.1:8420", "kiln.example.com", "evil.example")}
print(json.dumps({"allowed": settings.ALLOWED_HOSTS, "codes": codes}))
"""


def _probe(home: Path, **env) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("KILN_") and k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    environment.update(KILN_HOME=str(home), DJANGO_SETTINGS_MODULE="kiln_project.settings", KILN_PRODUCTION="1",
                       KILN_SECRET_KEY=secrets.token_urlsafe(64), **env)
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "shell", "-c", PROBE], env=environment,
                          cwd=home.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_production_always_serves_loopback_and_the_configured_hosts(tmp_path):
    seen = _probe(tmp_path / "home", KILN_ALLOWED_HOSTS="kiln.example.com")
    assert seen["allowed"] == ["127.0.0.1", "localhost", "[::1]", "kiln.example.com"]
    # 301: the HTTPS redirect (the host was accepted); 400: DisallowedHost
    assert seen["codes"] == {"127.0.0.1": 301, "localhost": 301, "[::1]": 301, "127.0.0.1:8420": 301,
                             "kiln.example.com": 301, "evil.example": 400}


def test_production_without_allowed_hosts_serves_loopback_only(tmp_path):
    seen = _probe(tmp_path / "home")
    assert seen["allowed"] == ["127.0.0.1", "localhost", "[::1]"]
    assert seen["codes"]["127.0.0.1"] == 301 and seen["codes"]["kiln.example.com"] == 400
