"""Supervising one scorer process: feed stdin, read stdout/stderr under the caps and the wall clock, then
kill and reap everything the run started.

Sandboxed, bwrap exits only after reaping the pid namespace's init (our launcher), and the kernel empties
a namespace before its init's exit completes, so a run is over once bwrap is. To stop a run early the
init is SIGKILLed first, pinned by a pidfd, and awaited (setsid() escapes nothing). Thread-safe; no
preexec_fn: Popen(user=, group=, extra_groups=[], process_group=0) switches uid in C.

Pure: standard library only; no Django, no torch.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field

from .types import SANDBOX_UNAVAILABLE, SCORER_NOT_EXECUTABLE, ScorerError, ScorerLimits

STDERR_TAIL_BYTES = 8192
KILL_WAIT_S = 10.0


@dataclass
class Plan:
    """How to start one run: the command line and what the supervisor reads besides stdout/stderr."""

    argv: list[str]
    popen_kwargs: dict
    pass_fds: list[int]
    sandboxed: bool
    mechanism: str
    info_r: int | None = None
    sandbox_uid: int = -1
    status_r: int = -1
    cleanup: list[int] = field(default_factory=list)     # our fds to close once the child holds them


@dataclass
class Outcome:
    """What one run left: bwrap's (or the launcher's) exit status, why it was stopped, what it wrote."""

    returncode: int
    reason: str | None            # None, "wall", "output"
    stdout: bytes
    stderr: bytes
    status: bytes
    elapsed_ms: float


def memfd(name: str, content: bytes) -> int:
    """An anonymous in-memory file holding `content`, at offset 0 (for stdin and bwrap's --*-data)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pid keeps the process group reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def supervise(plan: Plan, data: bytes, limits: ScorerLimits) -> Outcome:
    """Start the plan with `data` on stdin, enforce the wall clock and the output cap, end everything."""
    stdin_fd = memfd("payload", data)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(plan.argv, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=plan.pass_fds, process_group=0, close_fds=True,
                                **plan.popen_kwargs)
    except OSError as exc:
        for fd in [stdin_fd, plan.status_r, *plan.cleanup] + ([plan.info_r] if plan.info_r is not None else []):
            os.close(fd)
        code = SANDBOX_UNAVAILABLE if plan.sandboxed else SCORER_NOT_EXECUTABLE
        raise ScorerError(code, f"could not start {plan.argv[0]}: {exc}") from None
    os.close(stdin_fd)
    for fd in plan.cleanup:
        os.close(fd)
    out, err, status, info = bytearray(), bytearray(), bytearray(), bytearray()
    init: _Init | None = None
    announced: tuple[int, int] | None = None
    sel = selectors.DefaultSelector()
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, plan.status_r: status}
    if plan.info_r is not None:
        streams[plan.info_r] = info
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pipes = {proc.stdout.fileno(), proc.stderr.fileno()}
    reason, deadline, exited_at = None, start + limits.wall_seconds, None
    try:
        while reason is None:
            now = time.monotonic()
            if now >= deadline:
                reason = "wall"
                break
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            if exited_at is not None and (not pipes or now - exited_at > 0.5):
                break                                     # done; or a leftover holds the pipes: kill below
            for key, _ in sel.select(min(deadline - now, 0.1)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    pipes.discard(key.fd)
                    continue
                buf = streams[key.fd]
                buf += chunk
                if key.fd == proc.stdout.fileno() and len(buf) > limits.max_output_bytes:
                    reason = "output"
                    break
                if key.fd == proc.stderr.fileno() and len(buf) > 2 * STDERR_TAIL_BYTES:
                    del buf[:-STDERR_TAIL_BYTES]
                if key.fd in (plan.status_r, plan.info_r) and len(buf) > 65536:
                    del buf[65536:]
            if announced is None and info and (announced := _Init.parse(bytes(info))):
                init = _Init.open(*announced, uid=plan.sandbox_uid)
        if announced is None and plan.info_r is not None:   # stopped before the info was read
            try:
                info += os.read(plan.info_r, 65536)
            except OSError:
                pass
            if announced := _Init.parse(bytes(info)):
                init = _Init.open(*announced, uid=plan.sandbox_uid)
        _terminate(proc, init, kill_first=reason is not None)
        for fd in list(streams):                          # drain what is left (the writers are gone)
            while fd != proc.stdout.fileno() or len(out) <= limits.max_output_bytes:
                try:
                    chunk = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                if not chunk:
                    break
                streams[fd] += chunk
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
        os.close(plan.status_r)
        if plan.info_r is not None:
            os.close(plan.info_r)
        if init is not None:
            init.close()
    elapsed_ms = (time.monotonic() - start) * 1000.0
    return Outcome(proc.returncode, reason, bytes(out[:limits.max_output_bytes + 1]),
                   bytes(err[-STDERR_TAIL_BYTES:]), bytes(status), elapsed_ms)


class _Init:
    """The sandbox's pid-namespace init, pinned by a pidfd.

    Its pid comes from bwrap's --info-fd, which only the outer bwrap can write (neither the init nor
    the scorer holds that pipe). Against pid reuse, the process must run as the sandbox uid inside the
    announced pid namespace (not ours) once the pidfd pins it.
    """

    def __init__(self, pidfd: int) -> None:
        self.pidfd = pidfd

    @staticmethod
    def parse(info: bytes) -> tuple[int, int] | None:
        """(pid, pid-namespace inode) from bwrap's info JSON, or None while it is incomplete."""
        try:
            first = json.JSONDecoder().raw_decode(info.decode())[0]
            return int(first["child-pid"]), int(first["pid-namespace"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None

    @classmethod
    def open(cls, pid: int, pidns: int, uid: int) -> _Init | None:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None                                   # already reaped: the namespace is empty
        try:                                              # the pidfd pins the pid: /proc names that process
            same_ns = os.stat(f"/proc/{pid}/ns/pid").st_ino == pidns != _host_pidns()
            with open(f"/proc/{pid}/status") as f:
                uids = next(line.split()[1:] for line in f if line.startswith("Uid:"))
            ours = same_ns and all(int(u) == uid for u in uids)
        except (OSError, ValueError, StopIteration):
            ours = False                                  # exited meanwhile (its namespace is empty), or not ours
        if not ours:
            os.close(pidfd)
            return None
        return cls(pidfd)

    def kill(self) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait_gone(self, timeout: float) -> bool:
        """True once the init has exited, which the kernel allows only after the namespace is empty."""
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.pidfd, selectors.EVENT_READ)
            return bool(sel.select(timeout))
        finally:
            sel.close()

    def close(self) -> None:
        os.close(self.pidfd)


def _host_pidns() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _terminate(proc: subprocess.Popen, init: _Init | None, *, kill_first: bool) -> None:
    """Kill whatever is left of the run and reap it. Afterwards no process of the scorer exists.

    Sandboxed, bwrap exits only after reaping the namespace's init (our launcher), and the kernel empties
    the namespace before the init's exit completes; so a normal run is over once bwrap is. To stop a
    run early, the init is SIGKILLed first (bwrap then reaps it and exits), bwrap's group only after.
    """
    if kill_first and init is not None:
        init.kill()
        _wait_exit(proc.pid, 2.0)
    try:                                                  # proc is not reaped yet: its group id is ours
        os.killpg(proc.pid, signal.SIGKILL)               # bwrap, or the unsandboxed scorer's group
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if init is not None:
        init.kill()
        if not init.wait_gone(KILL_WAIT_S):
            raise ScorerError(SANDBOX_UNAVAILABLE,
                              "the sandbox's processes did not end within "
                              f"{KILL_WAIT_S:.0f} s of SIGKILL; refusing to continue")


def _wait_exit(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not _exited(pid):
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True
