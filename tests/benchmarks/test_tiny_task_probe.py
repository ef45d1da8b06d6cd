"""The tiny-model task probe (benchmarks/tiny_task_probe.py) scores replies the way its docs say."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from tiny_task_probe import last_integer, main  # noqa: E402


def test_open_sums_are_scored_by_the_last_integer_like_the_guides_scorer():
    assert last_integer("Let me add 47 and 13.") == "13"
    assert last_integer("47 + 13 = 60") == "60"
    assert last_integer("It is -4.") == "-4"
    assert last_integer("No number here.") is None


def test_it_prints_both_tasks_with_shares_between_zero_and_one(tiny_model_dir, capsys):
    assert main([str(tiny_model_dir), "--prompts", "6"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["sums", "open"]
    for line in lines:
        greedy, sampled = (float(x) for x in re.findall(r"(?:greedy|T=0\.9) ([0-9.]+)", line))
        assert 0.0 <= greedy <= 1.0 and 0.0 <= sampled <= 1.0 and "(6 held-out prompts)" in line
