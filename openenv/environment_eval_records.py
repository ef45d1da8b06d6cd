"""The records of an environment evaluation (reference-spec §1.6, §2.8): the eval plan and its seed
interval, each side's result, the shared execution and the `kiln.openenv-environment-evaluation.v1`
receipt body and file. Pure module: no Django, no ORM, no torch (import-linter checks it). The runner is
`openenv.environment_eval`, which re-exports every public name here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from core.artifacts import ArtifactError, publish_together
from core.canonical import canonical_json, json_digest, sha256_digest
from openenv.client.actions import I64_MAX
from openenv.collector import CollectionConfig, CollectionError
from openenv.collector.collect import Bundle
from openenv.environment_gate import (
    MIN_PAIRED_GROUPS,
    EnvironmentGateResult,
    GateThresholds,
    outcome_consistent,
)

RECEIPT_SCHEMA = "kiln.openenv-environment-evaluation.v1"
EXECUTION_SCHEMA = "kiln.openenv-environment-evaluation-execution.v1"
SIDES = ("baseline", "candidate")
FILES = {"dataset": "rollouts.jsonl", "replay": "replay.json", "summary": "summary.json"}
RECEIPT_FILE = "receipt.json"
# summary keys that may differ between the sides (who ran, where the files went); the rest must agree
SIDE_KEYS = frozenset({"adapter", "adapter_label", "behavior_policy", "output_path", "replay_output_path",
                       "summary_output_path", "kiln_url"})
EXECUTION_KEYS = ("groups", "group_size", "rollout_count", "max_steps", "concurrency", "max_action_tokens",
                  "thinking_budget_tokens", "temperature", "thinking", "protocol_error_reward",
                  "max_recoverable_errors", "capacity_wait_seconds", "reset_plan_sha256")
POLICY_KEYS = ("served_model_id", "base_model_sha256", "inference_config_sha256", "implementation")


class EnvironmentEvalError(CollectionError):
    """A typed failure of the environment evaluation (stage `environment_evaluation`)."""

    stage = "environment_evaluation"


class EnvironmentEvalCancelled(Exception):
    """`should_stop()` said stop: the collection in flight was cancelled and nothing was published."""


def identity_error(message: str, hint: str = "the environment was redeployed or reconfigured between the baseline "
                                             "and the candidate; run the evaluation again") -> EnvironmentEvalError:
    return EnvironmentEvalError("environment_eval_identity_changed", message, failure_code="environment_identity_changed",
                                hint=hint)


def policy_error(message: str) -> EnvironmentEvalError:
    return EnvironmentEvalError("environment_eval_policy_changed", message, failure_code="training_evidence_invalid",
                                hint="the served model or an adapter changed under the evaluation; both sides must "
                                     "run on one base model with the named adapters")


def invalid_eval(message: str, hint: str | None = None) -> EnvironmentEvalError:
    return EnvironmentEvalError("environment_eval_invalid", message, failure_code="persisted_contract_invalid",
                                hint=hint)

# --- the plan ----------------------------------------------------------------------------------

def seed_interval_overlaps(train: tuple[int, int], evaluation: tuple[int, int]) -> bool:
    """Whether [start, start + count) of training and of the evaluation share a seed; each is (start, count)."""
    (a, n), (b, m) = train, evaluation
    if n <= 0 or m <= 0:
        return False
    return a < b + m and b < a + n


@dataclass(frozen=True)
class EvalPolicy:
    """One side's policy: an adapter name (None: the base model) and, optionally, the content revision
    (`sha256:...`) the served adapter must carry in its rollout provenance."""

    adapter: str | None
    content_sha256: str | None = None


@dataclass(frozen=True)
class EvalPlan:
    """The normalized `environment_eval` config, with the training interval it must stay clear of."""

    groups: int
    group_size: int
    seed_start: int
    gate: GateThresholds | None
    train_seed_start: int
    train_groups: int

    @classmethod
    def of(cls, value: Mapping, *, train_seed_start: int, train_groups: int) -> EvalPlan:
        """`value` is the run request's `environment_eval` ({groups [20], group_size [1], seed_start?, gate?})."""
        if not isinstance(value, Mapping):
            raise invalid_eval("environment_eval must be an object")
        extra = sorted(set(value) - {"groups", "group_size", "seed_start", "gate"})
        if extra:
            raise invalid_eval(f"environment_eval.{extra[0]}: unknown field")

        def integer(name, default, low, high):
            got = value.get(name, default)
            if got is None:
                got = default
            if isinstance(got, bool) or not isinstance(got, int) or not low <= got <= high:
                raise invalid_eval(f"environment_eval.{name} must be an integer in {low}..{high}, not {got!r}")
            return got

        groups = integer("groups", 20, 1, 16_384)
        group_size = integer("group_size", 1, 1, 256)
        start = integer("seed_start", train_seed_start + train_groups, 0, I64_MAX)
        if start + groups - 1 > I64_MAX:
            raise invalid_eval(f"the last eval seed exceeds {I64_MAX}")
        if seed_interval_overlaps((train_seed_start, train_groups), (start, groups)):
            raise invalid_eval(f"the eval seeds [{start}, {start + groups}) overlap the training seeds "
                           f"[{train_seed_start}, {train_seed_start + train_groups})",
                           hint="held-out evaluation needs seeds training never saw; move environment_eval.seed_start")
        gate = None
        if value.get("gate") is not None:
            if not isinstance(value["gate"], Mapping) or set(value["gate"]) - {"min_mean_return", "min_mean_improvement"}:
                raise invalid_eval("environment_eval.gate takes only min_mean_return and min_mean_improvement")
            gate = GateThresholds.of(value["gate"])
            for name in ("min_mean_return", "min_mean_improvement"):
                number = getattr(gate, name)
                if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)):
                    raise invalid_eval(f"environment_eval.gate.{name} must be a number")
            if gate.min_mean_improvement < 0:
                raise invalid_eval("environment_eval.gate.min_mean_improvement must be at least 0")
            if groups < MIN_PAIRED_GROUPS:
                raise invalid_eval(f"a gate needs at least {MIN_PAIRED_GROUPS} eval groups, not {groups}")
        return cls(groups, group_size, start, gate, train_seed_start, train_groups)

    def to_json(self) -> dict:
        """For the receipt: seeds as decimal strings."""
        out = {"groups": self.groups, "group_size": self.group_size, "seed_start": str(self.seed_start)}
        if self.gate is not None:
            gate = {"min_mean_improvement": float(self.gate.min_mean_improvement)}
            if self.gate.min_mean_return is not None:
                gate["min_mean_return"] = float(self.gate.min_mean_return)
            out["gate"] = gate
        return out


def side_config(base: CollectionConfig, plan: EvalPlan, policy: EvalPolicy, directory: Path) -> CollectionConfig:
    """The collection of one side: the base plan and bounds, the eval interval and sizes, this side's adapter."""
    directory = Path(directory)
    # an eval side is no training corpus: a train run's sealed contract (and its selection) stays out of it
    extra = {"training_contract": None} if hasattr(base, "training_contract") else {}
    return replace(base, **extra, adapter=policy.adapter or "base", groups=plan.groups, group_size=plan.group_size,
                   seed_start=plan.seed_start, concurrency=max(1, min(base.concurrency, plan.group_size)),
                   output_path=directory / FILES["dataset"], replay_output_path=directory / FILES["replay"],
                   summary_output_path=directory / FILES["summary"],
                   retained_bytes_limit=max(1, base.retained_bytes_limit // 2)).check()


# --- the result --------------------------------------------------------------------------------

def _plain_digest(value) -> str:
    """sha256 of compact key-sorted JSON (reset payloads carry seeds that may exceed 2^53)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def execution_of(summary: dict, replay: dict) -> dict:
    """What one side executed, without who executed it: the environments, bounds and the group plan."""
    groups = [{"group_index": g["group_index"], "environment_index": g["environment_index"], "seed": str(g["seed"]),
               "reset_sha256": _plain_digest(g["reset_payload"]),
               "candidate_indices": [c["candidate_index"] for c in g["candidates"]]} for g in replay["groups"]]
    return {"schema": EXECUTION_SCHEMA, "client_profile": replay.get("client_profile"),
            "environments": [e["identity"] for e in summary["environments"]],
            "environment_schemas_sha256": _plain_digest([e.get("schema") for e in summary["environments"]]),
            "seed_start": str(summary["seed_start"]), **{k: summary.get(k) for k in EXECUTION_KEYS},
            "generation_seeds": "openenv.client.actions.generation_seed(seed, candidate_index, step_index)",
            "group_plan_sha256": _plain_digest(groups)}


@dataclass
class SideResult:
    side: str
    policy: EvalPolicy
    config: CollectionConfig
    bundle: Bundle

    @property
    def summary(self) -> dict:
        return self.bundle.summary_value

    @cached_property
    def replay(self) -> dict:
        return json.loads(self.bundle.replay)

    @property
    def summary_sha256(self) -> str:
        return sha256_digest(self.bundle.summary)

    @property
    def behavior_policy(self) -> dict | None:
        return self.summary.get("behavior_policy")

    def execution(self) -> dict:
        return self._execution

    @cached_property
    def _execution(self) -> dict:
        return execution_of(self.summary, self.replay)

    def identity(self) -> dict:
        """The receipt's (and the status's) view of this side."""
        return dict(self._identity)

    @cached_property
    def _identity(self) -> dict:
        behavior = self.behavior_policy
        adapter = (behavior or {}).get("adapter")
        return {"adapter": self.policy.adapter,
                "adapter_content_revision": adapter.get("content_sha256") if isinstance(adapter, dict)
                else self.policy.content_sha256,
                "behavior_policy": behavior,
                "execution_provenance_sha256": json_digest(self.execution()),
                "summary_sha256": self.summary_sha256, "dataset_sha256": self.summary["dataset_sha256"],
                "replay_sha256": self.summary["replay_sha256"], "stats": self.summary["stats"]}

    def artifacts(self, out_dir: Path) -> list[dict]:
        out = []
        for what, data, path in zip(FILES, (self.bundle.dataset, self.bundle.replay, self.bundle.summary),
                                    self.bundle.paths, strict=True):
            out.append({"kind": f"environment_eval_{self.side}_{what}", "file": f"{self.side}/{FILES[what]}",
                        "path": str(path), "sha256": sha256_digest(data), "bytes": len(data)})
        return out


@dataclass
class EnvironmentEvalResult:
    plan: EvalPlan
    out_dir: Path
    baseline: SideResult
    candidate: SideResult
    gate: EnvironmentGateResult
    execution: dict
    artifacts: list[dict] = field(default_factory=list)

    @property
    def decision(self) -> str:
        return self.gate.decision

    def status(self, *, outcome: str | None = None) -> dict:
        """The run status's `environment_evaluation` block once completed (§1.6)."""
        rollouts = self.plan.groups * self.plan.group_size
        out = {"state": "completed", "seed_start": self.plan.seed_start, "groups": self.plan.groups,
               "group_size": self.plan.group_size,
               "baseline": {k: self.baseline.identity()[k] for k in ("adapter", "adapter_content_revision",
                                                                      "execution_provenance_sha256")},
               "candidate": {k: self.candidate.identity()[k] for k in ("adapter", "adapter_content_revision",
                                                                        "execution_provenance_sha256")},
               "progress": {"side": "candidate", "groups_completed": self.plan.groups, "groups_total": self.plan.groups,
                            "rollouts_completed": rollouts, "rollouts_total": rollouts},
               "baseline_stats": self.baseline.summary["stats"], "candidate_stats": self.candidate.summary["stats"],
               "evidence": self.gate.evidence, "verdict": self.verdict(outcome)}
        if outcome is not None:
            out["outcome"] = outcome
        return out

    def verdict(self, outcome: str | None = None) -> str:
        e = self.gate.evidence
        text = (f"{e['decision']}: baseline mean return {e['baseline_mean_return']:.6g}, candidate "
                f"{e['candidate_mean_return']:.6g} over {e['paired_groups']} seed groups; {self.gate.reason}")
        return text + (f". Outcome: {outcome}" if outcome else "")

    def receipt(self, *, run_id: str, outcome: str, promotion: dict | None = None) -> dict:
        """The `kiln.openenv-environment-evaluation.v1` body (canonical-JSON safe)."""
        if not outcome_consistent(self.gate.decision, outcome):
            raise ValueError(f"outcome {outcome!r} is not consistent with the gate decision {self.gate.decision!r}")
        return {"schema": RECEIPT_SCHEMA, "run_id": str(run_id), "config": self.plan.to_json(),
                "seed_start": str(self.plan.seed_start),
                "train_seed_interval": {"seed_start": str(self.plan.train_seed_start),
                                        "groups": self.plan.train_groups},
                "baseline": self.baseline.identity(), "candidate": self.candidate.identity(),
                "execution": self.execution,
                "baseline_summary_sha256": self.baseline.summary_sha256,
                "candidate_summary_sha256": self.candidate.summary_sha256,
                "artifacts": [{k: a[k] for k in ("kind", "file", "sha256", "bytes")} for a in self.artifacts],
                "evidence": self.gate.evidence, "outcome": outcome, "verdict": self.verdict(outcome),
                "promotion": promotion}


def receipt_bytes(body: dict) -> bytes:
    return canonical_json(body)


def receipt_digest(body: dict) -> str:
    return json_digest(body)


def publish_receipt(result: EnvironmentEvalResult, body: dict) -> dict:
    """Write the receipt's canonical bytes to `out_dir/receipt.json`; its manifest entry."""
    data = receipt_bytes(body)
    path = Path(result.out_dir) / RECEIPT_FILE
    try:
        publish_together([(path, data)])
    except ArtifactError as exc:
        raise EnvironmentEvalError("openenv_publication_failed", str(exc), failure_code="artifact_publication_failed") \
            from None
    return {"kind": "environment_eval_receipt", "file": RECEIPT_FILE, "path": str(path.resolve()),
            "sha256": sha256_digest(data), "bytes": len(data)}
