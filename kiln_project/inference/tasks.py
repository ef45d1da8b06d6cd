"""The `infer` queue's actor. It runs in the GPU worker, where the model is resident.

Imports of torch and gpu_runtime stay inside the function: the web process imports this module
to send messages and must never load torch.
"""

from __future__ import annotations

import dramatiq

INFER_TIME_LIMIT_MS = 15 * 60 * 1000


@dramatiq.actor(queue_name="infer", max_retries=0, time_limit=INFER_TIME_LIMIT_MS)
def run_chat_completion(request_id: str, body: dict) -> None:
    from kiln_project.inference.runtime_host import handle_chat_completion
    from kiln_project.inference.transport import WorkerEmitter

    handle_chat_completion(body, WorkerEmitter(request_id).emit)
