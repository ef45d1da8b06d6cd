"""The `kiln.grpo-policy-audit.v1` receipt object (spec §2.9), accumulated across a run.

Pure Python: imports neither torch nor Django (digests come from `core.canonical`).
Feed it the stats dict of every `losses.grpo_loss` call and, for recorded-policy runs, each
completion's behavior identity. It keeps only running sums, so its `state_dict()` fits in a
checkpoint's auxiliary state and `from_state()` restores it for an exact resume.

The three evidence blocks stay separate: importance ratios are always against the behavior
policy, KL figures always against the KL reference (before kl_coeff), and recorded provenance
counts the sampled/forced actions per behavior source.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from core.canonical import json_digest

POLICY_AUDIT_SCHEMA = "kiln.grpo-policy-audit.v1"
BEHAVIOR_SOURCE_SCHEMA = "kiln.grpo-behavior-source.v1"
BEHAVIOR_SOURCE_MANIFEST_SCHEMA = "kiln.grpo-behavior-source-manifest.v1"
_IDENTITY_FIELDS = ("behavior_policy", "tokenizer", "template_invocation", "sampling", "generation_backend")


def behavior_source_sha256(provenance: dict[str, Any]) -> str:
    """Digest of a rollout's behavior-source identity (the fields of `kiln.rollout-provenance.v1`
    that say what sampled it), over canonical JSON with the `kiln.grpo-behavior-source.v1` schema."""
    identity = {"schema": BEHAVIOR_SOURCE_SCHEMA, **{k: provenance.get(k) for k in _IDENTITY_FIELDS}}
    try:
        plain = json.dumps(identity, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # not plain JSON: canonical JSON says what is wrong
        return json_digest(identity)
    return _digest_of_plain_json(plain)


# Canonical JSON (rfc8785, pure Python) of an identity costs ~0.2 ms and a corpus repeats one
# identity for thousands of completions, so digests are remembered by the identity's stdlib JSON
# (C-accelerated; it loads back to the same value, so a hit is always the right digest).
@functools.lru_cache(maxsize=4096)
def _digest_of_plain_json(plain: str) -> str:
    return json_digest(json.loads(plain))


@dataclass
class PolicyAuditAccumulator:
    ratio_scope: str | None = None
    action_tokens: int = 0
    ratio_observations: int = 0
    ratio_sum: float = 0.0
    ratio_min: float | None = None
    ratio_max: float | None = None
    below_clip_count: int = 0
    above_clip_count: int = 0
    kl_token_observations: int = 0
    kl_entropy_mask_applied_tokens: int = 0
    kl_log_ratio_sum: float = 0.0
    kl_estimator_sum: float = 0.0
    kl_masked_estimator_sum: float = 0.0
    recorded_completions: int = 0
    recorded_sampled_actions: int = 0
    recorded_forced_actions: int = 0
    behavior_sources: dict[str, dict[str, Any]] = field(default_factory=dict)

    def observe_step(self, stats: dict[str, Any]) -> None:
        """Merge one `grpo_loss` stats dict."""
        if self.ratio_scope not in (None, stats["ratio_scope"]):
            raise ValueError("the importance-ratio scope changed within one run")
        self.ratio_scope = stats["ratio_scope"]
        self.action_tokens += stats["action_tokens"]
        if stats["ratio_observations"]:
            self.ratio_observations += stats["ratio_observations"]
            self.ratio_sum += stats["ratio_sum"]
            self.ratio_min = _merge(min, self.ratio_min, stats["ratio_min"])
            self.ratio_max = _merge(max, self.ratio_max, stats["ratio_max"])
        self.below_clip_count += stats["below_clip_count"]
        self.above_clip_count += stats["above_clip_count"]
        self.kl_token_observations += stats["kl_token_observations"]
        self.kl_entropy_mask_applied_tokens += stats["kl_entropy_mask_applied_tokens"]
        self.kl_log_ratio_sum += stats["kl_log_ratio_sum"]
        self.kl_estimator_sum += stats["kl_estimator_sum"]
        self.kl_masked_estimator_sum += stats["kl_masked_estimator_sum"]

    def observe_recorded_completion(self, provenance: dict[str, Any]) -> None:
        """Count one recorded-policy completion (its `kiln.rollout-provenance.v1` object)."""
        tokens = provenance.get("action_tokens") or []
        sampled = sum(1 for t in tokens if t.get("source") == "sampled")
        forced = len(tokens) - sampled
        digest = behavior_source_sha256(provenance)
        source = self.behavior_sources.setdefault(
            digest,
            {
                "behavior_source_sha256": digest,
                # spec §2.9: each source is {behavior_source_sha256, counts, <identity fields>}
                "counts": {"completion_count": 0, "sampled_action_tokens": 0, "forced_action_tokens": 0},
                **{k: provenance.get(k) for k in _IDENTITY_FIELDS},
            },
        )
        counts = source["counts"]
        counts["completion_count"] += 1
        counts["sampled_action_tokens"] += sampled
        counts["forced_action_tokens"] += forced
        self.recorded_completions += 1
        self.recorded_sampled_actions += sampled
        self.recorded_forced_actions += forced

    def to_receipt(self) -> dict[str, Any]:
        n = self.ratio_observations
        outside = self.below_clip_count + self.above_clip_count
        k = self.kl_token_observations
        sources = [self.behavior_sources[key] for key in sorted(self.behavior_sources)]
        provenance: dict[str, Any] = {
            "completion_count": self.recorded_completions,
            "sampled_action_tokens": self.recorded_sampled_actions,
            "forced_action_tokens": self.recorded_forced_actions,
            "unique_behavior_sources": len(sources),
        }
        if sources:
            provenance["behavior_source_manifest_sha256"] = json_digest(
                {"schema": BEHAVIOR_SOURCE_MANIFEST_SCHEMA, "sources": sources}
            )
            provenance["behavior_sources"] = sources
        return {
            "schema": POLICY_AUDIT_SCHEMA,
            "importance_sampling": {
                "ratio_scope": self.ratio_scope,
                "action_tokens": self.action_tokens,
                "ratio_observations": n,
                "mean_ratio": self.ratio_sum / n if n else None,
                "min_ratio": self.ratio_min,
                "max_ratio": self.ratio_max,
                "below_clip_count": self.below_clip_count,
                "above_clip_count": self.above_clip_count,
                "outside_clip_fraction": outside / n if n else None,
            },
            "kl_reference": {
                "token_observations": k,
                "entropy_mask_applied_tokens": self.kl_entropy_mask_applied_tokens,
                "mean_policy_reference_log_ratio": self.kl_log_ratio_sum / k if k else None,
                "mean_estimator": self.kl_estimator_sum / k if k else None,
                "mean_masked_estimator": self.kl_masked_estimator_sum / k if k else None,
            },
            "recorded_provenance": provenance,
        }

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PolicyAuditAccumulator:
        return cls(**state)


def _merge(pick, current: float | None, new: float | None) -> float | None:
    if current is None:
        return new
    if new is None:
        return current
    return pick(current, new)
