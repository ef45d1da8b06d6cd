"""Helpers for the scorer-sandbox tests: write scorer executables, find leftover processes by marker."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest


@pytest.fixture
def make_scorer(tmp_path):
    """make_scorer(body, name=None) -> Path: an executable `#!/usr/bin/env python3` script."""

    def make(body: str, name: str | None = None, shebang: str = "#!/usr/bin/env python3") -> Path:
        path = tmp_path / (name or f"scorer_{uuid.uuid4().hex[:8]}.py")
        path.write_text(shebang + "\n" + textwrap.dedent(body).lstrip("\n"))
        path.chmod(0o755)
        return path

    return make


@pytest.fixture
def marker():
    return f"kilnsbxmarker{uuid.uuid4().hex}"


def processes_with(marker: str) -> list[int]:
    """Live (non-zombie) pids whose command line contains `marker`."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found
