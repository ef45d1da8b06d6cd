"""Worker boot for OpenEnv runs: a control worker restores runs once it has recovered its jobs.

The worker imports every installed app's `tasks` module (kiln_project/cli/worker.py), so this
middleware joins the broker after Kiln's own (KilnWorkerMiddleware: heartbeat, job recovery) and
runs `openenv.runs.services.runs_restore` after boot: never-admitted queued runs resume in
sequence order; every other non-terminal run that no live worker executes fails `run_interrupted`
at stage `restoration`. Imports no torch.
"""

from __future__ import annotations

import logging
import os

import dramatiq
from dramatiq.middleware import Middleware

log = logging.getLogger(__name__)


class OpenEnvRestoreMiddleware(Middleware):
    def after_worker_boot(self, broker, worker):
        if "control" not in os.environ.get("KILN_WORKER_QUEUES", "gpu,control").split(","):
            return
        from django.db import close_old_connections

        from core.jobs.worker_state import current_worker_id
        from openenv.runs.services import runs_restore

        try:
            outcome = runs_restore(worker_id=current_worker_id())
            if outcome["interrupted"] or outcome["admitted"]:
                log.warning("OpenEnv runs restored: %d interrupted, %d admitted", len(outcome["interrupted"]),
                            len(outcome["admitted"]))
        except Exception as exc:  # noqa: BLE001 - the next admission pass (a submit, a run's end) retries
            log.warning("OpenEnv run restoration failed: %s", exc)
        finally:
            close_old_connections()


_broker = dramatiq.get_broker()
if not any(isinstance(m, OpenEnvRestoreMiddleware) for m in _broker.middleware):
    _broker.add_middleware(OpenEnvRestoreMiddleware())
