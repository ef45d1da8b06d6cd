"""Small helpers shared by the kernel wrappers. Imports nothing heavy (no triton, no torch)."""

from __future__ import annotations


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
