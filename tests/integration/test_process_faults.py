"""kill -9 at the process level: `kiln serve` leaves no children behind, a second serve on the same
KILN_HOME refuses before touching anything, and a GPU worker whose supervisor dies stops instead of
living on beside its replacement (the device lock's history shows no two holders at once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.stack import cli_token, free_port, pid_gone, serve_env, wait_until

pytestmark = pytest.mark.integration



def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def _serve(tmp_path, port, log_name="serve.log", model: Path | None = None):
    env = serve_env(tmp_path / "home")
    if model is not None:
        env["KILN_MODEL_PATH"] = str(model)
    log = open(tmp_path / log_name, "wb")
    return subprocess.Popen([sys.executable, "-m", "kiln_project.cli.main", "serve", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT), env


def _health(url, token=None):
    try:
        return httpx.get(url + "/health", timeout=2,
                         headers={"Authorization": f"Bearer {token}"} if token else {}).json()
    except (httpx.TransportError, ValueError):
        return None


def _observer(url, env):
    """Wait for the web process, then make a token: the full /health report needs credentials."""
    wait_until(lambda: _health(url), 90, what="kiln serve to answer /health")
    return cli_token(env)


def _workers(url, queue, token):
    body = _health(url, token) or {}
    return [w for w in (body.get("workers") or {}).get("workers", []) if queue in w.get("queues", [])]


def _stop(serve) -> None:
    if serve.poll() is not None:  # a test that killed it already
        return
    serve.send_signal(signal.SIGTERM)
    try:
        serve.wait(timeout=90)
    except subprocess.TimeoutExpired:
        serve.kill()


@contextmanager
def _serving(tmp_path, model: Path | None = None):
    """`kiln serve` on a free port, answering /health: (process, env, port, url, an observer's token);
    stopped afterwards unless the test already killed it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve, env = _serve(tmp_path, port, model=model)
    try:
        yield serve, env, port, url, _observer(url, env)
    finally:
        _stop(serve)


def _both_workers(url, token) -> dict:
    """The full /health report once kiln serve reports its GPU and control workers."""
    return wait_until(lambda: (b := _health(url, token)) and {"gpu", "control"} <= set(b["workers"]["queues_served"])
                      and b, 90, what="kiln serve to report both workers")


def test_kill_9_of_serve_leaves_no_children_and_a_second_serve_refuses(tmp_path):
    with _serving(tmp_path) as (serve, env, port, url, token):
        body = _both_workers(url, token)
        pids = [int(w["id"].split(":")[1]) for w in body["workers"]["workers"]]
        pids += [_ppid(pid) for pid in pids]  # dramatiq's supervisors too
        redis = subprocess.run(["pgrep", "-f", f"redis-server.*{tmp_path}"], capture_output=True, text=True)
        pids += [int(p) for p in redis.stdout.split()]

        second = subprocess.run([sys.executable, "-m", "kiln_project.cli.main", "serve", "--port", str(free_port())],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode != 0
        assert "kiln_already_serving" in second.stderr and str(serve.pid) in second.stderr
        assert second.stderr.strip().count("\n") == 0, second.stderr  # one line
        assert _health(url)["broker"]["ok"] is True  # the first one's Redis socket is untouched
        # Another home on the same port: refused before it says it serves (its banner was a lie that
        # sent requests to the first home's data while its web process failed to listen).
        other = subprocess.run([sys.executable, "-m", "kiln_project.cli.main", "serve", "--port", str(port)],
                               cwd=tmp_path, env=serve_env(tmp_path / "other-home"), capture_output=True,
                               text=True, timeout=120)
        assert other.returncode != 0 and "port_in_use" in other.stderr and "serving on" not in other.stdout

        serve.send_signal(signal.SIGKILL)
        serve.wait()
        for pid in pids:
            assert wait_until(lambda pid=pid: pid_gone(pid), 45, what=f"child {pid} to die with its supervisor")
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)

        again, _ = _serve(tmp_path, port, "serve-again.log")  # the lock died with its holder
        try:
            wait_until(lambda: _health(url), 90, what="a new kiln serve on the same home")
        finally:
            again.send_signal(signal.SIGTERM)
            again.wait(timeout=90)


def test_kill_9_of_the_gpu_workers_supervisor_stops_the_worker_before_a_new_one_takes_the_device(tmp_path):
    with _serving(tmp_path) as (_serve_process, _env, _port, url, token):
        [old] = wait_until(lambda: [w for w in _workers(url, "gpu", token)
                                    if (w.get("status") or {}).get("gpu_lock", {}).get("waiting") is False] or None,
                           90, what="the GPU worker to hold the device")
        old_pid = int(old["id"].split(":")[1])
        master = _ppid(old_pid)
        os.kill(master, signal.SIGKILL)
        killed = last_alive = time.time()
        while not pid_gone(old_pid):  # bounded: parent-death signal, else the heartbeat's orphan check
            last_alive = time.time()
            assert last_alive - killed < 90, "the orphaned GPU worker kept running"
            time.sleep(0.05)
        new = wait_until(lambda: [w for w in _workers(url, "gpu", token) if int(w["id"].split(":")[1]) != old_pid
                                  and (w.get("status") or {}).get("gpu_lock", {}).get("waiting") is False] or None,
                         120, what="the restarted GPU worker to take the device")
        new_pid = int(new[0]["id"].split(":")[1])
        history = [json.loads(line) for line in
                   (tmp_path / "home" / "locks" / "gpu.lock.history").read_text().splitlines()]
        acquired = [h for h in history if h["event"] == "acquired"]
        assert [h["pid"] for h in acquired][-2:] == [old_pid, new_pid]
        assert acquired[-1]["since"] > last_alive - 0.2, "the new worker held the device while the old one lived"


def test_kill_9_of_the_web_process_restarts_it_and_keeps_the_workers(tmp_path):
    # Before: "web exited with -9; shutting down" stopped both workers and Redis, failing any
    # running training. The web process holds no state, so serve restarts it like a worker.
    with _serving(tmp_path) as (serve, _env, _port, url, token):
        body = _both_workers(url, token)
        workers = sorted(w["id"] for w in body["workers"]["workers"])
        web = subprocess.run(["pgrep", "-P", str(serve.pid), "-f", "daphne"], capture_output=True, text=True)
        [web_pid] = [int(p) for p in web.stdout.split()]
        os.kill(web_pid, signal.SIGKILL)
        assert wait_until(lambda: pid_gone(web_pid), 30, what="the web process to die")
        after = wait_until(lambda: _health(url, token), 90, what="the restarted web process to answer")
        assert sorted(w["id"] for w in after["workers"]["workers"]) == workers  # the same worker processes
        assert serve.poll() is None
        log = (tmp_path / "serve.log").read_text()
        assert "web exited with -9; restarting it" in log and "shutting down" not in log


def test_kill_9_of_the_private_redis_restarts_it_and_jobs_still_run(tmp_path, tiny_model_dir):
    # Before: "redis exited with -9; shutting down" stopped the whole server. Redis keeps nothing
    # (the database is the truth), so serve starts a fresh one and re-sends lost wake-ups.
    with _serving(tmp_path, model=tiny_model_dir) as (serve, _env, _port, url, token):
        _both_workers(url, token)
        found = subprocess.run(["pgrep", "-P", str(serve.pid), "-f", "redis-server"], capture_output=True, text=True)
        [redis_pid] = [int(p) for p in found.stdout.split()]
        os.kill(redis_pid, signal.SIGKILL)
        wait_until(lambda: "redis exited with -9; restarting it" in (tmp_path / "serve.log").read_text(), 30,
                   what="serve to restart its Redis")
        wait_until(lambda: (b := _health(url, token)) and b["broker"]["ok"], 60, what="the broker to answer again")
        groups = [{"messages": [{"role": "user", "content": f"What is {i} + 1?"}],
                   "completions": [{"text": str(i + 1), "reward": 1.0}, {"text": "no", "reward": 0.0}]}
                  for i in range(2)]
        headers = {"Authorization": f"Bearer {token}"}
        submitted = httpx.post(url + "/v1/train/grpo", headers=headers, timeout=30,
                               json={"groups": groups, "config": {"output_name": "after-redis-r001"}})
        assert submitted.status_code in (200, 202), submitted.text
        job_id = submitted.json()["job_id"]
        # The job is picked up and trains on the tiny model: nothing stays queued.
        final = wait_until(lambda: (j := httpx.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=5).json())
                           and j["state"] in ("completed", "failed") and j, 180, what="the job to run")
        assert final["state"] == "completed", final
        assert serve.poll() is None
        assert "shutting down" not in (tmp_path / "serve.log").read_text()
