"""A real OpenEnv server (PyPI `openenv==0.10.0`) in its own virtual environment, as a separate process.

The virtual environment is created once and cached in $KILN_TEST_OPENENV_VENV (default
/tmp/kiln-test-openenv-0.10.0); it is reused when its `openenv` distribution has the pinned
version. The package is never imported into Kiln's interpreter (it shares our `openenv` name):
the server runs `python -m uvicorn counter_env:app` from a scratch folder, with no
PYTHONPATH, so only that environment's site-packages are visible. If pip cannot install the
package (no index or mirror), the tests that need it skip with pip's last lines as the reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

OPENENV_VERSION = "0.10.0"
# The counter environment is the OpenEnv example users run (examples/openenv-counter); the tests' other
# environments sit beside this file, and some build on the counter (`from counter_env import ...`).
ENV_SOURCE = Path(__file__).resolve().parents[2] / "examples" / "openenv-counter" / "counter_env.py"
TEST_ENVS = Path(__file__).with_name("interop_env")
PIP_TIMEOUT_S = 1500
START_TIMEOUT_S = 120


def venv_dir() -> Path:
    return Path(os.environ.get("KILN_TEST_OPENENV_VENV") or f"/tmp/kiln-test-openenv-{OPENENV_VERSION}")


def _clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    env.pop("ENABLE_WEB_INTERFACE", None)
    env.update(extra or {})
    return env


def _installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('openenv'))"],
                           capture_output=True, text=True, env=_clean_env(), cwd="/", timeout=120)
    return probe.stdout.strip() if probe.returncode == 0 else None


def openenv_python() -> Path:
    """The cached environment's interpreter, creating the environment when needed (or skip)."""
    root = venv_dir()
    python = root / "bin" / "python"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_version(python) == OPENENV_VERSION:
            return python
        shutil.rmtree(root, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        made = subprocess.run([base, "-m", "venv", str(root)], capture_output=True, text=True, timeout=300)
        if made.returncode != 0:
            pytest.skip(f"cannot create a virtual environment for openenv: {made.stderr[-500:]}")
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", f"openenv=={OPENENV_VERSION}"],
                             capture_output=True, text=True, env=_clean_env(), cwd="/", timeout=PIP_TIMEOUT_S)
        if pip.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            tail = "\n".join((pip.stdout + pip.stderr).strip().splitlines()[-5:])
            pytest.skip(f"pip could not install openenv=={OPENENV_VERSION}: {tail}")
        version = _installed_version(python)
        assert version == OPENENV_VERSION, f"installed openenv {version}, wanted {OPENENV_VERSION}"
        return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, log_tail, headers: dict | None = None) -> None:
    """Until the server started as `process` answers `url`/health with 200; it exiting first, or
    START_TIMEOUT_S passing, raises with `log_tail()` (its log's last lines)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the OpenEnv server exited ({process.returncode}):\n{log_tail()}")
        try:
            if httpx.get(url + "/health", headers=headers or {}, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"the OpenEnv server did not answer /health in {START_TIMEOUT_S} s:\n{log_tail()}")


class RealServer:
    """`uvicorn <module>:app` on 127.0.0.1 (counter_env by default), started from a scratch folder.
    Another `module_source` is copied next to counter_env.py, which it may build on."""

    def __init__(self, python: Path, workdir: Path, *, port: int | None = None, max_sessions: int = 4,
                 max_delta: int = 3, module_source: Path = ENV_SOURCE):
        self.module_source = module_source
        self.python = python
        self.workdir = workdir
        self.port = port or free_port()
        self.env = _clean_env({"COUNTER_MAX_SESSIONS": str(max_sessions),
                               "COUNTER_MAX_DELTA": str(max_delta)})
        self.process: subprocess.Popen | None = None
        self.health_headers: dict = {}  # what the readiness probe sends (a protected server's token)
        self.log_path = workdir / f"server-{self.port}-{max_delta}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RealServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for source in {ENV_SOURCE, self.module_source}:
            shutil.copy(source, self.workdir / source.name)
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(self.python), "-m", "uvicorn", f"{self.module_source.stem}:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        try:
            wait_until_healthy(self.url, self.process, self.log_tail, headers=self.health_headers)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(15)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> RealServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
