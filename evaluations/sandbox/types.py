"""Value types of the scorer sandbox: limits, the result of one run, and the error with a stable code.

Pure: imports only the standard library (no Django, no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MiB = 1 << 20

# Stable error codes (callers, summaries and the API rely on these strings).
SCORER_TIMEOUT = "scorer_timeout"
SCORER_CRASHED = "scorer_crashed"
SCORER_OUTPUT_INVALID = "scorer_output_invalid"
SCORER_OUTPUT_EMPTY = "scorer_output_empty"
SCORER_OUTPUT_NOT_FINITE = "scorer_output_not_finite"
SCORER_OUTPUT_AMBIGUOUS = "scorer_output_ambiguous"
SCORER_OUTPUT_TOO_LARGE = "scorer_output_too_large"
SCORER_MEMORY_EXCEEDED = "scorer_memory_exceeded"
SCORER_NOT_EXECUTABLE = "scorer_not_executable"
SANDBOX_UNAVAILABLE = "sandbox_unavailable"

ERROR_CODES = frozenset({
    SCORER_TIMEOUT, SCORER_CRASHED, SCORER_OUTPUT_INVALID, SCORER_OUTPUT_EMPTY, SCORER_OUTPUT_NOT_FINITE,
    SCORER_OUTPUT_AMBIGUOUS, SCORER_OUTPUT_TOO_LARGE, SCORER_MEMORY_EXCEEDED, SCORER_NOT_EXECUTABLE,
    SANDBOX_UNAVAILABLE,
})


@dataclass(frozen=True)
class ScorerLimits:
    """Bounds for one scorer run.

    cpu_seconds: CPU time per process (RLIMIT_CPU; SIGXCPU, then SIGKILL one second later).
    wall_seconds: wall-clock time for the whole run, then everything is killed.
    memory_bytes: address space per process (RLIMIT_AS).
    max_processes: processes and threads alive at once inside one sandbox (RLIMIT_NPROC).
    max_output_bytes: stdout kept; more than this kills the run (scorer_output_too_large).
    max_file_bytes: largest file the scorer may write (RLIMIT_FSIZE); its private /tmp holds at most
        four times this.
    """

    cpu_seconds: float = 10
    wall_seconds: float = 30
    memory_bytes: int = 512 * MiB
    max_processes: int = 32
    max_output_bytes: int = 1 * MiB
    max_file_bytes: int = 16 * MiB

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"ScorerLimits.{name} must be a positive number of seconds, got {value!r}")
        for name in ("memory_bytes", "max_processes", "max_output_bytes", "max_file_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ScorerLimits.{name} must be a positive integer, got {value!r}")
        if self.memory_bytes < 16 * MiB:
            raise ValueError("ScorerLimits.memory_bytes must be at least 16 MiB (an interpreter needs that)")
        if self.max_processes < 2:
            raise ValueError("ScorerLimits.max_processes must be at least 2")


@dataclass(frozen=True)
class ScorerResult:
    """A successful run: the reward and what was observed."""

    reward: float
    raw_output: str          # stdout, at most max_output_bytes, decoded as UTF-8 (invalid bytes replaced)
    stderr_tail: str         # the last few KiB of stderr
    elapsed_ms: float        # wall time of the whole run, sandbox start-up included
    sandboxed: bool
    mechanism: str           # e.g. "bubblewrap (uid kiln-sandbox), seccomp" or "unsandboxed (rlimits only)"


class ScorerError(Exception):
    """A scorer run that produced no reward. `code` is stable; `message` says what happened.

    The caller adds task/seed context. raw_output, elapsed_ms, sandboxed and mechanism are filled in
    when the scorer started (empty/0/None otherwise).
    """

    def __init__(self, code: str, message: str, *, stderr_tail: str = "", raw_output: str = "",
                 elapsed_ms: float = 0.0, sandboxed: bool | None = None, mechanism: str = "") -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown scorer error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.stderr_tail = stderr_tail
        self.raw_output = raw_output
        self.elapsed_ms = elapsed_ms
        self.sandboxed = sandboxed
        self.mechanism = mechanism

    def __repr__(self) -> str:
        return f"ScorerError({self.code!r}, {self.message!r})"
