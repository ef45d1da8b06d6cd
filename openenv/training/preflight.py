"""Training preflight: what a `kind: train` run seals before it spends an episode (reference-spec §1.6).

`preflight_request(body)` validates a POST /v1/openenv/training/preflight body (`adapter` [base],
`output_adapter`, `training_config`, `auto_load` [true], `post_eval`; unknown fields rejected) and
`training_preflight(...)` answers the `kiln.openenv-training-preflight.v1` receipt:
- 503 `mock_mode` without model weights; the served model must be loaded (503 inference codes);
- the behavior adapter must be published (404 `adapter_not_found`), the output name valid and
  free (400 `invalid_adapter_name`, 409 `adapter_revision_conflict`) and not the behavior adapter;
- the effective config is the request's `training_config` over the server's `[training.defaults]`
  (training.config_defaults, as on every GRPO route) over GrpoConfig's own defaults, with Kiln's
  four overrides (openenv.training.contract); it must validate (400 `training_invalid_request`
  naming `training_config.<field>`), the post-eval suite must be installed (404 `eval_suite_not_found`);
- the capacity check: queued training jobs < `max_queued_jobs` (503 `training_queue_full`) and
  tracked ones (active, or finished within the last hour) < 1024 (503 `training_tracked_full`).
  Nothing is reserved (`capacity_reserved: false`): submission rechecks after collection.
The receipt carries the sealed contract and its digest. The behavior policy identity is the one
the chat route stamps on every rollout: the served model id, base weights, inference config and
implementation from the GPU worker's heartbeat, plus `{name, content_sha256}` of the adapter.
"""

from __future__ import annotations

import time

from django.conf import settings

from core.contracts.grpo_submission import PostEvalConfig
from core.contracts.grpo_values import GrpoConfigError
from core.errors import KilnError
from core.model_weights import require_model_weights
from openenv.collector.config import adapter_name
from openenv.training import contract as contracts
from training.config_defaults import apply_training_defaults

FIELDS = ("adapter", "output_adapter", "training_config", "auto_load", "post_eval")


def _invalid(field: str, message: str, hint: str = "") -> KilnError:
    return KilnError("training_invalid_request", f"{field}: {message}", status=400, field=field, hint=hint)


def preflight_request(body) -> dict:
    """The validated preflight fields (the same ones a train run's request carries)."""
    if not isinstance(body, dict):
        raise _invalid("request", "must be a JSON object")
    extra = sorted(set(body) - set(FIELDS))
    if extra:
        raise _invalid(extra[0], "unknown field", "the preflight takes only: " + ", ".join(FIELDS))
    adapter = body.get("adapter", "base")
    if adapter is not None and not isinstance(adapter, str):
        raise _invalid("adapter", "must be an adapter name, or base")
    output = body.get("output_adapter")
    if not isinstance(output, str) or not output.strip():
        raise _invalid("output_adapter", "is required (the name of the LoRA to train)")
    config = body.get("training_config")
    if config is not None and not isinstance(config, dict):
        raise _invalid("training_config", "must be a JSON object (GrpoConfig)")
    auto_load = body.get("auto_load", True)
    if not isinstance(auto_load, bool):
        raise _invalid("auto_load", "must be true or false")
    post_eval = body.get("post_eval")
    if post_eval is not None and not isinstance(post_eval, dict):
        raise _invalid("post_eval", "must be a JSON object (PostEvalConfig)")
    return {"adapter": adapter_name(adapter) or "base", "output_adapter": output.strip(), "training_config": config,
            "auto_load": auto_load, "post_eval": post_eval}


def served_behavior_identity() -> dict:
    """The served model's part of the behavior policy, from a live GPU worker (503 while unavailable)."""
    from adapters.serving.selectors import require_inference_ready, served_model_identity

    identity = served_model_identity()
    if identity is None:
        require_inference_ready()
        raise KilnError("model_loading", "the GPU worker has not reported the served model's identity yet",
                        status=503, hint="retry in a few seconds; /health shows progress")
    return {key: identity.get(key) for key in ("served_model_id", "base_model_sha256", "inference_config_sha256",
                                                "implementation")}


def behavior_policy(adapter: str | None) -> dict:
    from adapters.models import AdapterState
    from adapters.selectors import adapter_get

    policy = served_behavior_identity()
    if adapter is not None:
        row = adapter_get(name=adapter)
        if row is None or row.state != AdapterState.PUBLISHED or not row.content_sha256:
            raise KilnError("adapter_not_found", f"adapter: no published adapter named {adapter!r}", status=404,
                            field="adapter", hint="choose base or an adapter that finished training")
        policy["adapter"] = {"name": row.name, "content_sha256": row.content_sha256}
    return policy


def _check_base_adapter_shape(behavior: str | None, effective: dict) -> None:
    """The behavior adapter is the run's warm start: a rank/alpha it does not have would fail only at
    training, after every episode was collected."""
    from adapters.selectors import adapter_published_path
    from training.base_adapter_shape import base_adapter_shape_problem

    path = adapter_published_path(name=behavior) if behavior else None
    problem = path and base_adapter_shape_problem(path, rank=effective["lora_rank"], alpha=effective["lora_alpha"])
    if problem:
        raise _invalid("training_config.lora_rank", problem[0], problem[1] + " (kiln openenv train: --lora-rank)")


def capacity() -> dict:
    from core.jobs.kinds import MAX_TRACKED_JOBS
    from core.jobs.models import Job, JobState
    from core.jobs.selectors import tracked_job_count

    queued = Job.objects.filter(kind="training.grpo", deleted_at__isnull=True, state=JobState.QUEUED).count()
    return {"checked_unix_ms": int(time.time() * 1000), "queued_jobs": queued,
            "max_queued_jobs": settings.KILN.max_queued_jobs, "tracked_jobs": tracked_job_count(kind="training.grpo"),
            "max_tracked_jobs": MAX_TRACKED_JOBS}


def check_capacity(figures: dict) -> None:
    if figures["queued_jobs"] >= figures["max_queued_jobs"]:
        raise KilnError("training_queue_full", f"{figures['queued_jobs']} training jobs are queued (cap "
                        f"{figures['max_queued_jobs']})", status=503, headers={"Retry-After": "30"},
                        hint="wait for queued training to finish, then submit again")
    if figures["tracked_jobs"] >= figures["max_tracked_jobs"]:
        raise KilnError("training_tracked_full", f"{figures['tracked_jobs']} training jobs are tracked (cap "
                        f"{figures['max_tracked_jobs']})", status=503, headers={"Retry-After": "30"},
                        hint="delete finished training jobs, or wait an hour, then submit again")


def _post_eval(value: dict | None) -> dict | None:
    if value is None:
        return None
    from evaluations.suite_selectors import suite_get
    from training.post_eval_admission import check_post_eval_generation

    try:
        post_eval = PostEvalConfig.from_dict(value)
    except GrpoConfigError as exc:
        raise _invalid(exc.field, exc.message) from None
    suite = suite_get(name=post_eval.suite)
    if suite is None:
        raise KilnError("eval_suite_not_found", f"post_eval.suite: no installed eval suite named {post_eval.suite!r}",
                        status=404, field="post_eval.suite",
                        hint="install it first: kiln eval suites create FILE")
    check_post_eval_generation(post_eval, suite_hash=suite.suite_hash)
    return post_eval.to_dict()


def training_preflight(*, adapter: str, output_adapter: str, training_config: dict | None, auto_load: bool,
                       post_eval: dict | None) -> dict:
    """The preflight receipt with the sealed contract (KilnError with the training codes otherwise)."""
    from adapters.selectors import adapter_get
    from adapters.services import validate_adapter_name

    require_model_weights()
    behavior = adapter_name(adapter)
    validate_adapter_name(output_adapter, field="output_adapter")
    if output_adapter == behavior:
        raise _invalid("output_adapter", "must differ from the behavior adapter (adapters are immutable revisions)",
                       "name a new revision, e.g. counter-agent-v2")
    if adapter_get(name=output_adapter) is not None:
        raise KilnError("adapter_revision_conflict", f"output_adapter: adapter {output_adapter!r} already exists",
                        status=409, field="output_adapter",
                        hint="use a new versioned output name for every round, e.g. counter-agent-r002")
    merged, sources = apply_training_defaults(training_config, settings.KILN.training_defaults)
    try:
        effective = contracts.effective_config(merged, adapter=behavior, output_adapter=output_adapter,
                                               auto_load=auto_load)
    except GrpoConfigError as exc:
        hint = exc.hint or ("this config combines training_config with the server's [training.defaults] "
                            "(GET /v1/config)" if "server_defaults" in sources.values() else "")
        raise KilnError(exc.code, f"training_config.{exc.field}: {exc.message}", status=400,
                        field=f"training_config.{exc.field}", hint=hint) from None
    post = _post_eval(post_eval)
    policy = behavior_policy(behavior)
    _check_base_adapter_shape(behavior, effective)
    figures = capacity()
    check_capacity(figures)
    sealed = contracts.contract(effective=effective, post_eval=post, behavior_policy=policy)
    receipt = {"schema": contracts.PREFLIGHT_SCHEMA, "effective_config": effective}
    if post is not None:
        receipt["post_eval"] = post
    receipt.update(behavior_policy=policy, capacity=figures, capacity_reserved=False,
                   kiln_overrides=contracts.overrides(training_config, effective),
                   training_contract=sealed, training_contract_sha256=contracts.contract_sha256(sealed))
    return receipt
