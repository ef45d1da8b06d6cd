"""The `openenv` Django app: persisted OpenEnv runs (models, the `openenv.run` job kind, restoration).

The pure client and collector (openenv.client, openenv.collector) import no Django; this app wires
them into the job system. The `openenv.run` kind runs on the control queue (no GPU in the worker
that collects: every policy turn is sampled through the infer queue). A `kind: train` run then follows
its `training.grpo` job (openenv.training.follow, a post_save receiver on JobEvent), and with
`environment_eval` ends in an `openenv.environment_eval` job (control queue; openenv.training.evaluation).
"""

from django.apps import AppConfig


class OpenEnvConfig(AppConfig):
    name = "openenv"
    label = "openenv"
    verbose_name = "OpenEnv"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_save

        from core.jobs.kinds import JobKind, register_job_kind
        from core.jobs.models import JobEvent
        from openenv.metrics import register_families
        from openenv.training.follow import on_job_event

        register_families()  # the kiln_openenv_* families of GET /metrics

        # A run's failure (its stage, whether a retry may work, what to do) is recorded on the run itself.
        run_hint = ("the OpenEnv run's status holds the failure's stage and what to do about it: kiln openenv "
                    "status RUN_ID (the job's payload names run_id), or the run's card under /ui/training/openenv/")
        register_job_kind(JobKind(name="openenv.run", queue="control", handler="openenv.runs.jobs:run_openenv_job",
                                  category="openenv", on_unsuccessful="openenv.runs.services:run_job_unsuccessful",
                                  default_error_hint=run_hint))
        # A train run's environment evaluation (after its training and post-eval): its own control job.
        register_job_kind(JobKind(name="openenv.environment_eval", queue="control",
                                  handler="openenv.training.evaluation:run_environment_eval_job", category="openenv",
                                  on_unsuccessful="openenv.runs.services:run_job_unsuccessful",
                                  default_error_hint=run_hint))
        # A train run follows its training job and that job's post-eval as they change (any process).
        post_save.connect(on_job_event, sender=JobEvent, dispatch_uid="openenv.training.follow")
