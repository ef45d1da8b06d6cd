"""Dramatiq middleware that ties a worker process into Kiln: boot recovery, heartbeat, clean stop."""

from __future__ import annotations

import os

from dramatiq.middleware import Middleware


class KilnWorkerMiddleware(Middleware):
    def after_worker_boot(self, broker, worker):
        from core.jobs.worker_state import set_worker_status, start_worker

        queues = [q for q in os.environ.get("KILN_WORKER_QUEUES", "gpu,control").split(",") if q]
        if "infer" in queues:
            set_worker_status(model={"loaded": False, "loading": True})
        start_worker(queues)
        if "infer" in queues:
            # The GPU worker keeps the model resident; loading runs in the background and its
            # outcome (loaded, or why not) is published in the heartbeat.
            from adapters.serving.runtime_host import start_model_host

            start_model_host()

    def before_worker_shutdown(self, broker, worker):
        from core.jobs.runner import request_shutdown

        request_shutdown()
        if "infer" in os.environ.get("KILN_WORKER_QUEUES", ""):
            from adapters.serving.runtime_host import stop_model_host

            stop_model_host()

    def after_worker_shutdown(self, broker, worker):
        from core.jobs.worker_state import stop_worker

        stop_worker()
