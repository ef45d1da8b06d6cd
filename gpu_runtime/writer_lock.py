"""The GPU writer lock: one per worker process, shared by the sampler loop and the trainer.

Training holds it for setup, each optimizer group, snapshots and final work; the inference loop
holds it for each sampler step. So a training group pauses inference (and the receipt's
gpu_writer_* timings say how long), but the two never use the device at the same time. Imports
no Django.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

_LOCK = threading.Lock()


@contextmanager
def gpu_writer():
    with _LOCK:
        yield
