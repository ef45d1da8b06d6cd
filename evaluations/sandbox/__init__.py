"""Run untrusted scorer executables in a sandbox and read their reward (pure: no Django, no torch).

    from evaluations.sandbox import run_scorer, ScorerError, ScorerLimits, ScorerResult
    result = run_scorer("./score_math.py", payload, limits=ScorerLimits(), unsandboxed=False, cwd=None)

See docs/scorer-sandbox.md for what the sandbox guarantees and what it does not.
"""

from .parse import parse_reward
from .runner import run_scorer
from .types import ERROR_CODES, ScorerError, ScorerLimits, ScorerResult

__all__ = ["ERROR_CODES", "ScorerError", "ScorerLimits", "ScorerResult", "parse_reward", "run_scorer"]
