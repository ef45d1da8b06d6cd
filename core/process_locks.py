"""Locks that the OS releases when their holder dies, and children that die with their parent.
Pure module (os, fcntl, ctypes).

- `ProcessLock`: an exclusive flock on a file under KILN_HOME/locks/, held until released or until
  the process dies (kill -9 included: the kernel drops it). The file names the holder (pid, since)
  so a refusal can say who holds it, and `history` appends one line per acquisition, the record a
  fault test checks for overlap.
- `die_with_parent`: Linux's PR_SET_PDEATHSIG, so a worker whose supervisor is killed gets a
  signal instead of living on as an orphan that keeps the GPU busy.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


class ProcessLock:
    def __init__(self, path: Path, *, history: Path | None = None):
        self.path = Path(path)
        self.history = history
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        record = {"pid": os.getpid(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        if self.history is not None:
            with open(self.history, "a") as log:
                log.write(json.dumps({"event": "acquired", **record}) + "\n")
        return True

    def acquire(self, *, timeout: float | None = None, poll: float = 0.25, should_stop=lambda: False) -> bool:
        """Wait for the lock (polling, so a stop request or a timeout ends the wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_acquire():
            if should_stop() or (deadline is not None and time.monotonic() >= deadline):
                return False
            time.sleep(poll)
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        if self.history is not None:
            with open(self.history, "a") as log:
                log.write(json.dumps({"event": "released", "pid": os.getpid(), "at": time.time()}) + "\n")
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (probed without taking it over or writing)."""
        if self._fd is not None or not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the probe's lock, if it got one
        return False

    def holder(self) -> dict | None:
        """Who holds it, as the holder wrote (None if nobody wrote or the file is gone)."""
        try:
            return json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux; elsewhere a no-op).
    If the parent is already gone (it died before this call), send it now."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died between the two calls
        os.kill(os.getpid(), sig)
