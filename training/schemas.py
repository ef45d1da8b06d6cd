"""API shapes of /v1/train/*: ninja schemas that describe the GRPO request and its answers.

The request schemas document every field with its JSON type, default and choices, read off the
contract dataclasses (core.contracts), and accept any JSON object: the contract is the one checker
of a request, so a bad value answers `training_invalid_request` naming the field (unknown fields
are accepted and ignored, as the guide's API contract says). Web-facing: no torch.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import BaseModel, ConfigDict

from core.contracts import grpo_config as grpo
from core.contracts import grpo_values as values
from core.contracts.grpo_submission import DATA_SCOPES, PostEvalConfig
from core.contracts.json_schema import dataclass_schema

SEED_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": grpo.MAX_SEED},
                         {"type": "string", "pattern": "^[0-9]+$"}, {"type": "null"}],
               "description": "u64 seed; a decimal string carries values past 2**53"}

GRPO_CONFIG = dataclass_schema(
    grpo.GrpoConfig, title="GrpoConfig",
    description="GRPO hyperparameters (reference-spec §3); every field optional, unknown keys ignored. A field "
                "left out takes the server's [training.defaults] (GET /v1/config), else the default shown.",
    choices={"behavior_policy": grpo.BEHAVIOR_POLICIES, "is_level": grpo.IS_LEVELS,
             "advantage_mode": grpo.ADVANTAGE_MODES, "loss_aggregation": grpo.LOSS_AGGREGATIONS,
             "kl_estimator": grpo.KL_ESTIMATORS, "reward_filter_on_empty": grpo.REWARD_FILTER_ON_EMPTY},
    overrides={"seed": SEED_SCHEMA},
    bounds={"learning_rate": (None, grpo.MAX_LEARNING_RATE),
            "lora_rank": (1, values.MAX_LORA_RANK), "lora_alpha": (None, values.MAX_LORA_ALPHA),
            "checkpoint_interval": (1, values.MAX_CHECKPOINT_INTERVAL),
            "grad_checkpoint_segments": (1, values.MAX_GRAD_CHECKPOINT_SEGMENTS),
            "reward_filter_min_groups": (1, values.MAX_REWARD_FILTER_MIN_GROUPS),
            "clip_epsilon": (0, 1), "entropy_aware_kl_quantile": (0, 1), "kl_coeff": (0, None)},
    nested={
        values.OptimizerConfig: dataclass_schema(values.OptimizerConfig, title="OptimizerConfig",
                                                 choices={"kind": values.OPTIMIZER_KINDS}),
        values.KlReferencePolicy: dataclass_schema(values.KlReferencePolicy, title="KlReferencePolicy",
                                                   choices={"kind": values.KL_REFERENCE_KINDS},
                                                   bounds={"decay": (0, 1),
                                                           "refresh_every": (1, values.MAX_REFRESH_EVERY)}),
        values.EchoConfig: dataclass_schema(values.EchoConfig, title="EchoConfig",
                                            choices={"env_mask_mode": values.ENV_MASK_MODES}),
    },
)
POST_EVAL_CONFIG = {
    **dataclass_schema(PostEvalConfig, title="PostEvalConfig",
                       description="Held-out evaluation after training (the gate). Unknown keys are refused "
                                   "(400 training_invalid_request), unlike config's.",
                       choices={"data_scope": DATA_SCOPES}),
    "additionalProperties": False,
}
# reference-spec 2.1: the field names core.contracts.groups reads (a client generated from this document must
# send `trajectory` and `provenance`; unknown fields are ignored, so a wrong name would silently drop them)
SCORED_ROLLOUT = {"title": "ScoredRollout", "type": "object", "additionalProperties": True, "required": ["text", "reward"],
                  "properties": {
                      "text": {"type": "string"},
                      "reward": {"type": "number", "description": "finite"},
                      "trajectory": {"type": "array", "items": {"type": "object"},
                                     "description": "TurnSegments {role, content, kind: context|action|observation}"},
                      "provenance": {"type": "object", "description": "kiln.rollout-provenance.v1, as "
                                     "`kiln rollout-generate` writes it (needed by the recorded behavior policy)"},
                      "openenv": {"type": "object", "description": "kiln.openenv-rollout.v1 (OpenEnv episodes)"}}}
GROUP = {"title": "AgenticGroup", "type": "object", "additionalProperties": True,
         "required": ["messages"],
         "description": "exactly one of completions and its alias rollouts",
         "properties": {"messages": {"type": "array", "items": {"type": "object"}},
                        "completions": {"type": "array", "items": SCORED_ROLLOUT},
                        "rollouts": {"type": "array", "items": SCORED_ROLLOUT}}}
GRPO_REQUEST = {
    "title": "GrpoRequest", "type": "object", "additionalProperties": True,
    "description": "Exactly one source: groups (inline), dataset_path (a JSONL file on the server) or dataset.",
    "properties": {
        "groups": {"type": "array", "items": GROUP},
        "dataset_path": {"type": "string", "description": "absolute path of a JSONL file of groups on the server"},
        "dataset": {"type": "string", "minLength": 1, "description": "a registered grpo_groups dataset's name"},
        "dataset_split": {"type": "string"},
        "config": GRPO_CONFIG,
        "post_eval": {"anyOf": [POST_EVAL_CONFIG, {"type": "null"}]},
        "dry_run": {"type": "boolean", "default": False,
                    "description": "validate and plan only: answers the plan (mode jsonl_grpo_groups_dry_run) "
                                   "and queues nothing"},
    },
}


class _Documented(BaseModel):
    """Any JSON object; the OpenAPI document shows the contract's schema instead of none.
    (A plain pydantic model: ninja's Schema reads declared fields only and would drop the rest.)"""

    model_config = ConfigDict(extra="allow")

    def as_dict(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class GrpoRequest(_Documented):
    model_config = ConfigDict(extra="allow", title="GrpoRequest",
                              json_schema_extra=lambda schema, cls: schema.update(GRPO_REQUEST))


TAGGED_TRAINING_REQUEST = {
    **GRPO_REQUEST, "title": "TaggedTrainingRequest", "required": ["kind"],
    "description": "POST /v1/train: `kind` picks the training; with grpo the rest is a GrpoRequest. "
                   "sft and opd are answered 501 not_implemented by this Kiln.",
    "properties": {"kind": {"type": "string", "enum": ["grpo", "agentic", "sft", "opd"]},
                   **GRPO_REQUEST["properties"]},
}


class TaggedTrainingRequest(_Documented):
    model_config = ConfigDict(extra="allow", title="TaggedTrainingRequest",
                              json_schema_extra=lambda schema, cls: schema.update(TAGGED_TRAINING_REQUEST))


class GrpoQueued(Schema):
    job_id: str
    state: str
    effective_seed: str
    message: str
    after_publication: str = ""  # what becomes of the adapter once published (active, gated, reviewed, kept)
    ignored_config_keys: list[str] = []  # config keys that are no GrpoConfig field (accepted and ignored)
    warnings: list[str] = []  # one per ignored key (with its closest field name); a gate too small to decide


class GrpoDryRun(Schema):
    """`dry_run: true`: the admitted, planned request; nothing was queued (training.services.grpo_dry_run)."""
    model_config = ConfigDict(extra="allow")

    mode: str  # jsonl_grpo_groups_dry_run
    dry_run: bool
    would_publish: str
    effective_seed: str
    effective_config: dict
    config_sources: dict = {}
    ignored_config_keys: list[str] = []
    warnings: list[str] = []
    training_data: dict
    post_eval: dict | None = None
    post_eval_suite_hash: str | None = None
    groups_with_reward_contrast: int
    groups_without_reward_contrast: int
    # The largest step's memory estimate against the budget (training.memory_preflight); null when the
    # model's shape cannot be read.
    memory: dict | None = None
    message: str


class TaggedTraining(Schema):
    """POST /v1/train's answer: the kind it picked and that kind's route's own answer."""
    picked: str
    training: GrpoQueued | GrpoDryRun


class TrainingErrorOut(Schema):
    code: str
    message: str
    hint: str = ""  # what to do about it (core.jobs.error_hints)


class TrainingStatus(Schema):
    model_config = ConfigDict(extra="allow")

    job_id: str
    state: str
    progress: float
    current_loss: float | None = None
    adapter_name: str | None = None
    started_at: datetime | None = None
    effective_seed: str | None = None
    submitted_unix_ms: int | None = None
    finished_unix_ms: int | None = None
    elapsed_secs: float
    job_type: str
    training_data: dict | None = None
    error: TrainingErrorOut | None = None
    cancel_requested: bool
    gate_outcome: str | None = None  # promoted | kept | regression | demoted | inconclusive | error
    post_eval_verdict: str | None = None
    post_eval_gate_evidence: list[dict] = []


class TrainingDetail(TrainingStatus):
    epoch: float | None = None
    adapter_path: str | None = None
    auto_load: bool | None = None
    linked_eval_job_ids: list[str] = []
    loss_history: list[dict] = []
    reward_history: list[dict] = []
    kl_history: list[dict] = []
    train_receipt: dict | None = None
    replay_request: dict | None = None  # {route, body}: this training again (None for inline groups)
    checkpoint_error: str | None = None  # the newest checkpoint that failed to publish
    metadata_error: str | None = None  # why the receipt or the latest checkpoint could not be read
    latest_checkpoint: dict | None = None  # {resume_checkpoint, checkpoint_id, global_step, ...}
    effective_config: dict | None = None
    # {field: "request" | "server_defaults" | "default"} for effective_config, and the server's table.
    config_sources: dict | None = None
    server_training_defaults: dict = {}
    post_eval: dict | None = None
    post_eval_job_id: str | None = None
    activation_job_id: str | None = None  # auto_load without a gate: the serving canary + activation job
    states: dict | None = None  # training, evaluation, activation: each with its state and time


class QueuedEntry(Schema):
    job_id: str
    job_type: str
    adapter_name: str | None = None
    position: int


class TrainingQueue(Schema):
    running: TrainingStatus | None = None
    queued: list[QueuedEntry]
    completed: list[TrainingStatus]


class JobDeleted(Schema):
    job_id: str
    status: str
    removed_archive_file: bool


class JobCancelResult(Schema):
    status: str
    job_id: str
    message: str | None = None
