"""The `openenv` Django app: persisted OpenEnv runs (models, the `openenv.run` job kind, restoration).

The pure client and collector (openenv.client, openenv.collector) import no Django; this app wires
them into the job system. The `openenv.run` kind runs on the control queue (no GPU in the worker
that collects: every policy turn is sampled through the infer queue).
"""

from django.apps import AppConfig


class OpenEnvConfig(AppConfig):
    name = "openenv"
    label = "openenv"
    verbose_name = "OpenEnv"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from core.jobs.kinds import JobKind, register_job_kind

        register_job_kind(JobKind(name="openenv.run", queue="control", handler="openenv.runs.jobs:run_openenv_job",
                                  category="openenv", on_unsuccessful="openenv.runs.services:run_job_unsuccessful"))
