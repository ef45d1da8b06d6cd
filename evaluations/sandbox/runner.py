"""run_scorer: run one scorer executable on one JSON payload, sandboxed by default, and return its reward.

The scorer runs under bubblewrap (bwrap.py) started as the dedicated unprivileged uid, with an exec'd
launcher (_launcher.py) as the pid namespace's init that sets the rlimits inside the sandbox, a seccomp
deny-list (seccomp.py), and the wall clock and output cap of supervise.py; verdict.py reads the result.
`unsandboxed=True` keeps only the rlimits, the wall clock and the output cap.

Pure: standard library only; no Django, no torch.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from . import bwrap as bw
from .seccomp import build_filter
from .supervise import Plan, memfd, supervise
from .types import SANDBOX_UNAVAILABLE, SCORER_NOT_EXECUTABLE, ScorerError, ScorerLimits, ScorerResult
from .verdict import judge

DEFAULT_LIMITS = ScorerLimits()
LAUNCHER_SOURCE = (Path(__file__).with_name("_launcher.py")).read_text()
MAX_SCORER_FILE_BYTES = 64 << 20
NOFILE = 256
NICE = 10
_SAFE_BASENAME = re.compile(r"[A-Za-z0-9._+-]{1,100}")


def run_scorer(scorer: str | Path, payload: dict, *, limits: ScorerLimits = DEFAULT_LIMITS,
               unsandboxed: bool = False, cwd: Path | None = None) -> ScorerResult:
    """Run `scorer` with `payload` as one JSON object on stdin; return its reward or raise ScorerError.

    `cwd` resolves a relative scorer path (default: the process's cwd); unsandboxed, it is also the
    scorer's working directory (default: a fresh temporary directory). Sandboxed, the scorer's cwd is
    always its private /tmp.
    """
    if not isinstance(limits, ScorerLimits):
        raise TypeError("limits must be a ScorerLimits")
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict (one JSON object), got {type(payload).__name__}")
    data = (json.dumps(payload, ensure_ascii=False, allow_nan=False) + "\n").encode()
    path, content = _read_scorer(scorer, cwd)
    with ExitStack() as stack:
        if unsandboxed:
            workdir = Path(cwd) if cwd is not None else Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="kiln-scorer-")))
            plan = _plain_plan(path, limits, workdir)
        else:
            plan = _sandbox_plan(path, content, limits)
        outcome = supervise(plan, data, limits)
    return judge(outcome, plan, path, content, limits)


def _read_scorer(scorer: str | Path, cwd: Path | None) -> tuple[Path, bytes]:
    path = Path(scorer).expanduser()
    if not path.is_absolute():
        path = Path(cwd if cwd is not None else os.getcwd()) / path
    if not path.exists():
        raise ScorerError(SCORER_NOT_EXECUTABLE, f"scorer {str(scorer)!r} does not exist ({path})")
    if not path.is_file():
        raise ScorerError(SCORER_NOT_EXECUTABLE, f"scorer {str(scorer)!r} is not a regular file ({path})")
    st = path.stat()
    if not st.st_mode & 0o111:
        raise ScorerError(SCORER_NOT_EXECUTABLE,
                          f"scorer {str(scorer)!r} is not executable; run: chmod +x {path}")
    if st.st_size > MAX_SCORER_FILE_BYTES:
        raise ScorerError(SCORER_NOT_EXECUTABLE,
                          f"scorer {str(scorer)!r} is {st.st_size} bytes; at most {MAX_SCORER_FILE_BYTES}")
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise ScorerError(SCORER_NOT_EXECUTABLE, f"cannot read scorer {str(scorer)!r}: {exc}") from None
    return path, content


def _launcher_config(limits: ScorerLimits, env: dict, *, sandboxed: bool) -> str:
    return json.dumps({"cpu": max(1, math.ceil(limits.cpu_seconds)), "memory": limits.memory_bytes,
                       "fsize": limits.max_file_bytes, "nofile": NOFILE, "nice": NICE, "env": env,
                       # Outside a user namespace RLIMIT_NPROC would count every process of the caller's uid.
                       "nproc": limits.max_processes if sandboxed else None, "init": sandboxed})


def _sandbox_plan(path: Path, content: bytes, limits: ScorerLimits) -> Plan:
    binary = bw.find_bwrap()
    if not os.path.exists(bw.SANDBOX_PYTHON):
        raise ScorerError(SANDBOX_UNAVAILABLE, f"the sandbox runs its launcher with {bw.SANDBOX_PYTHON}, "
                                               "which is missing (apt-get install -y python3)")
    identity = bw.sandbox_identity()
    name = path.name if _SAFE_BASENAME.fullmatch(path.name) and path.name not in (".", "..") else "scorer"
    passwd, group = bw.passwd_files(identity)
    bpf = build_filter()
    fds = [memfd("scorer", content), memfd("passwd", passwd), memfd("group", group)]
    seccomp_fd = memfd("seccomp", bpf) if bpf is not None else None
    if seccomp_fd is not None:
        fds.append(seccomp_fd)
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    env = {"PATH": bw.SANDBOX_PATH, "HOME": bw.WORK_DIR, "TMPDIR": bw.WORK_DIR, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    command = [bw.SANDBOX_PYTHON, "-I", "-S", "-c", LAUNCHER_SOURCE,
               _launcher_config(limits, env, sandboxed=True), str(status_w), "--",
               f"{bw.SCORER_DIR}/{name}"]
    argv = bw.bwrap_argv(binary, scorer_name=name, scorer_fd=fds[0], passwd_fd=fds[1], group_fd=fds[2],
                         info_fd=info_w, seccomp_fd=seccomp_fd, tmp_bytes=4 * limits.max_file_bytes,
                         command=command)
    who = f"uid {identity.name}" if identity.uid is not None else f"caller uid {identity.name}"
    mechanism = f"bubblewrap ({who}, {'seccomp' if bpf is not None else 'no seccomp'})"
    return Plan(argv=argv, popen_kwargs={**identity.popen_kwargs, "cwd": "/",
                                         "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}},
                pass_fds=[*fds, info_w, status_w], sandboxed=True, mechanism=mechanism,
                info_r=info_r, status_r=status_r, cleanup=[*fds, info_w, status_w],
                sandbox_uid=identity.uid if identity.uid is not None else os.geteuid())


def _plain_plan(path: Path, limits: ScorerLimits, workdir: Path) -> Plan:
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["TMPDIR"] = str(workdir)
    command = [sys.executable or bw.SANDBOX_PYTHON, "-I", "-S", "-c", LAUNCHER_SOURCE,
               _launcher_config(limits, env, sandboxed=False), str(status_w), "--", str(path)]
    return Plan(argv=command, popen_kwargs={"cwd": str(workdir), "env": env}, pass_fds=[status_w],
                sandboxed=False, mechanism="unsandboxed (rlimits only)", status_r=status_r,
                cleanup=[status_w])
