"""bubblewrap set-up: the dedicated unprivileged uid, and the bwrap command line of one sandbox.

Why this shape (see docs/scorer-sandbox.md): bwrap started as root keeps every capability inside the
sandbox, so a root parent starts it as the unprivileged `kiln-sandbox` uid (created here when missing);
a non-root parent starts it as itself. The view holds only /usr, a few files of /etc, a private /proc
(pid namespace), a minimal /dev, a size-capped private /tmp (the cwd) and the scorer, copied in read-only.
Nothing of the host's /run, /var, /tmp, /home, /root or the project is mounted, so host unix sockets
(Redis, PostgreSQL, KILN_HOME) do not exist inside; all namespaces are unshared (network included).

Pure: standard library only.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

from .types import SANDBOX_UNAVAILABLE, ScorerError

SANDBOX_USER_ENV = "KILN_SANDBOX_USER"
DEFAULT_SANDBOX_USER = "kiln-sandbox"
SANDBOX_PYTHON = "/usr/bin/python3"          # Debian's; /root (pyenv) is unreadable to the sandbox uid
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
SCORER_DIR = "/sandbox"                        # read-only; holds the scorer copy
WORK_DIR = "/tmp"                              # private tmpfs, the scorer's cwd
INSTALL_HINT = "install it with: apt-get install -y --no-install-recommends bubblewrap"

# Host files a scorer may need (dynamic linker, locale, time zone, Debian's python sitecustomize).
_ETC_RO = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
           "/etc/localtime", "/etc/nsswitch.conf", "/etc/ssl/openssl.cnf", "/etc/ssl/certs", "/etc/mime.types")
_user_lock = threading.Lock()
_SAFE_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


@dataclass(frozen=True)
class Identity:
    """Whom bwrap runs as: a uid/gid to switch to (root parent), or None (run as the caller)."""

    uid: int | None
    gid: int | None
    name: str

    @property
    def popen_kwargs(self) -> dict:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def find_bwrap() -> str:
    path = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
    if not path:
        raise ScorerError(SANDBOX_UNAVAILABLE,
                          f"the scorer sandbox needs bubblewrap (bwrap), which is not installed; {INSTALL_HINT} "
                          "(or run the scorer unsandboxed, which the CLI allows only with an explicit flag)")
    return path


def _create_user(name: str) -> None:
    useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not useradd:
        raise ScorerError(SANDBOX_UNAVAILABLE,
                          f"the sandbox user {name!r} does not exist and useradd is not available; create it "
                          f"with: useradd --system --no-create-home --shell /usr/sbin/nologin {name}")
    proc = subprocess.run(
        [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", "--comment", "Kiln scorer sandbox", name],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if proc.returncode not in (0, 9) and not _user_exists(name):   # 9: exists (a racing creator)
        raise ScorerError(SANDBOX_UNAVAILABLE,
                          f"could not create the sandbox user {name!r}: useradd exited {proc.returncode}: "
                          f"{proc.stderr.strip()[-500:]}")


def sandbox_identity() -> Identity:
    """The uid bwrap runs as. As root: the dedicated user (created when missing). Otherwise: the caller."""
    if os.geteuid() != 0:
        return Identity(None, None, pwd.getpwuid(os.geteuid()).pw_name if _has_pw(os.geteuid())
                        else str(os.geteuid()))
    name = os.environ.get(SANDBOX_USER_ENV) or DEFAULT_SANDBOX_USER
    with _user_lock:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            _create_user(name)
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                raise ScorerError(SANDBOX_UNAVAILABLE,
                                  f"the sandbox user {name!r} was created but cannot be looked up") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ScorerError(SANDBOX_UNAVAILABLE,
                          f"the sandbox user {name!r} has uid/gid 0; it must be an unprivileged user")
    return Identity(entry.pw_uid, entry.pw_gid, name)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _has_pw(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def passwd_files(identity: Identity) -> tuple[bytes, bytes]:
    """Minimal /etc/passwd and /etc/group for inside (the host's user list stays hidden)."""
    uid = identity.uid if identity.uid is not None else os.geteuid()
    gid = identity.gid if identity.gid is not None else os.getegid()
    name = identity.name if _SAFE_NAME.fullmatch(identity.name) else "scorer"
    passwd = (f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
              f"{name}:x:{uid}:{gid}:Kiln scorer:{WORK_DIR}:/usr/sbin/nologin\n"
              f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    group = f"root:x:0:\n{name}:x:{gid}:\nnogroup:x:65534:\n"
    return passwd.encode(), group.encode()


def bwrap_argv(bwrap: str, *, scorer_name: str, scorer_fd: int, passwd_fd: int, group_fd: int,
               info_fd: int, seccomp_fd: int | None, tmp_bytes: int, command: list[str]) -> list[str]:
    """The bwrap command line: all namespaces, no capabilities, read-only root, private /tmp."""
    argv = [bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns",     # net, pid, ipc, uts, cgroup, user
            "--as-pid-1",                                             # our launcher is the init
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "kiln-sandbox",
            "--clearenv",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--symlink", "usr/lib", "/lib"]
    for extra in ("lib64", "lib32", "libx32"):
        if os.path.islink(f"/{extra}"):
            argv += ["--symlink", f"usr/{extra}", f"/{extra}"]
        elif os.path.isdir(f"/{extra}"):
            argv += ["--ro-bind", f"/{extra}", f"/{extra}"]
    for path in (*_ETC_RO, *sorted(glob.glob("/etc/python3*"))):
        argv += ["--ro-bind-try", path, path]
    argv += ["--ro-bind-data", str(passwd_fd), "/etc/passwd",
             "--ro-bind-data", str(group_fd), "/etc/group",
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", WORK_DIR,
             "--dir", "/var", "--symlink", "../tmp", "/var/tmp",
             "--dir", SCORER_DIR,
             "--perms", "0555", "--ro-bind-data", str(scorer_fd), f"{SCORER_DIR}/{scorer_name}",
             "--remount-ro", "/",
             "--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--chdir", WORK_DIR, "--", *command]
