from django.apps import AppConfig

# Where a training run's failure hint differs from any job's: it resumes from its newest checkpoint. The
# command resends only a request the server read from a file (inline groups it keeps as a private snapshot).
RESUME_COMMAND = "; for a dataset_path or named-dataset job, kiln train resume --job-id ID does that"
GRPO_ERROR_HINTS = (
    ("job_cancelled", "it was cancelled on request; resubmit it (a training run resumes from its latest_checkpoint "
                      f"with resume_checkpoint{RESUME_COMMAND})"),
    ("job_interrupted", "its worker stopped while it ran (kill, restart, out of memory); submit it again (a training "
                        f"run resumes from its latest_checkpoint with resume_checkpoint{RESUME_COMMAND})"),
)


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training"

    def ready(self):
        from core.jobs.kinds import JobKind, register_job_kind
        from training.metrics import register_families

        register_families()  # the kiln_training_* counters of GET /metrics

        # The handler runs in the GPU worker; naming it by path keeps torch out of the web process.
        register_job_kind(JobKind(name="training.grpo", queue="gpu", handler="training.runner:run_grpo_job",
                                  category="training", queue_full_code="training_queue_full",
                                  queue_full_retry_after=30, tracked_full_code="training_tracked_full",
                                  on_unsuccessful="training.hooks:release_output_adapter",
                                  detail_section="training.fragments:job_section",
                                  payload_type="training.payloads:GrpoJobPayload", error_hints=GRPO_ERROR_HINTS))
        # After a training with post_eval: evaluate the adapter, then the gate decides activation.
        register_job_kind(JobKind(name="training.post_eval", queue="control",
                                  handler="training.post_eval_jobs:run_post_eval_job", category="evaluation",
                                  payload_type="training.post_eval_jobs:PostEvalJobPayload"))
