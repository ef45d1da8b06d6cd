"""A slow peer for tests: in a GPU worker, model loading takes KILN_TEST_MODEL_LOAD_DELAY seconds longer.

Listed in KILN_EXTRA_JOB_MODULES by a test that needs a long model-loading window (the tiny model
loads in well under a second). Only the worker that serves `infer` is touched, so the web process
never imports torch through it.
"""

from __future__ import annotations

import os
import time

_DELAY = float(os.environ.get("KILN_TEST_MODEL_LOAD_DELAY", "0") or 0)

if _DELAY and "infer" in os.environ.get("KILN_WORKER_QUEUES", ""):
    import gpu_runtime.model_loading as model_loading

    _real_load = model_loading.load_model

    def _slow_load(*args, **kwargs):
        time.sleep(_DELAY)
        return _real_load(*args, **kwargs)

    model_loading.load_model = _slow_load
