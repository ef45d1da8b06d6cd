from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "evaluations"
    verbose_name = "Evaluations"

    def ready(self):
        from core.jobs.kinds import JobKind, register_job_kind
        from evaluations.metrics import register_families

        register_families()  # kiln_gate_decisions_total of GET /metrics

        # Recorded-policy rollout generation (Training → Rollouts, kiln rollout-generate on the
        # server): CPU-side in the control worker; it samples through the infer queue and runs the
        # registered scorer in the sandbox. The evaluation runs will use the same pipeline.
        register_job_kind(JobKind(name="rollouts.generate", queue="control",
                                  handler="evaluations.rollout_jobs:run_rollouts_job", category="training",
                                  detail_section="evaluations.rollout_selectors:job_section",
                                  payload_type="evaluations.payloads:RolloutsJobPayload"))
        # Eval jobs (run, compare, rerun, replay: one kind, `mode` in the payload): CPU-side in the
        # control worker; every completion is sampled through the infer queue (the GPU worker).
        register_job_kind(JobKind(name="eval.run", queue="control", handler="evaluations.eval_jobs:run_eval_job",
                                  category="evaluation", queue_full_code="eval_queue_full",
                                  queue_full_retry_after=15, tracked_full_code="eval_tracked_full",
                                  detail_section="evaluations.eval_selectors:job_section",
                                  payload_type="evaluations.eval_payloads:EvalJobPayload",
                                  error_hints=(("job_interrupted", "its worker stopped while it ran (kill, restart, "
                                                "out of memory); run the evaluation again with the same suite, "
                                                "targets and settings (kiln eval run or kiln eval compare; rerun "
                                                "and replay take only a completed job)"),)))
