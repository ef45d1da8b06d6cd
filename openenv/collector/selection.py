"""Training selection and corpus lineage of a collected OpenEnv corpus (reference-spec §4.6, §2.5, §2.8).

Pure module: no Django, no torch. `select_for_training(groups)` takes the canonical AgenticGroups
(the published JSONL, in order) and decides what the optimizer may see:
- a completion that ended in `MODEL_ACTION_NO_OUTPUT` (generation stopped while the policy was
  still thinking: there was no action to score) is dropped from optimizer input; the artifacts
  keep it;
- a group left with no completion, or whose remaining rewards are all equal (its group-relative
  advantages are uniformly zero), is skipped.
Each decision is one warning. The result carries the `training_selection` block of the summary
(`groups_submitted, rollouts_submitted, no_output_rollouts_discarded,
no_usable_output_groups_skipped, no_reward_gradient_groups_skipped, warnings`) and the kept
groups, unchanged. `training_data(groups, environments)` is `kiln.openenv-training-data.v1`
over the kept groups, with its `group_plan_sha256`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

NO_OUTPUT = "MODEL_ACTION_NO_OUTPUT"
TRAINING_DATA_SCHEMA = "kiln.openenv-training-data.v1"
GROUP_PLAN_SCHEMA = "kiln.openenv-group-plan.v1"
GROUP_PLAN_ITEM_SCHEMA = "kiln.openenv-group-plan-item.v1"
TERMINATIONS = ("done", "max_steps", "invalid_model_action", "protocol_error")


@dataclass(frozen=True)
class Selection:
    groups: list[dict]  # the kept groups (each with its kept completions), in corpus order
    indexes: list[int]  # each kept group's index in the corpus
    summary: dict  # the summary's `training_selection`

    @property
    def warnings(self) -> list[str]:
        return list(self.summary["warnings"])


def harness_error(completion: dict) -> dict | None:
    """The harness error (`{code, message}`) that ended a model-failed candidate (its last warning
    segment), if any."""
    for segment in reversed(completion.get("trajectory") or []):
        if segment.get("kind") != "observation":
            continue
        try:
            value = json.loads(segment.get("content") or "")
        except ValueError:
            return None
        error = value.get("openenv_harness_error") if isinstance(value, dict) else None
        return error if isinstance(error, dict) else None
    return None


def harness_error_code(completion: dict) -> str | None:
    error = harness_error(completion)
    return error.get("code") if error is not None else None


def is_no_output(completion: dict) -> bool:
    record = completion.get("openenv") or {}
    return record.get("termination") == "invalid_model_action" and harness_error_code(completion) == NO_OUTPUT


def select_for_training(groups: list[dict]) -> Selection:
    kept_groups, indexes, warnings = [], [], []
    discarded = empty = flat = rollouts = 0
    for index, group in enumerate(groups):
        seed = ((group["completions"][0].get("openenv") or {}).get("seed")) if group["completions"] else None
        where = f"group {index}" + (f" (seed {seed})" if seed is not None else "")
        kept = []
        for candidate, completion in enumerate(group["completions"]):
            if is_no_output(completion):
                discarded += 1
                warnings.append(f"{where} candidate {candidate}: discarded from optimizer input ({NO_OUTPUT}: "
                                "generation ended while the policy was still thinking)")
            else:
                kept.append(completion)
        if not kept:
            empty += 1
            warnings.append(f"{where}: skipped, no usable completion remains")
            continue
        if len({float(c["reward"]) for c in kept}) == 1:
            flat += 1
            warnings.append(f"{where}: skipped, all {len(kept)} remaining rewards equal {float(kept[0]['reward']):g} "
                            "(no reward gradient)")
            continue
        kept_groups.append({**group, "completions": kept})
        indexes.append(index)
        rollouts += len(kept)
    summary = {"groups_submitted": len(kept_groups), "rollouts_submitted": rollouts,
               "no_output_rollouts_discarded": discarded, "no_usable_output_groups_skipped": empty,
               "no_reward_gradient_groups_skipped": flat, "warnings": warnings}
    return Selection(kept_groups, indexes, summary)


def _compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def group_plan_sha256(groups: list[dict], group_indexes: list[int]) -> str:
    """sha256 of `kiln.openenv-group-plan.v1\\0` then, per group, an 8-byte big-endian length and the
    compact JSON of its plan item."""
    digest = hashlib.sha256(GROUP_PLAN_SCHEMA.encode() + b"\0")
    for group, index in zip(groups, group_indexes, strict=True):
        record = group["completions"][0]["openenv"]
        item = _compact({"schema": GROUP_PLAN_ITEM_SCHEMA, "group_index": index,
                         "environment_name": record["environment_name"],
                         "environment_base_url": record["environment_base_url"],
                         "openapi_version": record.get("openapi_version"),
                         "discovery_sha256": record.get("discovery_sha256"),
                         "environment_schema_sha256": record["environment_schema_sha256"],
                         "action_schema_sha256": record["action_schema_sha256"],
                         "reset_sha256": record["reset_sha256"], "seed": record["seed"],
                         "rollouts": len(group["completions"])})
        digest.update(len(item).to_bytes(8, "big") + item)
    return "sha256:" + digest.hexdigest()


def _terminations(completions: list[dict]) -> dict:
    counts = dict.fromkeys(TERMINATIONS, 0)
    for completion in completions:
        termination = completion["openenv"]["termination"]
        counts[termination] = counts.get(termination, 0) + 1
    return counts


def training_data(groups: list[dict], group_indexes: list[int]) -> dict:
    """`kiln.openenv-training-data.v1` of the groups submitted for training."""
    completions = [c for g in groups for c in g["completions"]]
    seeds = sorted({g["completions"][0]["openenv"]["seed"] for g in groups})
    policies = {json.dumps(c["openenv"].get("behavior_policy"), sort_keys=True) for c in completions}
    environments: dict[str, dict] = {}
    for group in groups:
        record = group["completions"][0]["openenv"]
        entry = environments.setdefault(record["environment_base_url"], {
            "environment_name": record["environment_name"], "environment_base_url": record["environment_base_url"],
            "openapi_version": record.get("openapi_version"), "discovery_sha256": record.get("discovery_sha256"),
            "environment_schema_sha256": record["environment_schema_sha256"],
            "action_schema_sha256": record["action_schema_sha256"], "groups": 0, "rollouts": 0, "total_steps": 0,
            "terminations": dict.fromkeys(TERMINATIONS, 0)})
        entry["groups"] += 1
        entry["rollouts"] += len(group["completions"])
        entry["total_steps"] += sum(c["openenv"]["steps"] for c in group["completions"])
        for key, count in _terminations(group["completions"]).items():
            entry["terminations"][key] = entry["terminations"].get(key, 0) + count
    out = {"schema": TRAINING_DATA_SCHEMA, "groups": len(groups), "rollouts": len(completions),
           "unique_seeds": len(seeds), "seed_min": str(seeds[0]) if seeds else None,
           "seed_max": str(seeds[-1]) if seeds else None,
           "total_steps": sum(c["openenv"]["steps"] for c in completions),
           "terminations": _terminations(completions), "group_plan_sha256": group_plan_sha256(groups, group_indexes)}
    if len(policies) == 1:
        policy = completions[0]["openenv"].get("behavior_policy") if completions else None
        if policy is not None:
            out["behavior_policy"] = policy
    out["environments"] = [environments[url] for url in sorted(environments)]
    return out
