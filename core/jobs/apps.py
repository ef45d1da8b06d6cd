from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "kiln_project.jobs"
    label = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from django.conf import settings

        from kiln_project.jobs.kinds import import_extra_job_modules

        import_extra_job_modules(settings.KILN.extra_job_modules)
