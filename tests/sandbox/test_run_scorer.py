"""run_scorer end to end through the real sandbox: the guide's scorer, output forms, errors, set-up."""

import os
import stat
import tempfile
from pathlib import Path

import pytest

from evaluations.sandbox import ScorerError, ScorerLimits, run_scorer
from evaluations.sandbox import bwrap as bw

# The example from the GRPO guide ("Write a scorer"), verbatim.
SCORE_MATH = """\
#!/usr/bin/env python3
import json
import re
import sys

row = json.load(sys.stdin)
numbers = re.findall(r"-?\\d+", row["content"])
correct = bool(numbers) and int(numbers[-1]) == row["task"]["answer"]
print(1.0 if correct else 0.0)
"""

# Prints payload["out"] verbatim (to drive every output form through the real pipe).
ECHO = """
import json, sys
sys.stdout.write(json.load(sys.stdin)["out"])
"""

FAST = ScorerLimits(cpu_seconds=5, wall_seconds=20)


def _payload(content, answer=42):
    return {"task": {"prompt": "What is 40 + 2?", "answer": answer}, "request": {}, "response": {},
            "content": content, "usage": {}, "adapter": "base", "seed": 7, "latency_ms": 12.5}


def test_guide_score_math_example(tmp_path):
    scorer = tmp_path / "score_math.py"
    scorer.write_text(SCORE_MATH)
    scorer.chmod(0o755)
    right = run_scorer(scorer, _payload("The answer is 42"), limits=FAST)
    wrong = run_scorer(scorer, _payload("I think it is 41"), limits=FAST)
    none = run_scorer("score_math.py", _payload("no digits"), limits=FAST, cwd=tmp_path)   # relative + cwd
    assert (right.reward, wrong.reward, none.reward) == (1.0, 0.0, 0.0)
    assert right.raw_output == "1.0\n" and right.sandboxed is True
    assert right.mechanism.startswith("bubblewrap") and right.elapsed_ms > 0


@pytest.mark.parametrize("out, reward", [
    ("0.75\n", 0.75), ('{"reward": 1}', 1.0), ('{"score": 0.5}\n', 0.5), ('{"value": -2}', -2.0)])
def test_number_and_object_forms(make_scorer, out, reward):
    result = run_scorer(make_scorer(ECHO), {"out": out}, limits=FAST)
    assert result.reward == reward and result.raw_output == out


@pytest.mark.parametrize("out, code", [
    ("", "scorer_output_empty"), ("nan\n", "scorer_output_not_finite"), ('{"reward": Infinity}', "scorer_output_not_finite"),
    ("1\n2\n", "scorer_output_ambiguous"), ('{"reward": 1, "value": 0}', "scorer_output_ambiguous"),
    ("correct!\n", "scorer_output_invalid"), ('{"reward": "high"}', "scorer_output_invalid")])
def test_invalid_outputs_are_refused_with_their_code(make_scorer, out, code):
    with pytest.raises(ScorerError) as info:
        run_scorer(make_scorer(ECHO), {"out": out}, limits=FAST)
    assert info.value.code == code
    assert info.value.raw_output == out and info.value.sandboxed is True


def test_crash_is_reported_with_stderr(make_scorer):
    scorer = make_scorer("""
        import sys
        print("0.5")
        sys.stderr.write("boom: the reference answer is missing\\n")
        sys.exit(3)
    """)
    with pytest.raises(ScorerError) as info:
        run_scorer(scorer, {}, limits=FAST)
    err = info.value
    assert err.code == "scorer_crashed"
    assert "exited with status 3" in err.message and "boom" in err.message
    assert "reference answer is missing" in err.stderr_tail


def test_exception_traceback_is_a_crash(make_scorer):
    with pytest.raises(ScorerError) as info:
        run_scorer(make_scorer("import json, sys\nrow = json.load(sys.stdin)\nprint(row['missing'])\n"), {},
                   limits=FAST)
    assert info.value.code == "scorer_crashed" and "KeyError" in info.value.stderr_tail


def test_not_executable_missing_and_bad_interpreter(make_scorer, tmp_path):
    plain = make_scorer("print(1)")
    plain.chmod(0o644)
    with pytest.raises(ScorerError) as info:
        run_scorer(plain, {}, limits=FAST)
    assert info.value.code == "scorer_not_executable" and "chmod +x" in info.value.message

    with pytest.raises(ScorerError) as info:
        run_scorer(tmp_path / "nope.py", {}, limits=FAST)
    assert info.value.code == "scorer_not_executable" and "does not exist" in info.value.message

    with pytest.raises(ScorerError) as info:
        run_scorer(tmp_path, {}, limits=FAST)
    assert info.value.code == "scorer_not_executable"

    # An interpreter outside /usr (e.g. pyenv under /root) does not exist inside the sandbox.
    pyenv = make_scorer("print(1)", shebang="#!/root/.pyenv/versions/3.11.7/bin/python3")
    with pytest.raises(ScorerError) as info:
        run_scorer(pyenv, {}, limits=FAST)
    assert info.value.code == "scorer_not_executable"
    assert "/root/.pyenv" in info.value.message and "#!/usr/bin/env python3" in info.value.message

    no_shebang = make_scorer("print(1)", shebang="")
    with pytest.raises(ScorerError) as info:
        run_scorer(no_shebang, {}, limits=FAST)
    assert info.value.code == "scorer_not_executable"


def test_unsandboxed_runs_with_plain_limits(make_scorer):
    result = run_scorer(make_scorer(ECHO), {"out": "0.25"}, limits=FAST, unsandboxed=True)
    assert result.reward == 0.25 and result.sandboxed is False and result.mechanism.startswith("unsandboxed")
    with pytest.raises(ScorerError) as info:
        run_scorer(make_scorer("while True:\n    pass\n"), {}, unsandboxed=True,
                   limits=ScorerLimits(cpu_seconds=1, wall_seconds=20))
    assert info.value.code == "scorer_timeout" and info.value.sandboxed is False


def test_payload_must_be_a_json_object(make_scorer):
    with pytest.raises(TypeError):
        run_scorer(make_scorer(ECHO), ["not", "a", "dict"])


def test_sandbox_unavailable_without_bubblewrap(make_scorer, monkeypatch):
    monkeypatch.setattr(bw.shutil, "which", lambda *a, **k: None)
    with pytest.raises(ScorerError) as info:
        run_scorer(make_scorer(ECHO), {"out": "1"}, limits=FAST)
    assert info.value.code == "sandbox_unavailable"
    assert "apt-get install -y --no-install-recommends bubblewrap" in info.value.message


def test_sandbox_unavailable_when_bwrap_cannot_set_up(make_scorer, monkeypatch):
    # A stand-in bwrap that fails the way a kernel without unprivileged user namespaces makes it fail.
    with tempfile.TemporaryDirectory(prefix="kiln-fake-bwrap-") as directory:
        os.chmod(directory, 0o755)
        fake = Path(directory) / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IROTH)
        monkeypatch.setattr(bw, "find_bwrap", lambda: str(fake))
        with pytest.raises(ScorerError) as info:
            run_scorer(make_scorer(ECHO), {"out": "1"}, limits=FAST)
    assert info.value.code == "sandbox_unavailable"
    assert "No permissions to create new namespace" in info.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="the dedicated uid is used when the caller is root")
def test_runs_as_the_dedicated_unprivileged_user(make_scorer):
    result = run_scorer(make_scorer("""
        import os, json
        print(json.dumps({"reward": os.getuid()}))
    """), {}, limits=FAST)
    assert result.reward > 0 and "kiln-sandbox" in result.mechanism


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/sbin/useradd"),
                    reason="creating the sandbox user needs root and useradd")
def test_the_sandbox_user_is_created_when_missing(make_scorer, monkeypatch):
    import pwd
    import subprocess
    import uuid

    name = f"kiln-sbx-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(bw.SANDBOX_USER_ENV, name)
    try:
        result = run_scorer(make_scorer("import os\nprint(os.getuid())\n"), {}, limits=FAST)
        entry = pwd.getpwnam(name)
        assert result.reward == entry.pw_uid and entry.pw_uid != 0 and name in result.mechanism
        assert entry.pw_shell.endswith("nologin")
    finally:
        subprocess.run(["userdel", name], capture_output=True)
