"""Hostile scorers: each one is contained and reported, and the machine and the test run survive.

Every hostile script is itself bounded (loops end, sleepers sleep 120 s at most) so that a sandbox bug
cannot take the machine down; the assertions check that the sandbox, not that bound, stopped it.
"""

import json
import os
import socket
import threading
import time
import uuid

import pytest

from evaluations.sandbox import ScorerError, ScorerLimits, run_scorer
from tests.sandbox.conftest import processes_with

pytestmark = pytest.mark.timeout(120)


def _code(exc_info) -> str:
    return exc_info.value.code


def test_infinite_loop_hits_the_cpu_limit(make_scorer):
    scorer = make_scorer("""
        import time
        end = time.time() + 60
        while time.time() < end:
            pass
        print(1)
    """)
    started = time.monotonic()
    with pytest.raises(ScorerError) as info:
        run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=1, wall_seconds=30))
    assert _code(info) == "scorer_timeout" and "CPU time" in info.value.message
    assert time.monotonic() - started < 20


def test_sleeper_hits_the_wall_clock(make_scorer, marker):
    scorer = make_scorer(f"""
        import time
        time.sleep(120)  # {marker}
    """, name=f"{marker}.py")
    started = time.monotonic()
    with pytest.raises(ScorerError) as info:
        run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=5, wall_seconds=1.5))
    elapsed = time.monotonic() - started
    assert _code(info) == "scorer_timeout" and "wall-clock" in info.value.message
    assert 1.4 < elapsed < 10
    assert processes_with(marker) == []


FORK_BOMB = """
    import json, os, sys, time
    made, errors = 0, []
    for _ in range(400):                 # bounded: a sandbox bug must not take the machine down
        try:
            pid = os.fork()
        except OSError as exc:
            errors.append(exc.errno)
            if len(errors) > 20:
                break
            continue
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        made += 1
    sys.stderr.write(f"forked {made}, failures {len(errors)} errno {sorted(set(errors))}\\n")
    print(json.dumps({"reward": made}))
"""


def test_fork_bomb_is_bounded_and_everything_is_killed(make_scorer, marker):
    scorer = make_scorer(FORK_BOMB, name=f"{marker}.py")
    limits = ScorerLimits(cpu_seconds=5, wall_seconds=20, max_processes=16)
    result = run_scorer(scorer, {}, limits=limits)
    assert 1 <= result.reward < limits.max_processes               # the kernel refused the rest
    assert "errno [11]" in result.stderr_tail                      # EAGAIN from RLIMIT_NPROC
    assert processes_with(marker) == []                            # all 15 sleepers are gone


def test_a_fork_bomb_does_not_starve_a_concurrent_scorer(make_scorer, marker):
    """RLIMIT_NPROC is set inside each sandbox's user namespace, so it counts that sandbox only."""
    bomb = make_scorer(FORK_BOMB.replace("time.sleep(120)", "time.sleep(3)"), name=f"{marker}.py")
    good = make_scorer("""
        import os
        pid = os.fork()                                         # it can still fork under its own limit
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print(0.5)
    """)
    limits = ScorerLimits(cpu_seconds=5, wall_seconds=20, max_processes=8)
    results = {}

    def run_bomb():
        try:
            results["bomb"] = run_scorer(bomb, {}, limits=limits)
        except ScorerError as exc:  # pragma: no cover - reported by the assertion below
            results["bomb"] = exc

    thread = threading.Thread(target=run_bomb)
    thread.start()
    time.sleep(0.3)
    try:
        results["good"] = run_scorer(good, {}, limits=limits)
    finally:
        thread.join(60)
    assert results["good"].reward == 0.5
    assert not isinstance(results["bomb"], ScorerError) and results["bomb"].reward < limits.max_processes
    assert processes_with(marker) == []


def test_memory_hog_hits_the_memory_limit(make_scorer):
    scorer = make_scorer("""
        import sys
        chunks = []
        for i in range(64):                  # up to 4 GiB in 64 MiB steps
            chunks.append(bytearray(64 << 20))
            sys.stderr.write(f"{len(chunks) * 64} MiB\\n")
        print(1)
    """)
    with pytest.raises(ScorerError) as info:
        run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=10, wall_seconds=30, memory_bytes=256 << 20))
    assert _code(info) == "scorer_memory_exceeded" and "256 MiB" in info.value.message
    assert "MemoryError" in info.value.stderr_tail and "4096 MiB" not in info.value.stderr_tail


def test_no_network_and_no_host_sockets(make_scorer, tmp_path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    # A unix socket in a world-accessible directory (like Redis's under KILN_HOME or /run/postgresql).
    sock_dir = tmp_path / "sockets"
    sock_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(sock_dir, 0o777)
    unix_path = str(sock_dir / "redis.sock")
    unix_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_listener.bind(unix_path)
    os.chmod(unix_path, 0o777)
    unix_listener.listen(8)
    unix_listener.setblocking(False)
    abstract = f"\0kiln-sandbox-test-{uuid.uuid4().hex}"
    abstract_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_listener.bind(abstract)
    abstract_listener.listen(8)
    abstract_listener.setblocking(False)
    scorer = make_scorer("""
        import json, os, socket, sys
        args = json.load(sys.stdin)
        report = {}
        def attempt(name, family, address):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(3)
            try:
                s.connect(address)
                report[name] = "connected"
            except OSError as exc:
                report[name] = f"{type(exc).__name__}: {exc}"
            finally:
                s.close()
        attempt("tcp", socket.AF_INET, ("127.0.0.1", args["port"]))
        attempt("unix", socket.AF_UNIX, args["unix"])
        attempt("abstract", socket.AF_UNIX, args["abstract"])
        try:
            socket.getaddrinfo("pypi.org", 443)
            report["dns"] = "resolved"
        except OSError as exc:
            report["dns"] = f"{type(exc).__name__}: {exc}"
        report["run"] = sorted(os.listdir("/run")) if os.path.isdir("/run") else None
        report["var_run"] = os.path.exists("/var/run")
        sys.stderr.write(json.dumps(report) + "\\n")
        print(json.dumps({"reward": 0 if "connected" in report.values() else 1, "report": report}))
    """)
    try:
        result = run_scorer(scorer, {"port": port, "unix": unix_path, "abstract": abstract},
                            limits=ScorerLimits(cpu_seconds=5, wall_seconds=20))
        for sock in (listener, unix_listener, abstract_listener):
            with pytest.raises(BlockingIOError):
                sock.accept()                                   # nothing ever reached the host
    finally:
        for sock in (listener, unix_listener, abstract_listener):
            sock.close()
    report = json.loads(result.raw_output)["report"]
    assert result.reward == 1, report
    assert "ConnectionRefusedError" in report["tcp"]
    assert "FileNotFoundError" in report["unix"]                 # the host's socket file is not there
    assert "ConnectionRefusedError" in report["abstract"]
    assert report["dns"] != "resolved"
    assert report["run"] is None and report["var_run"] is False


def test_writes_outside_its_directory_never_reach_the_host(make_scorer, tmp_path, marker):
    target_dir = tmp_path / "host-visible"
    target_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(target_dir, 0o777)                                 # only the sandbox can stop the write
    targets = [str(target_dir / "escaped.txt"), f"/etc/{marker}", f"/tmp/{marker}", f"/dev/shm/{marker}",
               f"/var/tmp/{marker}", f"/usr/{marker}", f"/sandbox/{marker}"]
    scorer = make_scorer("""
        import json, os, sys
        report = {}
        for path in json.load(sys.stdin)["targets"]:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write("escaped")
                report[path] = "written"
            except OSError as exc:
                report[path] = f"{type(exc).__name__}: {exc.strerror}"
        with open("own.txt", "w") as f:                       # its private cwd works
            f.write("ok")
        report["cwd"] = os.getcwd()
        report["own"] = open("own.txt").read()
        print(json.dumps({"reward": 1, "report": report}))
    """)
    result = run_scorer(scorer, {"targets": targets}, limits=ScorerLimits(cpu_seconds=5, wall_seconds=20))
    report = json.loads(result.raw_output)["report"]
    assert report["own"] == "ok"
    for path in targets:
        assert not os.path.exists(path), (path, report[path])
    assert "Read-only file system" in report[f"/etc/{marker}"]
    assert "Read-only file system" in report[f"/usr/{marker}"]


def test_host_secrets_and_project_are_not_visible(make_scorer):
    scorer = make_scorer("""
        import json, os
        paths = ["/etc/shadow", "/root", "/home", "/work", "/var/lib", "/run", "/proc/1/environ"]
        report = {p: os.path.exists(p) for p in paths}
        report["uid"] = os.getuid()
        report["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        try:
            open("/proc/1/environ").read()
            report["init_environ"] = "read"
        except OSError as exc:
            report["init_environ"] = exc.strerror
        report["passwd"] = open("/etc/passwd").read().count("\\n")
        report["env"] = sorted(os.environ)
        print(json.dumps({"reward": 1, "report": report}))
    """)
    os.environ["KILN_SANDBOX_TEST_SECRET"] = "hunter2"
    try:
        report = json.loads(run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=5, wall_seconds=20))
                            .raw_output)["report"]
    finally:
        del os.environ["KILN_SANDBOX_TEST_SECRET"]
    for path in ("/etc/shadow", "/root", "/home", "/work", "/var/lib", "/run"):
        assert report[path] is False, path
    assert report["uid"] != 0
    assert max(report["pids"]) < 10                              # a private pid namespace
    assert report["passwd"] <= 3                                 # not the host's user list
    assert report["init_environ"] == "Permission denied"         # the launcher (pid 1) is not dumpable
    assert set(report["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_CTYPE", "PYTHONDONTWRITEBYTECODE"}


def test_disk_use_is_bounded(make_scorer):
    scorer = make_scorer("""
        import json
        report = {}
        try:
            with open("big.bin", "wb") as f:                   # one file over max_file_bytes
                f.write(b"x" * (3 << 20))
            report["big"] = "written"
        except OSError as exc:
            report["big"] = exc.strerror
        written = 0
        try:                                                   # many files: the private /tmp fills up
            for i in range(40):
                with open(f"part{i}.bin", "wb") as f:
                    f.write(b"x" * (1 << 20))
                written += 1
        except OSError as exc:
            report["parts"] = exc.strerror
        report["written"] = written
        print(json.dumps({"reward": 1, "report": report}))
    """)
    limits = ScorerLimits(cpu_seconds=5, wall_seconds=20, max_file_bytes=2 << 20)
    report = json.loads(run_scorer(scorer, {}, limits=limits).raw_output)["report"]
    assert report["big"] == "File too large"
    assert report["parts"] == "No space left on device" and report["written"] < 8


def test_print_10_mb_hits_the_output_cap(make_scorer):
    scorer = make_scorer("""
        import sys
        sys.stdout.write("1" * (10 << 20))
    """)
    started = time.monotonic()
    with pytest.raises(ScorerError) as info:
        run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=5, wall_seconds=20, max_output_bytes=1 << 20))
    assert _code(info) == "scorer_output_too_large"
    assert len(info.value.raw_output) == 1 << 20
    assert time.monotonic() - started < 10


def test_setsid_sleeper_does_not_survive(make_scorer, marker):
    scorer = make_scorer(f"""
        import os, sys
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:                                  # detached, holding no pipe of ours
                fd = os.open("/dev/null", os.O_RDWR)
                for n in (0, 1, 2):
                    os.dup2(fd, n)
                os.execv("/usr/bin/python3", ["python3", "-c", "import time; time.sleep(120)", "{marker}"])
            os._exit(0)
        if os.fork() == 0:                                      # another one that keeps stdout open
            os.setsid()
            os.execv("/usr/bin/python3", ["python3", "-c", "import time; time.sleep(120)", "{marker}"])
        import time
        deadline = time.time() + 5
        while len([p for p in os.listdir("/proc") if p.isdigit()]) < 5 and time.time() < deadline:
            time.sleep(0.02)                                    # let both sleepers start
        print(1.0)
    """)
    started = time.monotonic()
    result = run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=5, wall_seconds=20))
    assert result.reward == 1.0
    assert time.monotonic() - started < 10                       # not held until the wall clock
    assert processes_with(marker) == []                          # checked at once, no grace period


def test_seccomp_refuses_kernel_interfaces_a_scorer_never_needs(make_scorer):
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter covers x86_64 and aarch64")
    scorer = make_scorer("""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        report = {}
        params = ctypes.create_string_buffer(120)
        report["io_uring_setup"] = (libc.syscall(425, 8, params), ctypes.get_errno())
        report["unshare_user"] = (libc.unshare(0x10000000), ctypes.get_errno())
        report["clone3"] = (libc.syscall(435, None, 0), ctypes.get_errno())
        print(json.dumps({"reward": 1, "report": report}))
    """)
    report = json.loads(run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=5, wall_seconds=20))
                        .raw_output)["report"]
    assert report["io_uring_setup"] == [-1, 1]                   # EPERM
    assert report["unshare_user"][0] == -1
    assert report["clone3"] == [-1, 38]                          # ENOSYS: libc falls back to clone


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 is an x86_64 ABI")
def test_seccomp_kills_another_syscall_abi(make_scorer):
    scorer = make_scorer("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.syscall(0x40000000 | 39)                           # getpid through the x32 ABI
        print(1)
    """)
    with pytest.raises(ScorerError) as info:
        run_scorer(scorer, {}, limits=ScorerLimits(cpu_seconds=5, wall_seconds=20))
    assert _code(info) == "scorer_crashed" and "SIGSYS" in info.value.message
