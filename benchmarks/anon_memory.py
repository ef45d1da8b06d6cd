"""Peak anonymous memory of this process, sampled: the memory figure the scaling benchmark compares.

Standard library only: TRL's worker (its own virtual environment) imports it as well as Kiln's.

Why not peak RSS alone: RSS also counts the pages of shared libraries and memory-mapped weight
files that a process has touched, and how many of those get mapped depends on what the page cache
holds, not on the program. Measured on this repository's machine: `import torch, peft` gave the
same anonymous memory in Kiln's and TRL's virtual environments (271 vs 265 MB) but 214 vs 85 MB of
file-backed pages, from the same torch wheel in two copies on disk. Anonymous memory (the heap:
tensors, activations, optimizer state) is what the program allocates, so it is the like-for-like
figure. Linux keeps no high-water mark for it, so a thread reads /proc/self/status every
`interval` seconds; an allocation that lives shorter than that can be missed.
"""

from __future__ import annotations

import threading

__all__ = ["AnonPeak"]


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class AnonPeak:
    """Start at construction; `mib()` is the highest anonymous RSS seen so far, in MiB."""

    def __init__(self, interval: float = 0.002):
        self._peak = _rss_anon_kib()
        self._stop = threading.Event()
        self._interval = interval
        threading.Thread(target=self._watch, name="anon-peak", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self._peak = max(self._peak, _rss_anon_kib())

    def mib(self) -> float:
        self._peak = max(self._peak, _rss_anon_kib())
        return self._peak / 1024.0

    def seen_mib(self) -> float:
        """The highest the watcher thread has seen so far, without reading the current use."""
        return self._peak / 1024.0

    def stop(self) -> float:
        self._stop.set()
        return self.mib()
