"""One set of bounds for sampling controls and seeds. Pure module.

The chat route's schema, `kiln rollout-generate` (its template check and its flags), the rollout
provenance record and the sampler all read these numbers, so a request one of them accepts is
never refused by another. Seeds are u64 end to end: OpenEnv derives generation seeds by wrapping
u64 arithmetic (reference-spec §4.4), and torch generators take the whole range.
"""

from __future__ import annotations

import math

MAX_SEED = 2**64 - 1
MAX_N = 16  # choices per chat request
MAX_TOKENS_CAP = 4096  # new tokens per choice
MAX_STOP_SEQUENCES = 8
MAX_STOP_BYTES = 16 * 1024
TEMPERATURE_MAX = 2.0
PENALTY_LIMIT = 2.0  # presence and frequency penalties lie in [-2, 2]
REPETITION_PENALTY_MAX = 10.0


def sampling_problem(*, temperature: float, top_p: float, top_k: int, min_p: float, max_tokens: int,
                     repetition_penalty: float, presence_penalty: float, frequency_penalty: float,
                     stop: tuple[str, ...] | list[str]) -> str | None:
    """The first control outside its bounds, as a message; None when all are valid."""

    def finite(value) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

    checks = [
        (finite(temperature) and 0 <= temperature <= TEMPERATURE_MAX,
         f"temperature must be in [0, {TEMPERATURE_MAX}]"),
        (finite(top_p) and 0 < top_p <= 1, "top_p must be in (0, 1]"),
        (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 0,
         "top_k must be an integer >= 0 (0 disables)"),
        (finite(min_p) and 0 <= min_p <= 1, "min_p must be in [0, 1]"),
        (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and 0 < max_tokens <= MAX_TOKENS_CAP,
         f"max_tokens must be an integer in [1, {MAX_TOKENS_CAP}]"),
        (finite(repetition_penalty) and 0 < repetition_penalty <= REPETITION_PENALTY_MAX,
         f"repetition_penalty must be in (0, {REPETITION_PENALTY_MAX}]"),
        (finite(presence_penalty) and abs(presence_penalty) <= PENALTY_LIMIT,
         f"presence_penalty must be in [-{PENALTY_LIMIT}, {PENALTY_LIMIT}]"),
        (finite(frequency_penalty) and abs(frequency_penalty) <= PENALTY_LIMIT,
         f"frequency_penalty must be in [-{PENALTY_LIMIT}, {PENALTY_LIMIT}]"),
        (len(stop) <= MAX_STOP_SEQUENCES, f"at most {MAX_STOP_SEQUENCES} stop sequences"),
        (all(isinstance(s, str) and s for s in stop), "stop sequences must be non-empty strings"),
        (stop_bytes_problem(stop) is None, stop_bytes_problem(stop)),
    ]
    return next((message for ok, message in checks if not ok), None)


def stop_bytes_problem(stop) -> str | None:
    """The stop strings' UTF-8 bytes together, over MAX_STOP_BYTES, as a message; None when within."""
    total = sum(len(s.encode("utf-8", "surrogatepass")) for s in stop if isinstance(s, str))
    return f"stop sequences exceed {MAX_STOP_BYTES} bytes" if total > MAX_STOP_BYTES else None


def seed_range_problem(seed: int | None, n: int) -> str | None:
    """Choice i of a request is sampled with seed + i: the last choice's seed must be a u64 too."""
    if seed is not None and seed + n - 1 > MAX_SEED:
        return (f"seed + n - 1 must be at most {MAX_SEED} (choice i is sampled with seed + i); "
                f"with n = {n} the seed can be at most {MAX_SEED - n + 1}")
    return None


def seed_problem(seed) -> str | None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        return f"seed must be an integer in [0, {MAX_SEED}]"
    return None
