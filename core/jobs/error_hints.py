"""What to do about a job's failure: the hint that goes with its stored error code.

A job stores only its error code and message (the worker that failed it may be gone); the hint is a
fact about the code, so every selector that shows a job error adds it from here, and the API's job
errors have the same {code, message, hint} shape as its request errors.
"""

from __future__ import annotations

JOB_ERROR_HINTS = {
    # training (the GRPO guide's troubleshooting)
    "zero_groups": "every group was filtered (no reward contrast within a group, or a reward-variance filter): "
                   "inspect the receipt, then improve sampling diversity or reward shaping",
    "recorded_provenance_drift": "regenerate the rollouts with kiln rollout-generate; do not weaken the objective "
                                 "to hide prompt, token, adapter, sampling or provenance drift",
    "recorded_provenance_invalid": "regenerate the rollouts with kiln rollout-generate (every rollout needs its "
                                   "provenance record), or train with behavior_policy no_importance_correction",
    "base_adapter_missing": "set base_adapter to a published adapter (kiln adapters list), or leave it out to "
                            "start from the base model",
    "nan_loss": "lower the learning rate or max_grad_norm, and check the rewards are finite and of a sane scale",
    "oom": "lower group size, completion length or micro-batch size, or free GPU memory",
    "zero_action_tokens": "every completion is empty after masking: check the completions and the loss masks",
    "shape_mismatch": "the base adapter or checkpoint was trained on another model: check base_adapter and the "
                      "served model",
    "unsupported_loss_config": "see the receipt's failure_message for the option this runtime cannot run",
    "data_schema_error": "each group is {messages, completions: [{text, reward}, ...]}; see the receipt's "
                         "failure_message for the row",
    "mock_mode": "the worker that took the job has no model: set model.path in kiln.toml or KILN_MODEL_PATH for "
                 "the workers too, restart, check /health, and resubmit",
    "model_weights_missing": "set model.path in kiln.toml or KILN_MODEL_PATH, restart the server, and check "
                             "/health before resubmitting",
    "model_path_invalid": "set model.path in kiln.toml or KILN_MODEL_PATH, restart the server, and check "
                          "/health before resubmitting",
    "adapter_revision_conflict": "use a new versioned output name for every round, e.g. math-r002",
    "adapter_disk_quota_exceeded": "the disk is full: free space under KILN_HOME (kiln adapters delete NAME removes "
                                   "an adapter and its checkpoints), then resubmit",
    # resuming from a checkpoint: a resume continues exactly one run, so everything must match
    "checkpoint_not_found": "name a checkpoint folder the job detail's latest_checkpoint shows (kiln train status "
                            "--job-id JOB), directly beneath the adapter registry",
    "checkpoint_invalid": "the checkpoint's files changed or are incomplete: resume from an earlier published "
                          "checkpoint, or start the run again",
    "checkpoint_adapter_mismatch": "resume under the output name the checkpoint was written for",
    "checkpoint_source_mismatch": "resume with the identical training data through the same route (the same "
                                  "dataset_path, named dataset or inline groups) the checkpointed run used",
    "checkpoint_data_mismatch": "resume with the identical training data the checkpointed run used",
    "checkpoint_config_mismatch": "resume with the checkpointed run's effective config (only resume_checkpoint, "
                                  "checkpoint_interval and auto_load may differ)",
    "checkpoint_base_model_mismatch": "resume on the base model the checkpoint was trained on (KILN_MODEL_PATH)",
    "checkpoint_tokenizer_mismatch": "resume with the tokenizer the checkpoint was trained with",
    "checkpoint_precision_mismatch": "resume on the device and precision the checkpoint was trained with",
    # any job
    # (a kind may say more: JobKind.error_hints, e.g. a training run resumes from its latest checkpoint)
    "job_cancelled": "it was cancelled on request; resubmit it",
    "job_interrupted": "its worker stopped while it ran (kill, restart, out of memory); submit it again",
    "job_time_limit": "it ran past its time limit; submit a smaller piece of work",
    "job_error": "an unexpected error: the worker's log has the traceback",
    "adapter_load_failed": "the adapter failed its serving canary and is quarantined: see its canary with "
                           "`kiln adapters show NAME` (GET /v1/adapters/NAME/detail)",
    "adapter_quarantined": "its serving canary failed earlier; an operator may load it anyway with "
                           "--allow-quarantined",
    "inference_disabled_by_profile": "restart the server in the stable profile (KILN_SERVER_SERVING_PROFILE=stable)",
    "inference_unavailable": "no GPU worker is serving: kiln serve starts one; check /health",
}


def job_error(job) -> dict | None:
    """{code, message, hint} of a failed job, or None when it has no error."""
    from core.jobs.kinds import get_job_kind

    if not job.error_code:
        return None
    kind = get_job_kind(job.kind)
    hint = ((kind.error_hint(job.error_code) if kind is not None else None) or JOB_ERROR_HINTS.get(job.error_code)
            or (kind.default_error_hint if kind is not None else "")
            or "see the job's events (kiln jobs show ID) for what happened")
    return {"code": job.error_code, "message": job.error_message, "hint": hint}
