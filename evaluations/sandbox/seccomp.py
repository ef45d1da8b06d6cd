"""A small seccomp deny-list for scorers, as a classic BPF program for `bwrap --seccomp FD`.

Defence in depth on top of the namespaces: it refuses (EPERM) kernel interfaces a scorer has no use
for and that widen the kernel attack surface (io_uring, bpf, userfaultfd, perf events, keyrings,
ptrace, mount and namespace calls, module and kexec loading), answers clone3 with ENOSYS (so libc falls
back to clone, whose flags the namespaces already constrain), and kills a process that uses another
syscall ABI (i386 via int 0x80, x32). Everything else is allowed: it is not a full allow-list.

Pure: standard library only. Supports x86_64 and aarch64; elsewhere `build_filter()` returns None.
"""

from __future__ import annotations

import errno
import platform
import struct

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_OFF_NR, _OFF_ARCH = 0, 4                     # struct seccomp_data
_X32_BIT = 0x40000000

_ARCH = {
    "x86_64": 0xC000003E,                     # AUDIT_ARCH_X86_64
    "aarch64": 0xC00000B7,                    # AUDIT_ARCH_AARCH64
}

# name: (x86_64, aarch64) syscall numbers.
_DENIED = {
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "bpf": (321, 280), "userfaultfd": (323, 282), "perf_event_open": (298, 241),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89),
    "syslog": (103, 116), "quotactl": (179, 60), "fanotify_init": (300, 262),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "adjtimex": (159, 171),
}
_ENOSYS = {"clone3": (435, 435)}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes | None:
    """The BPF program (struct sock_filter[]) for this machine, or None when the arch is unsupported."""
    machine = machine or platform.machine()
    if machine in ("amd64", "x64"):
        machine = "x86_64"
    if machine == "arm64":
        machine = "aarch64"
    if machine not in _ARCH:
        return None
    column = 0 if machine == "x86_64" else 1
    denied = sorted({numbers[column] for numbers in _DENIED.values()})
    enosys = sorted({numbers[column] for numbers in _ENOSYS.values()})
    head = [_insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
            _insn(_JEQ_K, 1, 0, _ARCH[machine]),
            _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
            _insn(_LD_W_ABS, 0, 0, _OFF_NR)]
    if machine == "x86_64":
        # x32 syscalls have bit 30 set: kill (tail: ALLOW, EPERM, ENOSYS, KILL).
        head.append(None)                                        # patched below
    checks = [("eperm", nr) for nr in denied] + [("enosys", nr) for nr in enosys]
    n_head, n_checks = len(head), len(checks)
    allow_at = n_head + n_checks
    eperm_at, enosys_at, kill_at = allow_at + 1, allow_at + 2, allow_at + 3
    program = list(head)
    if machine == "x86_64":
        program[4] = _insn(_JGE_K, kill_at - 5, 0, _X32_BIT)
    for index, (kind, nr) in enumerate(checks, start=n_head):
        target = eperm_at if kind == "eperm" else enosys_at
        offset = target - (index + 1)
        if offset > 255:
            raise AssertionError("seccomp program too long for an 8-bit jump")
        program.append(_insn(_JEQ_K, offset, 0, nr))
    program += [_insn(_RET_K, 0, 0, _RET_ALLOW),
                _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
                _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
                _insn(_RET_K, 0, 0, _RET_KILL_PROCESS)]
    return b"".join(program)


def denied_syscalls() -> list[str]:
    """Names refused with EPERM (for the docs and the mechanism string)."""
    return sorted(_DENIED)
