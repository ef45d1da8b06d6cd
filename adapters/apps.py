from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    name = "adapters"
    verbose_name = "Adapters"

    def ready(self):
        from adapters.metrics import register_families
        from core.jobs.kinds import JobKind, register_job_kind

        register_families()  # the promotions gauge of GET /metrics

        # The serving canary and the activation it guards (adapters.activation); the control worker asks
        # the GPU worker to generate, so a crash of either fails the job and its promotion, never half-active.
        register_job_kind(JobKind(name="adapter.activate", queue="control",
                                  handler="adapters.activation:run_activation_job", category="other",
                                  on_unsuccessful="adapters.activation:activation_unsuccessful",
                                  payload_type="adapters.activation:ActivationPayload"))
