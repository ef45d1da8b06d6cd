"""Turning a finished run into a reward or a ScorerError with its stable code and a clear message.

Pure: standard library only; no Django, no torch.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from . import bwrap as bw
from .parse import parse_reward
from .supervise import Outcome, Plan
from .types import (
    SANDBOX_UNAVAILABLE,
    SCORER_CRASHED,
    SCORER_MEMORY_EXCEEDED,
    SCORER_NOT_EXECUTABLE,
    SCORER_OUTPUT_TOO_LARGE,
    SCORER_TIMEOUT,
    ScorerError,
    ScorerLimits,
    ScorerResult,
)

_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "bad_alloc", "out of memory")
_NPROC_MARKERS = ("Resource temporarily unavailable", "BlockingIOError")


def _signal_of(returncode: int, sandboxed: bool) -> int | None:
    if returncode < 0:
        return -returncode
    if sandboxed and 128 < returncode < 128 + 65:        # bwrap reports a signal as 128 + signo
        return returncode - 128
    return None


def _shebang_hint(content: bytes) -> str:
    first = content.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        if content[:4] == b"\x7fELF":
            return " (an ELF binary: it must be built for this machine and link only libraries under /usr)"
        return " (it has no #! line: start it with #!/usr/bin/env python3)"
    interp = first[2:].strip().split(b" ")[0].decode("utf-8", "replace")
    if interp and not interp.startswith(("/usr/", "/bin/", "/sbin/", "/lib")):
        return (f" (its interpreter {interp} is outside /usr, and only /usr is visible inside the sandbox;"
                " use #!/usr/bin/env python3)")
    return f" (its interpreter is {interp}; inside the sandbox PATH is {bw.SANDBOX_PATH})"


def judge(o: Outcome, plan: Plan, path: Path, content: bytes, limits: ScorerLimits) -> ScorerResult:
    """The reward of a finished run, or the ScorerError that says why there is none."""
    stderr_tail = o.stderr.decode("utf-8", "replace")[-4000:]
    raw = o.stdout[:limits.max_output_bytes].decode("utf-8", "replace")
    ctx = dict(stderr_tail=stderr_tail, raw_output=raw, elapsed_ms=o.elapsed_ms, sandboxed=plan.sandboxed,
               mechanism=plan.mechanism)

    def fail(code: str, message: str) -> ScorerError:
        return ScorerError(code, message, **ctx)

    started = o.status.startswith(b"L")
    if b"E" in o.status[:2]:
        try:
            detail = json.loads(o.status[o.status.index(b"E") + 1:].decode())
        except ValueError:
            detail = {"stage": "exec", "error": o.status.decode("utf-8", "replace")}
        if detail.get("stage") == "exec":
            hint = _shebang_hint(content) if plan.sandboxed else ""
            raise fail(SCORER_NOT_EXECUTABLE,
                       f"could not start scorer {path.name}: {detail.get('error')}{hint}")
        raise fail(SANDBOX_UNAVAILABLE, f"could not set the scorer's limits: {detail.get('error')}")
    if o.reason == "output":
        raise fail(SCORER_OUTPUT_TOO_LARGE,
                   f"scorer printed more than {limits.max_output_bytes} bytes on stdout and was killed")
    if o.reason == "wall":
        raise fail(SCORER_TIMEOUT, f"scorer ran longer than the {limits.wall_seconds:g} s wall-clock limit "
                                   "and was killed")
    if not started:
        if plan.sandboxed:
            raise fail(SANDBOX_UNAVAILABLE,
                       f"the bubblewrap sandbox could not be set up (exit {o.returncode}): "
                       f"{stderr_tail.strip()[-600:] or 'no message'} (bubblewrap needs unprivileged user "
                       "namespaces: kernel.unprivileged_userns_clone=1 where that sysctl exists, "
                       "user.max_user_namespaces > 0, and no AppArmor/SELinux rule against them)")
        raise fail(SCORER_CRASHED, f"scorer launcher exited {o.returncode} before starting the scorer")
    if o.returncode == 0:
        try:
            reward = parse_reward(o.stdout)
        except ScorerError as exc:
            raise fail(exc.code, exc.message) from None
        return ScorerResult(reward=reward, raw_output=raw, stderr_tail=stderr_tail, elapsed_ms=o.elapsed_ms,
                            sandboxed=plan.sandboxed, mechanism=plan.mechanism)
    sig = _signal_of(o.returncode, plan.sandboxed)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and o.elapsed_ms / 1000 >= limits.cpu_seconds):
        raise fail(SCORER_TIMEOUT, f"scorer used more than its {limits.cpu_seconds:g} s of CPU time "
                                   "and was killed")
    if any(marker in stderr_tail for marker in _MEMORY_MARKERS):
        raise fail(SCORER_MEMORY_EXCEEDED, f"scorer ran out of memory (limit {limits.memory_bytes >> 20} MiB "
                                           "of address space per process)")
    how = f"exited with status {o.returncode}"
    if sig:
        try:
            how = f"was killed by signal {signal.Signals(sig).name}"
        except ValueError:
            pass
    hint = ""
    if any(marker in stderr_tail for marker in _NPROC_MARKERS) and plan.sandboxed:
        hint = f" (it may have hit the limit of {limits.max_processes} processes)"
    if sig == signal.SIGSYS:
        hint = " (a syscall refused by the sandbox's seccomp filter)"
    last = stderr_tail.strip().splitlines()[-1][:300] if stderr_tail.strip() else ""
    raise fail(SCORER_CRASHED, f"scorer {how}{hint}" + (f": {last}" if last else ""))
