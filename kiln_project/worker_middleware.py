"""Dramatiq middleware that ties a worker process into Kiln: boot recovery, heartbeat, clean stop,
death with its parent, and the GPU device lock.

- The worker process asks the kernel for SIGTERM when its parent (dramatiq's supervisor) dies, so
  a kill -9 of the supervisor stops it (its running job ends job_interrupted) instead of leaving
  an orphan that keeps training while a new worker starts.
- A GPU worker holds KILN_HOME/locks/gpu.lock (an flock the OS releases when the holder dies)
  before it loads the model or claims a `gpu` job: two GPU workers on one home never use the
  device at once; a second one waits, heartbeating, until the first is gone.
- In the worker that keeps the model resident, `gpu` jobs are claimed only once loading finished:
  work queued while the model loads waits for it instead of racing the load.
"""

from __future__ import annotations

import os
import threading

from dramatiq.middleware import Middleware

GPU_QUEUES = ("gpu", "infer")


def gpu_device_lock():
    from django.conf import settings

    from core.process_locks import ProcessLock

    locks = settings.KILN.layout.locks
    return ProcessLock(locks / "gpu.lock", history=locks / "gpu.lock.history")


class KilnWorkerMiddleware(Middleware):
    device_lock = None

    def after_worker_boot(self, broker, worker):
        from core.jobs.runner import set_queue_gate
        from core.jobs.worker_state import set_worker_status, start_worker
        from core.process_locks import die_with_parent

        die_with_parent()
        queues = [q for q in os.environ.get("KILN_WORKER_QUEUES", "gpu,control").split(",") if q]
        gpu_side = any(q in GPU_QUEUES for q in queues)
        if gpu_side:
            self.device_lock = gpu_device_lock()
            # GPU jobs wait for the device lock and, in the worker that keeps the model resident,
            # for the model to finish loading: a training job queued in that window must not race
            # the load for memory and the device (it once failed within 2 s of /health answering).
            set_queue_gate("gpu", lambda: self.device_lock.held and self._model_settled(queues))
            if "infer" in queues:
                set_worker_status(model={"loaded": False, "loading": True})
        start_worker(queues)
        if gpu_side:
            threading.Thread(target=self._take_the_device, args=(queues,), name="kiln-gpu-lock", daemon=True).start()

    def _take_the_device(self, queues) -> None:
        from core.jobs.dispatch import wake_queue
        from core.jobs.runner import shutting_down
        from core.jobs.worker_state import set_worker_status

        if not self.device_lock.try_acquire():
            set_worker_status(gpu_lock={"waiting": True, "holder": self.device_lock.holder()})
            if not self.device_lock.acquire(should_stop=shutting_down):
                return
        set_worker_status(gpu_lock={"waiting": False, "holder": self.device_lock.holder()})
        if "infer" in queues:
            # The GPU worker keeps the model resident; loading runs in the background and its
            # outcome (loaded, or why not) is published in the heartbeat.
            from adapters.metrics import INFERENCE
            from adapters.serving.runtime_host import start_model_host

            INFERENCE.start()  # the kiln_inference_* counts of GET /metrics, written every few seconds

            host = start_model_host()
            if not host.wait_settled(shutting_down):
                return
        if "gpu" in queues:
            wake_queue("gpu")

    @staticmethod
    def _model_settled(queues) -> bool:
        if "infer" not in queues:
            return True
        from adapters.serving import runtime_host

        return runtime_host.current_host_settled()

    def before_worker_shutdown(self, broker, worker):
        from core.jobs.runner import request_shutdown

        request_shutdown()
        if "infer" in os.environ.get("KILN_WORKER_QUEUES", ""):
            from adapters.serving.runtime_host import stop_model_host

            stop_model_host()

    def after_worker_shutdown(self, broker, worker):
        from core.jobs.worker_state import stop_worker

        stop_worker()
        if "infer" in os.environ.get("KILN_WORKER_QUEUES", ""):
            from adapters.metrics import INFERENCE

            INFERENCE.stop()  # what the last interval counted
        if self.device_lock is not None:
            self.device_lock.release()
