"""Terminal output helpers: JSON, simple tables and a progress bar that only draws on a terminal."""

from __future__ import annotations

import json
import sys


def print_json(value) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def print_table(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


class ProgressBar:
    """Redraws one line on a terminal; prints a line per state change otherwise (logs stay readable)."""

    def __init__(self, stream=None, width: int = 30):
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self._last = None

    def update(self, fraction: float, label: str) -> None:
        fraction = min(max(fraction, 0.0), 1.0)
        if self.tty:
            filled = int(round(self.width * fraction))
            bar = "#" * filled + "-" * (self.width - filled)
            self.stream.write(f"\r[{bar}] {fraction * 100:5.1f}% {label[:60]:<60}")
            self.stream.flush()
        elif label != self._last:
            self.stream.write(f"{fraction * 100:5.1f}% {label}\n")
            self.stream.flush()
        self._last = label

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})


# While following, a server that went away for a moment (kiln serve restarting its web process, Redis
# briefly gone) is waited for: the job goes on on the server, so the follower should not give up on it.
TRANSIENT_CODES = frozenset({"connection_failed", "service_unavailable", "server_shutting_down"})
RECONNECT_SECONDS = 60.0


def fetch_through_restarts(fetch, *, grace_seconds: float | None = None, stream=None):
    """fetch(), asked again each second while a server that answered before does not (TRANSIENT_CODES),
    for up to grace_seconds; one line on stderr says so. QA: `kiln eval run --follow` exited 1 connection_failed
    while kiln serve brought its web process back within 2 s, and the eval completed."""
    import time

    from kiln_project.cli.client import CliError

    grace_seconds = RECONNECT_SECONDS if grace_seconds is None else grace_seconds
    deadline = None
    while True:
        try:
            return fetch()
        except CliError as exc:
            if exc.code not in TRANSIENT_CODES:
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + grace_seconds
                print(f"kiln: the server did not answer ({exc.code}); asking again for up to {grace_seconds:.0f} s "
                      "(the work goes on on the server)", file=stream or sys.stderr, flush=True)
            if now >= deadline:
                raise
            time.sleep(1.0)


def follow(fetch, label, *, poll_seconds: float = 0.5) -> dict:
    """Call fetch() until its "state" is terminal, drawing progress with label(status); return the last."""
    import time

    bar = ProgressBar()
    answered = False
    try:
        while True:
            # only a server that answered once is waited for: with none at all, say so at once
            status = fetch_through_restarts(fetch) if answered else fetch()
            answered = True
            bar.update(status["progress"], label(status))
            if status["state"] in TERMINAL_STATES:
                return status
            time.sleep(poll_seconds)
    finally:
        bar.close()


def check_output_path(path) -> None:
    """Refuse, before anything is downloaded or collected, an output that is a device, FIFO, socket or
    directory (the download is published by renaming over it: core.artifacts.check_replaceable), or
    whose folder does not exist or cannot take a new file (the temporary file is written beside it)."""
    import os
    from pathlib import Path

    from core.artifacts import ArtifactError, check_replaceable
    from kiln_project.cli.client import CliError

    try:
        check_replaceable(path)
    except ArtifactError as exc:
        raise CliError("output_not_a_file", str(exc), "name a file path for the output") from None
    folder = Path(path).parent
    if not folder.is_dir():
        raise CliError("output_folder_not_found", f"the folder {folder} for {path} does not exist",
                       "create it first, or choose another output path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError("output_folder_not_writable", f"cannot write {path}: the folder {folder} is not writable",
                       "choose an output path in a folder you can write")
