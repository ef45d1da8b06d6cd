"""Whether a worker process is still alive, judged from its heartbeat row (and /proc on this host)."""

from __future__ import annotations

import os
import socket

from django.utils import timezone

# A worker silent for this long is dead, whatever its row says (another host, a frozen process).
STALE_AFTER_SECONDS = 30


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed process whose parent died too can linger as a zombie until init reaps it.
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def worker_is_dead(heartbeat, now=None) -> bool:
    if heartbeat is None or heartbeat.stopped:
        return True
    now = now or timezone.now()
    if (now - heartbeat.last_seen).total_seconds() > STALE_AFTER_SECONDS:
        return True
    return heartbeat.hostname == socket.gethostname() and not _pid_alive(heartbeat.pid)


def silent_but_running(heartbeat, now=None) -> bool:
    """A worker of this host whose process runs but whose heartbeat stopped: hung, or unable to record
    it (a full disk refuses every database write). Dead to the queues all the same."""
    if heartbeat is None or heartbeat.stopped or heartbeat.hostname != socket.gethostname():
        return False
    now = now or timezone.now()
    return (now - heartbeat.last_seen).total_seconds() > STALE_AFTER_SECONDS and _pid_alive(heartbeat.pid)
