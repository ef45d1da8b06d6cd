"""Admission of GRPO training requests: one source, a valid config, a pinned snapshot, a queued job.

Nothing is queued until the whole corpus validated; the snapshot is written (read-only) before the
job row exists, and a refusal after that removes it again, so a failed submission leaves nothing.
The request contract (GrpoConfig) is the torch-free `core.contracts.grpo_config`/`submission` pair.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction

from adapters.selectors import adapter_published_path
from adapters.services import adapter_reserve, check_output_name_free, validate_adapter_name
from core.artifacts import CHECKPOINT_MANIFEST
from core.confined_paths import PathRefused, confined_file
from core.contracts.groups import (
    MAX_COMPLETIONS_PER_GROUP,
    REWARD_RANGE,
    AdmittedCorpus,
    GroupError,
    admit_groups,
    admit_jsonl,
    check_corpus_size,
)
from core.contracts.grpo_config import (
    GrpoConfig,
    comparable_config,
    ignored_key_warnings,
    resolve_effective_seed,
)
from core.contracts.grpo_submission import DRY_RUN_MODE, GrpoSubmission
from core.contracts.grpo_values import GrpoConfigError
from core.errors import KilnError
from core.jobs.services import job_submit
from core.model_weights import require_model_weights
from training.base_adapter_shape import base_adapter_shape_problem
from training.config_defaults import apply_training_defaults
from training.memory_preflight import check_step_memory, memory_plan
from training.payloads import GrpoJobPayload
from training.post_eval_admission import gate_warnings
from training.reward_contrast import groups_with_reward_contrast, reward_contrast_warnings
from training.selectors import checkpoint_manifest_sha256
from training.snapshots import pin_snapshot, unpin_snapshot

INLINE_SOURCES = ("groups", "agentic_groups", "rollouts")


# Fields of a training request that a user may put inside `config` by mistake.
TOP_LEVEL_FIELDS = ("post_eval", "groups", "rollouts", "dataset", "dataset_path", "dataset_split")
# The fix for a refusal on a field, where the raising site has nothing more specific to say.
FIELD_HINTS = (
    ("source", "send exactly one of groups (inline), dataset_path (a JSONL file on the server) or dataset "
               "(a registered dataset's name)"),
    ("dataset_split", "dataset_split picks a partition of a named dataset (with dataset, not groups or dataset_path)"),
    ("dataset_path", "an absolute path to a JSONL file of groups under one of the server's allowed roots"),
    ("dataset", "list registered datasets with GET /v1/eval/datasets"),
    ("config.base_adapter", "list published adapters with `kiln adapters list`; the first round starts from the "
                            "base model (leave base_adapter out)"),
    ("config", "the config's fields, types and bounds are GrpoConfig in GET /v1/openapi.json; the server's defaults "
               "are in GET /v1/config"),
    ("post_eval", "post_eval is {suite, data_scope?, generation?, min_accuracy?, include_baseline?}: an installed "
                  "suite (kiln eval suites list); min_accuracy in [0, 1] makes it a promotion gate"),
    ("request", "send one JSON object: {groups | dataset_path | dataset, config, post_eval?}"),
)
# What core.contracts.groups accepts: 1..MAX_COMPLETIONS_PER_GROUP completions (the guide's "one or more").
GROUP_HINT = (f"each group is {{messages, completions: [{{text, reward}}, ...]}} with 1 to {MAX_COMPLETIONS_PER_GROUP} "
              f"completions whose rewards are {REWARD_RANGE}; only a group whose rewards differ trains under the "
              "default dynamic_sampling (rollout-generate writes this format)")


def field_hint(field: str) -> str:
    """The fix for a refusal on `field` (FIELD_HINTS; the group format for a group's fields)."""
    return next((text for prefix, text in FIELD_HINTS if field == prefix or field.startswith(prefix + ".")),
                GROUP_HINT if field.startswith(("groups", "rollouts", "line", "group")) else "")


def _invalid(message: str, field: str, hint: str = "") -> KilnError:
    return KilnError("training_invalid_request", f"{field}: {message}", hint=hint or field_hint(field), status=400,
                     field=field)


def _read_dataset_path(value) -> tuple[AdmittedCorpus, dict]:
    if not isinstance(value, str) or not os.path.isabs(value):
        raise _invalid("must be an absolute path on the server", "dataset_path",
                       "the server reads the file itself: pass realpath of the file")
    try:
        path = confined_file(value, settings.KILN.dataset_roots, private=settings.KILN.home)
    except PathRefused as exc:
        raise _invalid(exc.message.split(": ", 1)[1], "dataset_path", exc.hint) from None
    try:
        check_corpus_size(path.stat().st_size)
    except GroupError as exc:
        raise _invalid(exc.message, "dataset_path") from None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _invalid(f"cannot read {value}: {exc.strerror}", "dataset_path") from None
    try:
        corpus = admit_jsonl(data)
    except GroupError as exc:
        _refuse_summary(data)
        where = exc.field if exc.field.startswith("dataset_path") else f"dataset_path {exc.field}"
        raise _invalid(str(exc).split(": ", 1)[1], where) from None
    return corpus, {"source": "dataset_path", "path": value}


# Summaries written next to the rollouts, and where each records its rollouts file. (The OpenEnv
# collector's schema is spelled out: training may not import the openenv app above it.)
SUMMARY_ROLLOUTS = {"kiln.rollout-generate-summary.v1": ("output", "path"),
                    "kiln.openenv-rollout-summary.v5": ("configuration", "output_path")}


def _refuse_summary(data: bytes) -> None:
    """A file that is not JSONL of groups but the run summary beside them (pretty JSON, so its line 1
    is `{`) would be answered "line 1: is not valid JSON": say what it is and which file to send."""
    if data.lstrip()[:1] != b"{":
        return
    try:
        summary = json.loads(data)
    except ValueError:
        return
    schema = summary.get("schema") if isinstance(summary, dict) else None
    if schema not in SUMMARY_ROLLOUTS:
        return
    block, key = SUMMARY_ROLLOUTS[schema]
    holder = summary.get(block)
    rollouts = holder.get(key) if isinstance(holder, dict) else None
    send = f"its rollouts file {rollouts}" if isinstance(rollouts, str) and rollouts else "the rollouts JSONL beside it"
    raise _invalid(f"is a rollout summary ({schema}), not the rollouts: send {send} instead", "dataset_path",
                   f"the summary describes the run; the groups to train on are in the JSONL file it names "
                   f"({block}.{key})")


def _read_named_dataset(name, split) -> tuple[AdmittedCorpus, dict]:
    """A registered grpo_groups dataset's partition (default train), admitted like a streamed file:
    the partition file is server-local JSONL, checked in full and pinned by the caller's snapshot."""
    from evaluations.dataset_selectors import dataset_get, dataset_partition
    from evaluations.datasets.split import PARTITIONS

    if not isinstance(name, str) or not name.strip():
        raise _invalid("must be a dataset's name (a non-empty string)", "dataset",
                       "list datasets with GET /v1/eval/datasets")
    dataset = dataset_get(name=name)
    if dataset is None:
        raise KilnError("dataset_not_found", f"dataset: no dataset named {name!r}", status=404, field="dataset",
                        hint="list datasets with GET /v1/eval/datasets, or upload one with kiln eval datasets upload")
    split = "train" if split is None else split
    if split not in PARTITIONS:
        raise _invalid(f"must be one of {', '.join(PARTITIONS)}", "dataset_split")
    if dataset.format != "grpo_groups":
        raise _invalid(f"dataset {name!r} has format {dataset.format}; GRPO trains on grpo_groups", "dataset")
    partition = dataset_partition(dataset=dataset, partition=split)
    if not partition.data.strip():
        raise _invalid(f"partition {split} of dataset {name!r} is empty", "dataset_split",
                       "choose another split, or re-split the dataset (kiln eval datasets split)")
    try:
        corpus = admit_jsonl(partition.data)
    except GroupError as exc:
        raise _invalid(str(exc).split(": ", 1)[1], f"dataset {exc.field}") from None
    return corpus, {"source": "named_dataset", "dataset": name, "split": split, "path": str(partition.path),
                    "dataset_corpus_sha256": partition.corpus_sha256,
                    "split_manifest_sha256": partition.split_manifest_sha256}


def _admit_source(body: dict) -> tuple[AdmittedCorpus, dict]:
    present = [k for k in (*INLINE_SOURCES, "dataset_path", "dataset") if body.get(k) is not None]
    if len(present) != 1:
        raise _invalid(f"give exactly one source (groups, dataset_path or dataset); got "
                       f"{', '.join(present) or 'none'}", "source")
    source = present[0]
    if body.get("dataset_split") is not None and source != "dataset":
        raise _invalid("is only valid with dataset", "dataset_split")
    if source == "dataset":
        return _read_named_dataset(body["dataset"], body.get("dataset_split"))
    if source == "dataset_path":
        return _read_dataset_path(body["dataset_path"])
    try:
        return admit_groups(body[source]), {"source": "inline"}
    except GroupError as exc:
        raise _invalid(str(exc).split(": ", 1)[1], exc.field) from None


def _parse_submission(body: dict) -> tuple[GrpoSubmission, dict[str, str]]:
    """The request's config over the server's [training.defaults] over GrpoConfig's own defaults:
    the one place every route (typed, streamed dataset_path, named dataset, UI, OpenEnv) builds
    its effective config. Returns the submission and each config field's source."""
    defaults = settings.KILN.training_defaults
    config = body.get("config")
    misplaced = sorted(k for k in TOP_LEVEL_FIELDS if isinstance(config, dict) and k in config)
    if misplaced:
        # Unknown config keys are allowed (spec §3), but a request field put inside config would be
        # ignored silently: a post_eval there would train with no gate at all.
        raise _invalid(f"{misplaced[0]} is a field of the request, not of its config; inside config it would be "
                       "ignored", f"config.{misplaced[0]}",
                       f"move {misplaced[0]} out of config, next to it at the top level of the request")
    merged, sources = apply_training_defaults(config, defaults)
    try:
        return GrpoSubmission.from_request({**body, "config": merged}), sources
    except GrpoConfigError as exc:
        field = exc.field if exc.field.startswith(("config", "post_eval")) else f"config.{exc.field}"
        # The defaults note only where the server's table sets the refused field (alone, or merged with
        # the request's): elsewhere it would send the user looking in the wrong place.
        from_defaults = field.removeprefix("config.").split(".")[0] in (defaults or {})
        hint = exc.hint or ("this config combines the request with the server's [training.defaults] (GET /v1/config)"
                            if from_defaults else field_hint(field))
        raise KilnError(getattr(exc, "code", "training_invalid_request"), f"{field}: {exc.message}",
                        status=400, field=field, hint=hint) from None


def _check_recorded(corpus: AdmittedCorpus, base_adapter_name: str | None) -> None:
    from adapters.selectors import adapter_get
    from adapters.serving.selectors import served_model_identity
    from training.recorded_admission import check_recorded_corpus

    base = None
    if base_adapter_name:
        adapter = adapter_get(name=base_adapter_name)
        base = {"name": adapter.name, "content_sha256": adapter.content_sha256}
    check_recorded_corpus(corpus.groups, model_identity=served_model_identity(), base_adapter=base)


def _check_checkpoint(value: str, output_name: str, corpus: AdmittedCorpus, source_kind: str) -> None:
    """Refuse at submission what the GPU worker would refuse at dequeue anyway: a checkpoint that is
    not in the adapter registry, one of another adapter, or one trained on other data (the worker's
    `check_resumable` compares the manifest's data.source_kind and data.content_sha256 with the job's
    training_data source and admitted_corpus_sha256). The worker still re-validates every file and
    the whole identity: config, base model, tokenizer."""
    registry = settings.KILN.layout.adapters
    path = settings.KILN.layout.checkpoint(value)
    manifest_path = path / CHECKPOINT_MANIFEST if path else None
    if manifest_path is None or not manifest_path.is_file():
        where = "is not directly beneath" if path is None else "is not a checkpoint folder in"
        raise KilnError("checkpoint_not_found", f"config.resume_checkpoint: {value!r} {where} the adapter "
                        f"registry {registry}", status=400, field="config.resume_checkpoint",
                        hint="name a checkpoint the job detail's latest_checkpoint shows, e.g. "
                             "<adapter>-checkpoint-step-00000025.kiln-checkpoint")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return  # unreadable: the worker names why (checkpoint_invalid)
    if not isinstance(manifest, dict):
        return
    owner = manifest.get("adapter_name")
    if isinstance(owner, str) and owner != output_name:
        raise KilnError("checkpoint_adapter_mismatch", f"config.resume_checkpoint: checkpoint {path.name} belongs to "
                        f"adapter {owner!r}, not {output_name!r}", status=409, field="config.resume_checkpoint",
                        hint=f"an exact resume continues the same run: set output_name {owner!r}")
    _check_checkpoint_data(path.name, manifest.get("data"), corpus, source_kind)


# training_data.source (a checkpoint's data.source_kind) -> how the request sent its groups.
SOURCE_ROUTES = {"inline": "inline groups", "dataset_path": "dataset_path", "named_dataset": "a named dataset"}


def _check_checkpoint_data(name: str, data, corpus: AdmittedCorpus, source_kind: str) -> None:
    """The checkpoint's run must have trained on these very bytes, sent the same way."""
    if not isinstance(data, dict) or not isinstance(data.get("content_sha256"), str):
        return  # no data record: the worker names why (checkpoint_invalid)
    recorded_kind, recorded_sha = data.get("source_kind"), data["content_sha256"]
    if recorded_sha == corpus.sha256 and recorded_kind == source_kind:
        return
    if recorded_sha == corpus.sha256:
        was, now = (SOURCE_ROUTES.get(k, str(k)) for k in (recorded_kind, source_kind))
        what = f"the same data sent as {was}, not {now}"
        fix = f"send it as that run did ({was})"
    else:
        what = f"other data ({recorded_sha}; this request's is {corpus.sha256})"
        fix = "send the exact file that run trained on, unchanged"
    raise KilnError("checkpoint_source_mismatch", f"config.resume_checkpoint: checkpoint {name} was trained on "
                    f"{what}", status=409, field="config.resume_checkpoint",
                    hint=f"a resume continues the same run on the same data: {fix}, or leave resume_checkpoint out "
                         "to start a new run on this data")


def _check_checkpoint_config(value: str, effective: GrpoConfig) -> None:
    """The worker's `checkpoint_config_mismatch`, before queueing: a resume trains with the config the
    checkpoint's run had (only how-to-run fields may differ: comparable_config)."""
    path = settings.KILN.layout.checkpoint(value)
    try:
        recorded = json.loads((path / CHECKPOINT_MANIFEST).read_text())["effective_config"] if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return  # unreadable: the worker names why (checkpoint_invalid)
    if not isinstance(recorded, dict):
        return
    old, new = comparable_config(recorded), comparable_config(effective.to_dict())
    if not set(new) <= set(old):
        return  # not a whole effective config: the worker names what is wrong with the checkpoint
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:4])
        raise KilnError("checkpoint_config_mismatch", f"config.resume_checkpoint: checkpoint {path.name} was trained "
                        f"with another config ({shown})", status=409, field="config.resume_checkpoint",
                        hint="a resume continues the same run with the same config: resend the interrupted job's "
                             "request with resume_checkpoint set (kiln train resume --job-id ID does it)")


def _checkpoint_seed(value: str) -> int | None:
    """The effective seed the checkpoint's run used: a resume without a seed inherits it (an exact
    resume needs the same one). None when the checkpoint cannot be read; the worker then names why."""
    path = settings.KILN.layout.checkpoint(value)
    try:
        seed = json.loads((path / CHECKPOINT_MANIFEST).read_text())["effective_config"]["seed"] if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(seed) if isinstance(seed, str | int) and str(seed).isdigit() else None


def _require_evaluation_allowed() -> None:
    """post_eval queues an evaluation once the adapter publishes: under a profile that refuses
    evaluation (maintenance) its gate could only end in `error`, so the run is refused before it trains."""
    from core.profiles import profile_refuses

    profile = profile_refuses("evaluation")
    if profile:
        raise KilnError("inference_disabled_by_profile",
                        f"post_eval runs an evaluation, which the {profile} serving profile refuses", status=503,
                        field="post_eval",
                        hint="train without post_eval now, then restart in the stable profile "
                             "(KILN_SERVER_SERVING_PROFILE=stable) and evaluate the adapter with kiln eval run")


@dataclass(frozen=True)
class GrpoAdmission:
    """A GRPO request that passed every admission check: what queueing (or a dry run's plan) needs."""

    submission: GrpoSubmission
    config_sources: dict
    server_defaults: dict
    corpus: AdmittedCorpus
    provenance: dict
    suite_pin: dict | None
    output_name: str
    effective: GrpoConfig
    seed: int
    resume_manifest_sha256: str | None = None  # the resumed checkpoint's manifest as admitted
    memory: dict | None = None  # the largest step's memory against the budget (training.memory_preflight)


def grpo_admit(*, body: dict, sealed_sources: tuple | None = None) -> GrpoAdmission:
    """Every check a GRPO request passes before it is queued; stores nothing (KilnError otherwise)."""
    if not isinstance(body, dict):
        raise _invalid("must be a JSON object", "request")
    # Refused here, not queued to fail when a worker picks it up (the runner checks again: a worker
    # may be started with other settings than the web process).
    require_model_weights()
    submission, config_sources = _parse_submission(body)
    server_defaults = dict(settings.KILN.training_defaults)
    if sealed_sources is not None:
        config_sources, server_defaults = dict(sealed_sources[0]), dict(sealed_sources[1])
    config = submission.config
    corpus, provenance = _admit_source(body)
    if config.behavior_policy == "recorded" and corpus.with_provenance != corpus.rollouts:
        missing = corpus.rollouts - corpus.with_provenance
        raise _invalid(f"behavior_policy recorded needs provenance on every rollout; {missing} of "
                       f"{corpus.rollouts} have none", "config.behavior_policy",
                       "regenerate with kiln rollout-generate, or use no_importance_correction on purpose")
    suite_pin = None
    if submission.post_eval is not None:
        from training.post_eval_admission import check_post_eval, submitted_rows

        _require_evaluation_allowed()
        suite_pin = check_post_eval(submission.post_eval, submitted_rows(body, provenance))
    if config.base_adapter:
        base_path = adapter_published_path(name=config.base_adapter)
        if base_path is None:
            raise _invalid(f"no published adapter named {config.base_adapter!r}", "config.base_adapter")
        shape = base_adapter_shape_problem(base_path, rank=config.lora_rank, alpha=config.lora_alpha)
        if shape:
            raise _invalid(shape[0], "config.lora_rank", shape[1])
    if config.behavior_policy == "recorded":
        _check_recorded(corpus, config.base_adapter)
    output_name = config.output_name or f"grpo-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    validate_adapter_name(output_name, field="config.output_name")
    check_output_name_free(output_name, field="config.output_name")
    # Pinned before the checks read the manifest: a checkpoint replaced meanwhile fails at dequeue.
    resume_manifest_sha256 = checkpoint_manifest_sha256(name=config.resume_checkpoint)
    if config.resume_checkpoint:
        _check_checkpoint(config.resume_checkpoint, output_name, corpus, provenance["source"])
    if config.seed is None and config.resume_checkpoint:
        config = config.with_seed(_checkpoint_seed(config.resume_checkpoint) or resolve_effective_seed(config))
    seed = resolve_effective_seed(config)
    effective = config.with_seed(seed)
    if config.resume_checkpoint:
        _check_checkpoint_config(config.resume_checkpoint, effective)
    memory = check_step_memory(corpus.groups, effective)  # 413 training_will_not_fit
    return GrpoAdmission(submission=submission, config_sources=config_sources, server_defaults=server_defaults,
                         corpus=corpus, provenance=provenance, suite_pin=suite_pin, output_name=output_name,
                         effective=effective, seed=seed, resume_manifest_sha256=resume_manifest_sha256,
                         memory=memory)


def grpo_dry_run(*, body: dict) -> dict:
    """`dry_run: true`: the request is admitted exactly as a real one and planned, but nothing is
    queued, reserved or written (no job, no adapter, no train receipt: spec §7 writes one for every
    non-dry run). The plan counts what the trainer's filters would keep by rewards alone (dynamic
    sampling drops a group whose rewards are all equal); token-level checks happen at training."""
    admission = grpo_admit(body=body)
    groups = admission.corpus.groups
    with_contrast = groups_with_reward_contrast(groups)
    effective = admission.effective
    return {
        "mode": DRY_RUN_MODE, "dry_run": True, "would_publish": admission.output_name,
        "effective_seed": str(admission.seed), "effective_config": effective.to_dict(),
        "config_sources": admission.config_sources,
        "ignored_config_keys": sorted(effective.ignored_keys),
        "warnings": ignored_key_warnings(sorted(effective.ignored_keys)) + gate_warnings(admission.submission.post_eval)
        + reward_contrast_warnings(with_contrast=with_contrast, rows=len(groups),
                                   dynamic_sampling=effective.dynamic_sampling),
        "training_data": {**admission.provenance, "admitted_corpus_sha256": admission.corpus.sha256,
                          "rows": len(groups), "rollouts": admission.corpus.rollouts},
        "groups_with_reward_contrast": with_contrast,
        "groups_without_reward_contrast": len(groups) - with_contrast,
        "post_eval": admission.submission.post_eval.to_dict() if admission.submission.post_eval else None,
        "post_eval_suite_hash": admission.suite_pin and admission.suite_pin["suite_hash"],
        # The largest step's memory estimate, against the budget when one is set (else budget_mib null).
        "memory": admission.memory or memory_plan(groups, effective, None),
        "message": f"dry run: the request is valid; nothing was queued (it would publish {admission.output_name})",
    }


def grpo_submit(*, body: dict, user=None, route: str = "/v1/train/grpo", sealed_sources: tuple | None = None,
                openenv_lineage: dict | None = None) -> tuple:
    """Validate and queue a GRPO request. Returns (job, effective_seed).

    `sealed_sources` = (config_sources, server_training_defaults) for a config whose server defaults
    were merged in earlier and sealed (an OpenEnv run's contract): the receipt then says where each
    field came from at sealing, not "request" for every field of the complete config.
    `openenv_lineage`: an OpenEnv run's `kiln.openenv-training-data.v1` for the groups it submits,
    kept as the job's `training_data.openenv` and in its receipt (reference-spec §1.1, §2.9).
    A `dry_run: true` request is answered by grpo_dry_run, never queued here."""
    admission = grpo_admit(body=body, sealed_sources=sealed_sources)
    if admission.submission.dry_run:
        raise _invalid("is answered by grpo_dry_run, which queues nothing", "dry_run")
    corpus, effective, output_name = admission.corpus, admission.effective, admission.output_name
    snapshot = pin_snapshot(corpus)
    try:
        with transaction.atomic():
            payload = GrpoJobPayload(
                route=route, adapter_name=output_name, config=effective, snapshot_path=str(snapshot),
                training_data={**admission.provenance, "admitted_corpus_sha256": corpus.sha256,
                               "rows": len(corpus.groups), "rollouts": corpus.rollouts,
                               "groups_with_reward_contrast": groups_with_reward_contrast(corpus.groups),
                               **({"openenv": openenv_lineage} if openenv_lineage else {})},
                post_eval=admission.submission.post_eval,
                post_eval_suite_hash=admission.suite_pin and admission.suite_pin["suite_hash"],
                ignored_config_keys=tuple(sorted(effective.ignored_keys)),
                dry_run=False,
                config_sources=admission.config_sources,
                server_training_defaults=admission.server_defaults,
                resume_manifest_sha256=admission.resume_manifest_sha256,
            )
            job = job_submit(kind="training.grpo", payload=payload, title=f"GRPO → {output_name}", user=user)
            adapter_reserve(name=output_name, job=job, base_adapter=effective.base_adapter or "")
    except BaseException:
        unpin_snapshot(snapshot, corpus.sha256)
        raise
    return job, admission.seed
