"""`kiln serve` runs the whole stack on embedded defaults and stops every child it started."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from tests.support.stack import cli_token, free_port, pid_gone, serve_env, wait_until

pytestmark = pytest.mark.integration



def _reachable(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code in (200, 503)
    except httpx.TransportError:
        return False


def test_serve_starts_redis_workers_and_web_then_stops_them_all(tmp_path):
    port = free_port()
    env = serve_env(tmp_path / "home")
    (tmp_path / "home").mkdir(parents=True, exist_ok=True)
    (tmp_path / "home" / "cli-token").write_text("kiln_saved_by_scripts_serve\n")  # what ./scripts/serve leaves
    log = open(tmp_path / "serve.log", "wb")
    serve = subprocess.Popen([sys.executable, "-m", "kiln_project.cli.main", "serve", "--port", str(port)],
                             cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _reachable(url), 90, what="kiln serve to answer /health")
        headers = {"Authorization": f"Bearer {cli_token(env)}"}  # the full report needs credentials

        def healthy():
            try:
                body = httpx.get(url + "/health", timeout=2, headers=headers).json()
            except (httpx.TransportError, ValueError):
                return None
            return body if {"gpu", "infer", "control"} <= set(body["workers"]["queues_served"]) else None

        body = wait_until(healthy, 90, what="kiln serve to report both workers")
        assert body["database"] == {"ok": True, "engine": "sqlite"}
        assert body["broker"]["ok"] is True
        assert body["broker"]["url"] == f"unix://{tmp_path / 'home' / 'redis' / 'redis.sock'}"
        assert (tmp_path / "home" / "kiln.sqlite3").exists()
        worker_pids = [int(w["id"].split(":")[1]) for w in body["workers"]["workers"]]
        assert len(worker_pids) == 2
        children = subprocess.run(["pgrep", "-f", f"redis-server.*{tmp_path}"], capture_output=True, text=True)
        redis_pids = [int(p) for p in children.stdout.split()]
        assert redis_pids, "the private redis-server is running"

        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=90) == 0
        for pid in worker_pids + redis_pids:
            assert wait_until(lambda pid=pid: pid_gone(pid), 10, what=f"pid {pid} to exit")
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
        text = (tmp_path / "serve.log").read_text(errors="replace")
        # in this order: no new work, the control worker's runs stop before the GPU worker they sample from
        stopped = [line.split()[-1] for line in text.splitlines() if line.startswith("kiln: stopped ")]
        assert stopped == ["web", "control-worker", "gpu-worker", "redis"]
        # no anonymous access here: serve says how the guides' curl steps send the saved token
        assert (f"kiln: the API asks for a token: export KILN_API_TOKEN=$(cat {tmp_path / 'home' / 'cli-token'})"
                in text)
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()
