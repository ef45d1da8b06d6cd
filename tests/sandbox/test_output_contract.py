"""The scorer output contract, parsed alone: one finite number, or {reward|score|value}; all else refused."""

import subprocess
import sys
from pathlib import Path

import pytest

from evaluations.sandbox import ERROR_CODES, ScorerError, ScorerLimits, parse_reward


@pytest.mark.parametrize("text, reward", [
    ("1", 1.0), ("0.0\n", 0.0), ("  -0.5  \n", -0.5), ("1e-3", 0.001), ("+2", 2.0), (".5", 0.5),
    ('{"reward": 1}', 1.0), ('{"score": 0.25}', 0.25), ('{"value": -1.5}', -1.5),
    ('{"reward": 0.5, "detail": "ok", "n": 3}', 0.5), ('\n{"score": 1}\n', 1.0),
])
def test_accepted_outputs(text, reward):
    assert parse_reward(text.encode()) == reward


@pytest.mark.parametrize("text, code", [
    ("", "scorer_output_empty"),
    ("  \n\t\n", "scorer_output_empty"),
    ("nan", "scorer_output_not_finite"),
    ("NaN", "scorer_output_not_finite"),
    ("inf", "scorer_output_not_finite"),
    ("-Infinity", "scorer_output_not_finite"),
    ("1e999", "scorer_output_not_finite"),
    ('{"reward": NaN}', "scorer_output_not_finite"),
    ('{"score": Infinity}', "scorer_output_not_finite"),
    ("1 2", "scorer_output_ambiguous"),
    ("1.0\n0.0\n", "scorer_output_ambiguous"),
    ('{"reward": 1}\n{"reward": 0}', "scorer_output_ambiguous"),
    ('{"reward": 1, "score": 1}', "scorer_output_ambiguous"),
    ("abc", "scorer_output_invalid"),
    ("debug: thinking\n1.0", "scorer_output_invalid"),
    ('"1.0"', "scorer_output_invalid"),
    ("true", "scorer_output_invalid"),
    ("True", "scorer_output_invalid"),
    ("null", "scorer_output_invalid"),
    ("[1]", "scorer_output_invalid"),
    ('{"reward": "1"}', "scorer_output_invalid"),
    ('{"reward": true}', "scorer_output_invalid"),
    ('{"reward": null}', "scorer_output_invalid"),
    ('{"result": 1}', "scorer_output_invalid"),
    ("{not json", "scorer_output_invalid"),
])
def test_refused_outputs(text, code):
    with pytest.raises(ScorerError) as info:
        parse_reward(text.encode())
    assert info.value.code == code
    assert info.value.message and str(info.value) == info.value.message


def test_non_utf8_output_is_invalid():
    with pytest.raises(ScorerError) as info:
        parse_reward(b"\xff\xfe1")
    assert info.value.code == "scorer_output_invalid"


def test_error_codes_are_the_documented_set():
    assert ERROR_CODES == {
        "scorer_timeout", "scorer_crashed", "scorer_output_invalid", "scorer_output_empty",
        "scorer_output_not_finite", "scorer_output_ambiguous", "scorer_output_too_large",
        "scorer_memory_exceeded", "scorer_not_executable", "sandbox_unavailable"}
    with pytest.raises(ValueError):
        ScorerError("made_up", "x")


def test_limits_defaults_and_validation():
    limits = ScorerLimits()
    assert (limits.cpu_seconds, limits.wall_seconds, limits.memory_bytes, limits.max_processes,
            limits.max_output_bytes, limits.max_file_bytes) == (10, 30, 512 << 20, 32, 1 << 20, 16 << 20)
    for bad in ({"cpu_seconds": 0}, {"wall_seconds": -1}, {"wall_seconds": float("inf")},
                {"memory_bytes": 1024}, {"max_processes": 1}, {"max_output_bytes": 0}, {"max_file_bytes": 1.5},
                {"cpu_seconds": True}):
        with pytest.raises(ValueError):
            ScorerLimits(**bad)


def test_the_package_is_pure():
    """evaluations.sandbox imports no Django, no torch, no gpu_runtime (checked in a fresh interpreter)."""
    code = ("import sys, evaluations.sandbox; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'ninja', 'torch', 'gpu_runtime')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PATH": "/usr/bin:/bin"},
                   cwd=Path(__file__).resolve().parents[2])
