"""The `infer` queue's actor. It runs in the GPU worker, where the model is resident.

The web process imports this module to send messages and must never load torch, so the worker-side
handler is looked up by name when a message runs (the same rule job kinds follow).
"""

from __future__ import annotations

import logging
from importlib import import_module

import dramatiq

WORKER_HANDLER = "adapters.serving.runtime_host"

log = logging.getLogger(__name__)
INFER_TIME_LIMIT_MS = 15 * 60 * 1000


@dramatiq.actor(queue_name="infer", max_retries=0, time_limit=INFER_TIME_LIMIT_MS)
def run_chat_completion(request_id: str, body: dict) -> None:
    from adapters.serving.transport import WorkerEmitter
    from core.jobs.worker_state import current_worker_id

    emitter = WorkerEmitter(request_id)
    if emitter.reader_gone():
        # Redelivered by the broker after the worker that took it died, and its reader has already
        # been answered (503 inference_worker_lost, or resent under a new id): generating it now
        # would only compete with the client's retry.
        log.warning("dropping chat completion %s: nobody waits for it any more", request_id)
        return
    emitter.claim(current_worker_id())
    import_module(WORKER_HANDLER).handle_chat_completion(body, emitter.emit, emitter.reader_gone)
