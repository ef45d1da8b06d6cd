from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "core.jobs"
    label = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from django.conf import settings

        from core.jobs.kinds import import_extra_job_modules

        import_extra_job_modules(settings.KILN.extra_job_modules)
