"""Exec'd launcher: sets the resource limits, then execs the scorer. Never imported by Kiln.

runner.py passes this file's text to `python3 -I -S -c` (inside the sandbox: Debian's /usr/bin/python3),
so it must stay standard library only and self-contained. Usage:

    python3 -I -S -c SOURCE '{"cpu": 10, ..., "init": true}' STATUS_FD -- /path/to/scorer

It writes b"L" on STATUS_FD when it starts, and b"E<json>" if the limits or the exec fail (exit 127).
STATUS_FD is close-on-exec, so the scorer never holds it.

With "init": true (the sandbox: bwrap --as-pid-1) the launcher is the pid namespace's init: it makes
itself non-dumpable (the scorer, same uid, cannot open its /proc/1/mem), forks the scorer with the
limits (set after the user namespace exists, so RLIMIT_NPROC counts this sandbox only), reaps every
orphan, and exits with the scorer's status (128+signal when killed) as soon as the scorer exits. The
kernel then kills everything left in the namespace before bwrap sees the init exit.
"""

import json
import os
import resource
import signal
import sys


def limit_and_exec(config, status, argv):
    stage = "limits"
    try:
        cpu = int(config["cpu"])
        limits = [
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),                 # SIGXCPU, then SIGKILL a second later
            (resource.RLIMIT_AS, (config["memory"], config["memory"])),
            (resource.RLIMIT_FSIZE, (config["fsize"], config["fsize"])),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_NOFILE, (config["nofile"], config["nofile"])),
        ]
        if config.get("nproc"):
            limits.append((resource.RLIMIT_NPROC, (config["nproc"], config["nproc"])))
        for which, value in limits:
            resource.setrlimit(which, value)
        if config.get("nice"):
            os.setpriority(os.PRIO_PROCESS, 0, int(config["nice"]))
        for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):          # CPython ignores these; the scorer should not
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        os.set_inheritable(status, False)
        stage = "exec"
        os.execve(argv[0], argv, config["env"])
    except OSError as exc:
        report = {"stage": stage, "errno": exc.errno, "error": exc.strerror or str(exc)}
    except BaseException as exc:  # noqa: BLE001 - report anything, never run the scorer half-limited
        report = {"stage": stage, "errno": None, "error": repr(exc)}
    try:
        os.write(status, b"E" + json.dumps(report).encode())
    finally:
        os._exit(127)


def be_init(config, status, argv):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:                         # PR_SET_DUMPABLE, 0
        os.write(status, b"E" + json.dumps({"stage": "limits", "errno": ctypes.get_errno(),
                                            "error": "prctl(PR_SET_DUMPABLE) failed"}).encode())
        os._exit(127)
    signal.signal(signal.SIGINT, signal.SIG_DFL)              # pid 1: signals from inside are then ignored
    child = os.fork()
    if child == 0:
        limit_and_exec(config, status, argv)
    os.close(status)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):                                       # only the scorer holds the run's pipes
        os.dup2(null, fd)
    code = 125
    while True:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(wait_status)
            break
    os._exit(code if code >= 0 else 128 - code)


def main():
    config = json.loads(sys.argv[1])
    status = int(sys.argv[2])
    argv = sys.argv[sys.argv.index("--") + 1:]
    os.write(status, b"L")
    if config.get("init"):
        be_init(config, status, argv)
    limit_and_exec(config, status, argv)


main()
