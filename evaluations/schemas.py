"""API shapes of /v1/eval/datasets and /v1/eval/suites: ninja schemas describing requests and answers.

Request bodies accept any JSON object and are described for OpenAPI only; the one checker is the
contract (`evaluations.datasets.split`, `evaluations.suites`), so a bad value answers
`eval_invalid_request` naming the field. Web-facing: no torch.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import BaseModel, ConfigDict

from evaluations.datasets.split import PARTITIONS
from evaluations.datasets.synthesize import STRATEGIES
from evaluations.example_scorers import SCORER_TYPES

SCORER_SPEC = {"title": "ScorerSpec", "type": "object", "required": ["type"], "additionalProperties": True,
               "description": "exact | normalized_exact | numeric_tolerance {tolerance} | regex {pattern} | contains "
                              "| json_valid | json_schema {schema} | multiple_choice {choices} | program {scorer}",
               "properties": {"type": {"type": "string", "enum": list(SCORER_TYPES)}}}
SPLIT_REQUEST = {"title": "DatasetSplitConfig", "type": "object",
                 "properties": {"seed": {"type": "string", "pattern": "^[0-9]+$", "default": "0",
                                         "description": "decimal u64"},
                                "train_percent": {"type": "number", "default": 80, "exclusiveMinimum": 0},
                                "validation_percent": {"type": "number", "default": 10, "minimum": 0}},
                 "additionalProperties": False,
                 "description": "train_percent > 0 and train_percent + validation_percent < 100; the rest is "
                                "holdout. The whole config: a setting left out takes its default"}
SYNTHESIZE_REQUEST = {"title": "SynthesizeSuiteRequest", "type": "object", "required": ["suite_name"],
                      "properties": {"suite_name": {"type": "string"},
                                     "source_split": {"type": "string", "enum": list(PARTITIONS), "default": "holdout"},
                                     "strategy": {"type": "string", "enum": sorted({s for v in STRATEGIES.values()
                                                                                    for s in v})},
                                     "scorer": SCORER_SPEC, "head_n": {"type": "integer", "minimum": 1},
                                     "force": {"type": "boolean", "default": False}}}
EXAMPLE = {"title": "EvalExample", "type": "object", "required": ["id", "messages"],
           "properties": {"id": {"type": "string"},
                          "messages": {"type": "array", "items": {"type": "object", "required": ["role", "content"]}},
                          "target": {"type": ["string", "number"]}, "scorer": SCORER_SPEC,
                          "metadata": {"type": "object"}}}
SUITE_REQUEST = {"title": "EvalSuiteRequest", "type": "object", "required": ["name", "scorer", "examples"],
                 "properties": {"name": {"type": "string"}, "description": {"type": "string"}, "scorer": SCORER_SPEC,
                                "examples": {"type": "array", "items": EXAMPLE}}}


class _Documented(BaseModel):
    """Any JSON object (the contract checks it); the OpenAPI document shows the described schema."""

    model_config = ConfigDict(extra="allow")

    def as_dict(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _documented(title: str, schema: dict) -> type[_Documented]:
    return type(title, (_Documented,), {"model_config": ConfigDict(
        extra="allow", title=title, json_schema_extra=lambda s, cls: s.update(schema))})


SplitRequest = _documented("DatasetSplitConfig", SPLIT_REQUEST)
SynthesizeRequest = _documented("SynthesizeSuiteRequest", SYNTHESIZE_REQUEST)
SuiteRequest = _documented("EvalSuiteRequest", SUITE_REQUEST)


class SplitCounts(Schema):
    train: int
    validation: int
    holdout: int


class DatasetManifest(Schema):
    model_config = ConfigDict(extra="allow")

    name: str
    format: str
    description: str
    rows: int
    corpus_sha256: str
    normalized_corpus_sha256: str
    split_manifest_sha256: str
    split_config: dict
    split_counts: SplitCounts
    num_groups: int
    num_sessions: int
    created_at: str


class SplitPreview(Schema):
    dataset: str
    split_config: dict
    split_counts: SplitCounts
    component_counts: SplitCounts
    num_components: int


class DatasetRows(Schema):
    dataset: str
    partition: str | None = None
    offset: int
    limit: int
    total: int
    rows: list[dict]


class Deleted(Schema):
    name: str
    status: str


class SuiteSummary(Schema):
    name: str
    description: str
    suite_hash: str
    examples: int
    scorer: dict
    source: dict
    created_at: datetime
    updated_at: datetime


class SuiteDetail(Schema):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str
    suite_hash: str
    scorer: dict
    examples: list[dict]
    source: dict
    created_at: str


# -- eval jobs (/v1/eval/run, /compare, /jobs) ---------------------------------------------------

GENERATION = {"title": "EvalGenerationSettings", "type": "object", "additionalProperties": False,
              "description": "defaults filled in; bounds are core.contracts.sampling's. The seed (decimal u64) "
                             "defaults to one derived from the suite hash; each example is sampled with a seed "
                             "derived from it and the example id",
              "properties": {"temperature": {"type": "number", "default": 0.0, "minimum": 0, "maximum": 2},
                             "max_tokens": {"type": "integer", "default": 256, "minimum": 1, "maximum": 4096},
                             "seed": {"type": ["string", "integer"], "pattern": "^[0-9]+$"},
                             "top_p": {"type": "number", "default": 1.0}, "top_k": {"type": "integer", "default": 0},
                             "min_p": {"type": "number", "default": 0.0},
                             "repetition_penalty": {"type": "number", "default": 1.0},
                             "presence_penalty": {"type": "number", "default": 0.0},
                             "frequency_penalty": {"type": "number", "default": 0.0},
                             "stop": {"type": "array", "items": {"type": "string"}},
                             "thinking": {"type": "boolean", "default": False},
                             "thinking_budget_tokens": {"type": ["integer", "null"]}}}
RUN_REQUEST = {"title": "EvalRunRequest", "type": "object",
               "description": "exactly one of suite_name (registered) or suite (an inline EvalSuiteRequest)",
               "properties": {"suite_name": {"type": "string"}, "suite": SUITE_REQUEST,
                              "adapter": {"type": ["string", "null"], "description": "null or 'base': the base model"},
                              "generation": GENERATION}}
COMPARE_REQUEST = {"title": "EvalCompareRequest", "type": "object", "required": ["adapters"],
                   "description": "one suite against 1..8 targets, paired by example id",
                   "properties": {"suite_name": {"type": "string"}, "suite": SUITE_REQUEST,
                                  "adapters": {"type": "array", "minItems": 1, "maxItems": 8,
                                               "items": {"type": ["string", "null"]}},
                                  "generation": GENERATION}}
RERUN_REQUEST = {"title": "EvalRerunRequest", "type": "object",
                 "properties": {"adapter": {"type": ["string", "null"], "description": "default: the job's targets"},
                                "outcome_kinds": {"type": "array", "items": {"enum": ["pass", "fail", "invalid", "error"]},
                                                  "default": ["fail", "invalid", "error"]},
                                "include_pass": {"type": "boolean", "default": False},
                                "seed": {"type": ["string", "integer"], "description": "default: the job's seed"}}}

EvalRunRequest = _documented("EvalRunRequest", RUN_REQUEST)
EvalCompareRequest = _documented("EvalCompareRequest", COMPARE_REQUEST)
EvalRerunRequest = _documented("EvalRerunRequest", RERUN_REQUEST)
EvalReplayRequest = _documented("EvalReplayRequest", {
    "title": "EvalReplayRequest", "type": "object", "additionalProperties": False, "properties": {},
    "description": "no options: a strict replay re-uses the job's pinned suite, targets, settings and model"})


class EvalRunResponse(Schema):
    job_id: str
    state: str
    mode: str
    suite_name: str
    suite_hash: str
    effective_generation_hash: str
    seed: str
    targets: list[str | None]
    origin_job_id: str | None = None


class EvalJobSummary(Schema):
    job_id: str
    mode: str
    state: str
    progress: float
    progress_message: str
    suite_name: str
    suite_hash: str
    effective_generation_hash: str
    targets: list[str]
    counts: dict | None = None  # null with several targets (see target_counts)
    total: int | None = None
    accuracy: float | None = None  # null with several targets (see target_accuracies)
    target_accuracies: list[float | None] | None = None  # per target, in `targets` order
    target_counts: list[dict | None] | None = None  # per target, in `targets` order
    replay_status: str | None = None
    origin: dict | None = None
    created_at: datetime
    finished_at: datetime | None = None
    error: dict | None = None


class EvalResult(EvalJobSummary):
    model_config = ConfigDict(extra="allow")

    started_at: datetime | None = None
    source_suite_hash: str | None = None
    suite_source: str | None = None
    generation: dict
    model: dict
    targets: list[dict]
    examples: list[dict]
    table: list[dict]
    replay: dict | None = None
    results_path: str | None = None
    results_sha256: str | None = None
    metrics: dict
    evidence_error: dict | None = None  # {code, message, hint}: the results file or pinned suite changed since


class EvalJobDeleted(Schema):
    job_id: str
    status: str
